/* What the Perl-aware C files share (the files in xs/, and Narwhal.xs): the C side of
 * a Narwhal::Conn object and the $env code's entry points. Perl-aware C
 * lives here, by role; the Perl-free core is in src/. */
#ifndef NARWHAL_XS_H
#define NARWHAL_XS_H

#define PERL_NO_GET_CONTEXT
#include "EXTERN.h"
#include "perl.h"

#include "src/worker/nw_accesslog.h"
#include "src/worker/nw_conn.h"
#include "src/shared/nw_scoreboard.h"
#include "src/worker/nw_worker.h"
#include "src/worker/nw_worker_signals.h"

typedef struct env_recycler env_recycler;

/* A Narwhal::Conn: the worker's connection and what Perl needs of it. */
typedef struct {
    nw_wconn *wc;
    nw_conn *c;         /* wc->c, for short */
    env_recycler *env;  /* its listener's $env template and spare */
    SV *remote_addr;
    SV *remote_port;
    SV *io;             /* psgix.io, made the first time an app looks */
    int turn;           /* requests served in a row since the worker took it */
    int crash_refused;  /* --crash-backoff: this request is answered 503, not by the app */
} nw_xs_conn;

/* Where a worker reports its requests: its scoreboard slot and its access
 * log. Its Narwhal::Acceptor's (count_in_scoreboard, the access_log_*
 * methods); NULL pointers: not reported there. */
typedef struct {
    nw_score_slot *slot;            /* this worker's slot, written on every request */
    nw_score_header *header;        /* the board's header: routes answered 503 */
    nw_scoreboard *board;           /* the whole board: the pool's parked counts, the
                                     * recycling turn */
    nw_access_log *access_log;
    int access_log_pid;             /* the process its lines name */
    int access_forwarded;           /* --access-log-client forwarded */
    nw_proxy_cidr *forwarded_from;  /* --forwarded-from */
    size_t forwarded_from_n;
} nw_xs_report;

/* What the request sequence (xs/serve.c) is given once by the worker
 * loop: its app, its object (for the uncommon parts) and the option
 * values. Whether the worker leaves, and what it served, are the C
 * worker's own (nw_worker_life, src/worker/nw_worker.h). */
typedef struct {
    SV *worker;         /* the Narwhal::Worker */
    SV *app;
    SV *conn;           /* the current connection (a Narwhal::Conn), or undef: the
                         * worker's own scalar (psgix.informational and the
                         * watchdog read it) */
    nw_worker_life *life;   /* the acceptor's worker's */
    const nw_xs_report *report; /* the acceptor's */
    IV limit;           /* requests before the worker leaves; 0: no limit */
    IV replace_at;      /* requests after which it asks for its replacement; 0: never */
    IV replace_ahead;   /* limit - replace_at as set up: a recycling worker's turn is waited
                         * for this many requests at a time */
    IV limit_step;      /* --max-reqs-per-child as drawn: what a young worker is given again */
    nw_msec min_lifetime_ms;    /* --min-worker-lifetime; 0: none */
    nw_msec asked_ms;   /* when it asked for its replacement (0: it has not) */
    nw_msec recycle_turn_ms;    /* a recycling turn held this long is free to take
                                 * (NW_RECYCLE_TURN_MAX_MS) */
    nw_msec born_ms;    /* when serve_setup was called */
    int keepalive, managed, quantum;
    double rss_limit_mb;
    double idle_wait;   /* the longest wait for a connection or a request, seconds */
    int wake_master_fd; /* a byte here wakes the master (a replacement wanted); -1: none */
} nw_serve_setup;

/* A worker's Narwhal::Acceptor: its scheduling, each listener's $env,
 * and what serve needs. */
typedef struct {
    nw_worker *w;
    env_recycler *env[NW_MAX_LISTENERS];
    int count;
    nw_serve_setup serve;   /* serve.app is NULL until serve_setup */
    nw_xs_report report;    /* its scoreboard slot and access log */
    SV *current_obj;        /* the object serve.conn referred to when last seen */
    nw_xs_conn *current;    /* and its connection */
    double wait;            /* for the current connection's next request */
} nw_xs_acceptor;

