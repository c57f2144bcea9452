/* The connection manager's TLS part (docs/DESIGN.md, "HTTPS"), the
 * relayed way: it owns the TLS listeners, every TLS connection from
 * accept to close, and the context (nw_tls.h). A connection's handshake
 * has --read-timeout to finish; plain HTTP gets nw_tls_plain_400 and a
 * close; a failed handshake is closed and counted by reason. Once shaken
 * hands, the part makes a socketpair, keeps the TCP socket and one end,
 * and copies plaintext between them (nw_tls_relay); the other end goes
 * to the manager's ordinary path (nw_mgr_heads_accepted) as a new
 * connection of the TLS listener's index, its stream beginning with a
 * PROXY v2 header that names the client's address and the listener's
 * (the workers learn REMOTE_ADDR and SERVER_PORT from it, as with
 * --proxy-protocol, and https from the listener index). Under
 * --proxy-protocol those are the addresses of the balancer's header,
 * read before the handshake.
 *
 * It runs in the manager's thread, with an epoll set of its own (its
 * descriptor is in the manager's set): its connections' events never
 * reach the manager's table of descriptors. */
#ifndef NW_MGR_TLS_H
#define NW_MGR_TLS_H

#include <stddef.h>
#include <stdint.h>
#include "nw_limits.h"
#include "nw_log.h"
#include "nw_mgr_clock.h"
#include "nw_mgr_heads.h"
#include "nw_mgr_table.h"
#include "nw_proxy.h"
#include "nw_scoreboard.h"
#include "nw_status.h"
#include "nw_tls.h"
#include "nw_tls_pool.h"

struct nw_mgr_tls_conn;

/* What an event of the part's epoll set is about. */
typedef struct {
    int kind;                       /* NW_MGR_TLS_LISTENER, _TCP, _PAIR */
    int index;                      /* a listener's index in the part */
    struct nw_mgr_tls_conn *conn;   /* a connection's */
} nw_mgr_tls_ref;

/* A list of connections, oldest first. */
typedef struct {
    struct nw_mgr_tls_conn *head, *tail;
    size_t n;
} nw_mgr_tls_list;

typedef struct {
    struct nw_tls_ctx *ctx;
    nw_mgr_heads *heads;            /* where a shaken-hands connection's plain end goes */
    nw_mgr_table *table;            /* --max-connections: each TLS connection counts there */
    const nw_mgr_clock *clock;
    int     ep;                     /* its own epoll set (-1: no TLS listener) */
    int     fds[NW_MAX_LISTENERS];  /* the TLS listeners */
    int     index[NW_MAX_LISTENERS];/* ...their indices among the app's listeners */
    nw_mgr_tls_ref lref[NW_MAX_LISTENERS];
    int     n;
    int     accepting;              /* the listeners are in its set */
    nw_msec paused_until;           /* out of descriptors: accepting again then */
    nw_msec handshake_ms;           /* a handshake's deadline (--read-timeout) */
    nw_msec next_rotation;          /* the next ticket key */
    nw_mgr_tls_list shaking;        /* handshakes, by deadline */
    nw_mgr_tls_list relaying;       /* established, no deadline */
    nw_mgr_tls_list closing;        /* lingering for the client's close, by deadline */
    nw_mgr_tls_list late;           /* past their deadline while a thread ran their step:
                                     * refused when it is back */
    struct nw_tls_pool *pool;       /* the handshake threads */
    nw_mgr_tls_ref pool_ref;
    struct nw_mgr_tls_conn *dead;   /* closed in this batch of events: freed after it */
    uint64_t refused[NW_TLS_R_COUNT];   /* connections refused or failed, by reason */
    uint64_t established;           /* handshakes done, total */
    uint64_t resumed;               /* ...of them resumed sessions */
    nw_log_limit refused_said;      /* the rate-limited refusal lines */
    nw_log_limit fd_limit_said;
    nw_log_limit full_said;         /* --max-connections reached: TLS clients wait */
    int     proxy;                  /* --proxy-protocol: a PROXY header before each hello */
    const nw_proxy_cidr *proxy_from;/* --proxy-from: the peers that may send one (0: any) */
    size_t  proxy_from_n;
    uint64_t proxy_rejected[NW_PROXY_REJECTS]; /* refused for their header or their peer */
    nw_log_limit proxy_said[NW_PROXY_REJECTS]; /* a line for the first of each reason */
    const char *cert, *key;         /* the files, read again on a reload */
} nw_mgr_tls;

/* The context from cert and key, and the listeners fds[0..n) (indices
 * index[0..n) among the app's). 0, or -1 with a one-line reason in err
 * (nw_tls_ctx_new's for the files). With n == 0, nothing (the part is off).
 * threads: the handshake threads (nw_tls_pool). */
int nw_mgr_tls_init(nw_mgr_tls *t, nw_mgr_heads *heads, nw_mgr_table *table,
                    const nw_mgr_clock *clock,
                    const char *cert, const char *key, const int *fds, const int *index,
                    int n, double read_timeout, int threads, char *err, size_t errlen);

/* --proxy-protocol: each connection begins with a PROXY header (v1 or
 * v2), read before the handshake from a peer in from[0..n) (none: any;
 * the array stays the caller's); its addresses become the connection's.
 * A bad header, or another peer: closed, counted, said rate-limited. */
void nw_mgr_tls_proxy(nw_mgr_tls *t, const nw_proxy_cidr *from, size_t n);

/* Its epoll set's descriptor, for the manager's set (-1: off). */
int nw_mgr_tls_fd(const nw_mgr_tls *t);
/* Its set is ready: take up to a batch of its events, waiting up to
 * wait_ms for them (0: not at all). */
void nw_mgr_tls_run(nw_mgr_tls *t, int wait_ms);
/* Close the handshakes past their deadline and the closes lingering past
 * theirs; rotate the ticket key when due; accept again after a pause. */
void nw_mgr_tls_expire(nw_mgr_tls *t);
/* next, or its earliest deadline if sooner. */
nw_msec nw_mgr_tls_next(const nw_mgr_tls *t, nw_msec next);
/* No new connection from now on (the server stops). */
void nw_mgr_tls_stop_accepting(nw_mgr_tls *t);
/* The connections it has open. */
size_t nw_mgr_tls_open(const nw_mgr_tls *t);
/* Its refusals by reason, for the status pages (nothing when off). */
void nw_mgr_tls_numbers(const nw_mgr_tls *t, nw_status_manager *sm);
/* Read the certificate pair again (HUP): new connections use it. */
void nw_mgr_tls_reload(nw_mgr_tls *t);
/* Close every connection and the set; the listeners stay the caller's. */
void nw_mgr_tls_close(nw_mgr_tls *t);

#endif
