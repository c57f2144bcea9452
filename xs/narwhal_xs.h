/* What the Perl-aware C files share (the files in xs/, and Narwhal.xs): the C side of
 * a Narwhal::Conn object and the $env code's entry points. Perl-aware C
 * lives here, by role; the Perl-free core is in src/. */
#ifndef NARWHAL_XS_H
#define NARWHAL_XS_H

#define PERL_NO_GET_CONTEXT
#include "EXTERN.h"
#include "perl.h"

#include "src/nw_conn.h"
#include "src/nw_worker.h"

typedef struct env_recycler env_recycler;

/* A Narwhal::Conn: the worker's connection and what Perl needs of it. */
typedef struct {
    nw_wconn *wc;
    nw_conn *c;         /* wc->c, for short */
    env_recycler *env;  /* its listener's $env template and spare */
    SV *remote_addr;
    SV *remote_port;
    SV *io;             /* psgix.io, made the first time an app looks */
} nw_xs_conn;

/* ---- xs/env.c: the PSGI $env ---------------------------------------- */

/* Called once at load (BOOT): key hashes, stashes. */
void nw_env_boot(pTHX);

/* A listener's $env template and spare; io_maker is the code that makes
 * psgix.io's handle from a Narwhal::Conn (called on first use). */
env_recycler *nw_env_recycler_new(pTHX_ HV *template, SV *io_maker);
void nw_env_recycler_ref(env_recycler *r);
void nw_env_recycler_unref(pTHX_ env_recycler *r);

/* REMOTE_ADDR and REMOTE_PORT of a connection, from its peer address. */
void nw_env_peer(pTHX_ nw_xs_conn *xc, const struct sockaddr_storage *ss, unsigned len);

/* The request just parsed on xc as a $env (self_rv: the Narwhal::Conn). */
HV *nw_env_build(pTHX_ nw_xs_conn *xc, SV *self_rv);

/* Content-Length/psgi.input for the body that was read. */
void nw_env_body(pTHX_ HV *env, nw_conn *c);

/* The end of a request: clean env for reuse when nothing else holds it. */
void nw_env_recycle(pTHX_ env_recycler *r, HV *env);

/* Whether the worker must look at env after the app (cleanup handlers,
 * psgix.harakiri.commit). */
int nw_env_needs_after(pTHX_ SV *env_rv);

/* ---- xs/config.c: the worker's configuration ------------------------- */

typedef struct {
    nw_conn_config conn;
    double keepalive_wait;
} nw_worker_config;

/* The option names the configuration is filled from, in order
 * (Narwhal::Acceptor::config_fields), and the filling itself: a typed
 * struct from a list, never a hash read by string key. */
size_t nw_config_field_count(void);
const char *nw_config_field_name(size_t i);
void nw_config_from_av(pTHX_ AV *values, nw_worker_config *cfg);

/* Narwhal::Limits: the C limits the option table reads (BOOT). */
void nw_config_export_limits(pTHX);

/* ---- xs/response.c: PSGI responses into the C writer ---------------- */

/* Start a response head from the app's status and header array. Returns
 * the framing (>= 0), or NW_RESPONSE_INVALID. */
int nw_response_start(pTHX_ nw_conn *c, int status, SV *headers_rv,
                      int64_t known_length, int may_keep_alive);

/* A response whose body is an array: one writev. Returns 1 when the
 * connection may serve another request, 0 when not, NW_RESPONSE_INVALID
 * (nothing sent) when the status or headers are not valid. */
#define NW_RESPONSE_INVALID     (-31)
int nw_response_write_array(pTHX_ nw_conn *c, int status, SV *headers, AV *body,
                            int may_keep_alive);

/* The common case [status, headers, [pieces]] of plain arrays, or
 * NW_RESPONSE_OTHER_SHAPE having done nothing. */
#define NW_RESPONSE_OTHER_SHAPE (-32)
int nw_response_write_common(pTHX_ nw_conn *c, SV *res, int may_keep_alive);

/* An interim (1xx) response. Returns 1 when sent. */
int nw_response_informational(pTHX_ nw_conn *c, int status, SV *headers);

#endif
