/* Parking (docs/DESIGN.md, "Parking"): a keep-alive connection waits for
 * its next request in the worker's own epoll (the parked set, nw_park.h)
 * rather than going to the manager, for up to --keepalive-wait; readable
 * ones take turns with new work, and one whose time is up goes to the
 * manager. This part owns the parked set and decides what may park; what
 * that does to the rest of the worker (the owner held, custody's copy)
 * is done through the pieces it is given; expired ones go to the handoff
 * queue (nw_handoff.h). Part of the worker
 * (nw_worker.c), its only caller (adoption and the park watcher work on
 * the set through it too). */
#ifndef NW_PARKING_H
#define NW_PARKING_H

#include <stdint.h>
#include "nw_custody_wait.h"
#include "nw_handoff.h"
#include "nw_io.h"
#include "nw_park.h"
#include "nw_pool_place.h"
#include "nw_wconn.h"

/* The worker's pieces parking works with. */
typedef struct {
    const nw_worker_owner_ops *owner;   /* the caller's hold on a parked connection's
                                         * object, and its drop */
    nw_handoff *handoff;        /* where expired ones go */
    nw_custody_wait *custody;   /* a parked connection's copy for the manager */
    nw_pool_place *place;       /* whether its requests block (then none is parked) */
} nw_parking_shared;

typedef struct {
    nw_parking_shared with;
    nw_park set;                /* items: nw_wconn * */
    nw_msec keep_ms;            /* how long a connection may stay parked (--keepalive-wait);
                                 * 0: parking is off */
    nw_msec idle_ms;            /* --keepalive-timeout: while the server closes, a parked
                                 * one stays here until then, and is closed */
    nw_msec paused_until;       /* parking paused: the app is often slow */
    nw_msec slow_at;            /* the last slow request's end (0: none yet) */
} nw_parking;

/* An empty set in epoll epfd (slot i's data: event_base + i), keeping
 * connections keep_ms, then handing them off; while the server closes,
 * idle_ms (at least keep_ms), then closing them. */
void nw_parking_init(nw_parking *p, const nw_parking_shared *with, int epfd,
                     uint32_t event_base, nw_msec keep_ms, nw_msec idle_ms);

/* When the next parked connection is due (nw_parking_expire); 0: none. */
nw_msec nw_parking_next(const nw_parking *p);

/* Park a connection. Returns 0, or -1 when it should be handed off
 * instead (parking paused or full, or bytes of its next request read
 * already). */
int nw_parking_add(nw_parking *p, nw_wconn *wc);

/* A readable parked connection, or NULL. */
nw_wconn *nw_parking_take_ready(nw_parking *p);

/* Any parked connection (out of epoll), or NULL: the set is let go. */
nw_wconn *nw_parking_take_any(nw_parking *p);

/* Hand the parked connections whose time is up by now (all, with
 * everything) to the manager. */
void nw_parking_expire(nw_parking *p, nw_msec now, int everything);

/* The server stops: close every parked connection without resetting any. */
void nw_parking_close_all(nw_parking *p);

#endif
