/* Adoption (docs/DESIGN.md, "Retirement: the other workers adopt the
 * parked connections"): a leaving worker's parked connections go to the
 * other workers through the adopt queue, a batch a frame, and they adopt
 * them. Part of the worker (nw_worker.c), which calls these from its loop
 * and as it leaves; the queue is set up by nw_worker_adopt_queue
 * (nw_worker.h), defined in nw_adopt.c. */
#ifndef NW_ADOPT_H
#define NW_ADOPT_H

#include "nw_worker.h"

/* A worker that has not taken a connection yet: a waiting batch, and the
 * ones behind it while it stays within its share (then it steps aside
 * from the rest). Returns 1 when it took one. */
int nw_adopt_when_new(nw_worker *w, nw_msec now);

/* A busy worker's look at the queue, and an idle one's (either steps
 * aside when it may not take the batch). Return 1 when they took one. */
int nw_adopt_when_busy(nw_worker *w, nw_msec now);
int nw_adopt_when_idle(nw_worker *w, nw_msec now);

/* Back in the adopt queue's wake-ups after stepping aside. */
void nw_adopt_step_back(nw_worker *w);

/* A leaving worker: the frames waiting in the queue go to its back again
 * (each wakes a worker), and the parked set goes to the other workers
 * (crashing: from the crash handler, async-signal-safe). */
void nw_adopt_pass_on(nw_worker *w, int patience_ms);
void nw_adopt_give_away(nw_worker *w, int crashing);

#endif
