/* The connection manager's listeners (DESIGN.md, "When every worker is
 * busy"): while every worker has been on its request for
 * NW_POOL_STUCK_MS, new connections are taken here, read, and queued with
 * the time their request arrived, instead of waiting unseen in the listen
 * queue; as soon as a worker is free again, the workers accept them
 * directly, as always. Also what a status page shows of the listeners. */
#ifndef NW_MGR_ACCEPT_H
#define NW_MGR_ACCEPT_H

#include "nw_limits.h"
#include "nw_log.h"
#include "nw_mgr_clock.h"
#include "nw_mgr_heads.h"
#include "nw_mgr_table.h"
#include "nw_scoreboard.h"
#include "nw_status.h"

typedef struct {
    nw_mgr_table *table;
    const nw_mgr_clock *clock;
    nw_mgr_heads *heads;            /* where a new connection goes */
    const nw_scoreboard *board;     /* whether the pool is stuck; NULL: never looked at */
    int     ep;
    int     listeners[NW_MAX_LISTENERS];    /* the app's */
    int     nlisteners;
    uint64_t left;                  /* bit i: listener i is another part's (TLS): never taken from */
    int     proxy_protocol;         /* --proxy-protocol: what it takes begins with a header */
    int     taking;                 /* the listeners are in epoll: the pool is stuck */
    nw_msec next_look;              /* when to look at the pool again */
    nw_log_limit fd_limit_said;     /* "cannot take a connection" lines */
    uint64_t accepted;              /* connections taken, total */
} nw_mgr_accept;

void nw_mgr_accept_init(nw_mgr_accept *a, nw_mgr_table *t, const nw_mgr_clock *clock,
                        nw_mgr_heads *heads, const nw_scoreboard *board, int ep,
                        const int *listeners, int nlisteners, int proxy_protocol);

/* The listeners of the bits of mask are another part's (the TLS
 * part's): never taken from here, only shown on a status page. */
void nw_mgr_accept_leave(nw_mgr_accept *a, uint64_t mask);

/* Look at the pool when it is time to, and take from the listeners while
 * it is stuck (never while stopping: the workers drain the queue then).
 * 1: it has just begun taking. */
int nw_mgr_accept_look(nw_mgr_accept *a, int stopping);
/* fd is a listener being taken from: take what waits on it. 0: fd is no
 * listener of its (or it is not taking). */
int nw_mgr_accept_event(nw_mgr_accept *a, int fd);
/* Whether it takes from the listeners now. */
int nw_mgr_accept_taking(const nw_mgr_accept *a);
/* next, or the next look at the pool if that is sooner. */
nw_msec nw_mgr_accept_next(const nw_mgr_accept *a, nw_msec next);

/* The listeners' addresses, accept queues and their limits, and whether
 * it takes from them, on a status page. */
void nw_mgr_accept_numbers(const nw_mgr_accept *a, nw_status_manager *sm);
void nw_mgr_accept_count(const nw_mgr_accept *a, nw_manager_stats *st);
void nw_mgr_accept_close(nw_mgr_accept *a);

#endif
