/* Custody's wait list (DESIGN.md, "Custody of parked connections"): a
 * parked connection's copy goes to the manager NW_CUSTODY_DELAY_MS after
 * its first park here, so that a client that closes its connection sooner
 * costs nothing. The worker's parking adds connections; the copies of all
 * that wait go together once the first is due (a waiting worker wakes
 * for it: the due time is registered in the worker's deadline list). Part
 * of the worker (nw_worker.c), its only caller; main thread only. */
#ifndef NW_CUSTODY_WAIT_H
#define NW_CUSTODY_WAIT_H

#include "nw_deadlines.h"
#include "nw_limits.h"
#include "nw_wconn.h"

typedef struct nw_custody_wait {
    nw_wconn *conn[NW_CUSTODY_WAIT_MAX];    /* parked, their copies not sent yet */
    int count;
    int queue;              /* where the copies go (the handoff queue); -1: custody off */
    int pid;                /* this worker's process, which the copies name; 0: not yet */
    nw_deadlines *deadlines;    /* the worker's: the copies are due at its
                                 * NW_DEADLINE_CUSTODY */
} nw_custody_wait;

/* An empty list whose copies go to queue (-1: none ever do), with its due
 * time registered in deadlines. */
void nw_custody_wait_init(nw_custody_wait *cw, int queue, nw_deadlines *deadlines);

/* A connection parked at now: its copy is sent with the others when they
 * are due (once per connection: not again once the manager has one; with a
 * full list, the waiting copies go at once). */
void nw_custody_wait_add(nw_custody_wait *cw, nw_wconn *wc, nw_msec now);

/* The waiting copies go to the manager now. */
void nw_custody_wait_flush(nw_custody_wait *cw);

/* wc's copy is not to be sent (it leaves the parked set, or the app took
 * its socket). */
void nw_custody_wait_forget(nw_custody_wait *cw, nw_wconn *wc);

/* None of the copies are wanted any more: the parked set is let go. */
void nw_custody_wait_drop(nw_custody_wait *cw);

#endif