/* Every call into the worker (src/worker/nw_worker.c) runs inside WORKER_SCOPE
 * ... WORKER_SCOPE_END: the park watcher's lock is released when the
 * scope ends, also when Perl code run inside (a DESTROY, freeing a
 * connection) leaves it by die or exit. */
void nw_xs_worker_leave_on_unwind(pTHX_ void *w);
#define WORKER_SCOPE(w) ENTER; SAVEDESTRUCTOR_X(nw_xs_worker_leave_on_unwind, (w)); \
                        nw_worker_enter(w)
#define WORKER_SCOPE_END LEAVE

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

/* ---- xs/serve.c: one request, from its read to its connection's release */

/* Deliver the deferred signals that are pending and run Perl's handlers
 * now, so that the next statement sees what they set. Returns how many
 * kinds were pending. */
int nw_serve_deliver_signals(pTHX_ nw_xs_acceptor *a);

/* Called once at load (BOOT). */
void nw_serve_boot(pTHX);

/* Whether sv is a Narwhal::Conn (its stash compared first: the quick check). */
int nw_serve_is_conn(pTHX_ SV *sv);

/* Let go of what the report holds (the access log closed: its lines
 * written). */
void nw_serve_report_clear(nw_xs_report *r);

/* Read the next request on xc (self_rv: its Narwhal::Conn) into a new
 * $env, or NULL with *result the reason there is none (NW_REQ_AGAIN,
 * CLOSED, TIMEOUT, or ERROR once the error was answered). */
HV *nw_serve_read(pTHX_ const nw_xs_report *rep, nw_xs_conn *xc, SV *self_rv, double max_wait,
                  int wait_partial, int *result);

/* The end of a request: the scoreboard, the access log, and the $env
 * cleaned for reuse; with finish_conn, the connection is made ready for
 * the next request. */
void nw_serve_end(pTHX_ const nw_xs_report *rep, nw_xs_conn *xc, SV *env_rv, int finish_conn);

/* The access log's line for the request that ends on xc. */
void nw_serve_log_request(pTHX_ const nw_xs_report *rep, nw_xs_conn *xc, int parsed,
                          uint64_t now_us);

/* The Narwhal::Conn for a connection nw_worker_next gave (a new
 * reference): a parked one has its object (the worker's hold passes to
 * the caller), a new one gets one. */
SV *nw_serve_conn_object(pTHX_ nw_xs_acceptor *a, nw_wconn *wc);

/* One request of the current connection (serve.conn), read to release,
 * taking the next connection first when there is none ("One request in
 * C" in docs/DESIGN.md), with Perl called back only for what is not
 * common. */
#define NW_SERVE_ON      4     /* served, or the connection was let go: go on */
#define NW_SERVE_IDLE    5     /* no connection came within the wait */
#define NW_SERVE_LEAVING 6     /* no current connection, and the worker is stopping or
                                * at its request limit */
int nw_serve_next(pTHX_ nw_xs_acceptor *a);

/* nw_serve_next until it answers other than NW_SERVE_ON: NW_SERVE_IDLE or
 * NW_SERVE_LEAVING. */
int nw_serve_run(pTHX_ nw_xs_acceptor *a);

/* The setup's references, taken and let go. */
void nw_serve_setup_set(pTHX_ nw_serve_setup *s, const nw_serve_setup *from);
void nw_serve_setup_clear(pTHX_ nw_serve_setup *s);

/* ---- xs/config.c: the worker's configuration ------------------------- */

typedef struct {
    nw_conn_config conn;
    double keepalive_wait;
    double worker_slice;    /* seconds; 0: the kernel's default */
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

/* Whether body is a handle sendfile may send (a regular file, plain
 * layers, not tied): the GV, with its descriptor, offset and bytes left;
 * else NULL. */
GV *nw_response_file_source(pTHX_ SV *body, int *fd, off_t *offset, int64_t *left);

/* An interim (1xx) response. Returns 1 when sent. */
int nw_response_informational(pTHX_ nw_conn *c, int status, SV *headers);

#endif
