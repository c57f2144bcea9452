/* One connection inside a worker (nw_worker.h): the C side of what the
 * caller serves, which the worker's parts (parking, custody, adoption,
 * the park watcher) pass between them; and its requests' start and end,
 * and which one is running. The worker (nw_worker.c) makes them. */
#ifndef NW_WCONN_H
#define NW_WCONN_H

#include <stdint.h>
#include <sys/socket.h>
#include "nw_conn.h"
#include "nw_park.h"

struct nw_custody_wait;
struct nw_pool_place;

/* How the worker keeps the caller's object of a parked connection alive.
 * Both run on the main thread. */
typedef struct {
    void (*hold)(void *owner);
    void (*drop)(void *owner);
} nw_worker_owner_ops;

/* One connection inside a worker: the C side of what the caller serves. */
typedef struct nw_wconn {
    nw_conn *c;
    struct nw_custody_wait *custody;    /* its worker's custody wait list, and what */
    void (*custody_forget)(struct nw_custody_wait *, struct nw_wconn *); /* takes it off */
    struct nw_pool_place *place;    /* its worker's place in the pool (the block meter) */
    int custody_wait;               /* 1 + its place in its worker's custody wait list
                                     * (nw_custody_wait.h); 0: none */
    struct sockaddr_storage peer;   /* the client's address, from accept4 or getpeername */
    socklen_t peer_len;             /* 0 when unknown */
    nw_msec started;                /* the current request's head was complete then; 0 between requests */
    uint64_t started_us;            /* the same, in microseconds (its duration's start) */
    nw_msec ended;                  /* the last request ended then; 0 once parked */
    uint32_t ready_ms;              /* from the manager (SERVE): its head was complete then
                                     * (monotonic ms mod 2^32), valid while queued is set */
    int queued;                     /* its next request waited in the manager's queue */
    nw_park_watch watch;            /* its registration in the worker's epoll set */
    int peer_closed;                /* its peer's FIN was reported while parked */
    int socket_lent;                /* the app got a dup of the socket (psgix.io): it may
                                     * have read from it behind our back */
    void *owner;                    /* the caller's object for it (NULL: none yet) */
    void *owner_mem;                /* ... and the memory it owns (only ever prefetched) */
    int handed_off;                 /* the manager has it (with the rest of a response) */
} nw_wconn;

/* A request's head and body are in: note the time (an often slow app
 * pauses parking). */
void nw_wconn_request_started(nw_wconn *wc);

/* Its response is written: now_us is the caller's reading of nw_now_us
 * then, which parking it next uses rather than reading the clock again. */
void nw_wconn_request_ended(nw_wconn *wc, uint64_t now_us);

/* The connection whose request is running (from nw_wconn_request_started
 * until it is released or freed), or NULL. Async-signal-safe: the request
 * watchdog's handler asks for its nw_conn (nw_worker_signals.h). */
nw_wconn *nw_wconn_serving(void);

/* Its request is over for the worker (released): not the one running. */
void nw_wconn_not_serving(nw_wconn *wc);

/* Take a connection out of the worker's epoll (epfd) before it leaves the
 * worker: the registration is keyed by (file, fd) and the file lives on
 * in the manager, so a stale one would refuse the same connection if it
 * came back under the same fd number. */
void nw_wconn_unwatch(nw_wconn *wc, int epfd);

/* A connection let go: its owner dropped (which frees it), or, without
 * one, freed here. */
void nw_wconn_drop(nw_wconn *wc, const nw_worker_owner_ops *ops);

/* Close and free a connection (the caller's, or one it got from
 * nw_worker_next and did not keep). */
void nw_wconn_free(nw_wconn *wc);

#endif
