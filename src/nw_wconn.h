/* One connection inside a worker (nw_worker.h): the C side of what the
 * caller serves, which the worker's parts (parking, custody, adoption,
 * the park watcher) pass between them. */
#ifndef NW_WCONN_H
#define NW_WCONN_H

#include <stdint.h>
#include <sys/socket.h>
#include "nw_conn.h"
#include "nw_park.h"

struct nw_worker;

/* One connection inside a worker: the C side of what the caller serves. */
typedef struct {
    nw_conn *c;
    struct nw_worker *worker;       /* the worker it is in */
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

#endif
