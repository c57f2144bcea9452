/* The handoff queue (workers -> manager, HANDOFF frames, shared by all
 * workers): a connection this worker gives the manager, which serves its
 * next request through the serve queue, finishes a response's rest, or
 * closes it. A refused hand-off is counted and said in the log. Part of
 * the worker (nw_worker.c), its only caller; the park watcher passes on
 * through it too, with the worker's lock. */
#ifndef NW_HANDOFF_H
#define NW_HANDOFF_H

#include "nw_scoreboard.h"
#include "nw_wconn.h"

typedef struct {
    int queue;                  /* the worker's copy of the queue; -1 without a manager */
    int epfd;                   /* the worker's epoll, which a connection leaves first */
    nw_score_counts *counts;    /* refused hand-offs are counted here, or NULL */
} nw_handoff;

/* Give connections to queue_fd (a copy of it is kept; -1: no manager). */
void nw_handoff_init(nw_handoff *h, int queue_fd, int epfd);
void nw_handoff_count_in(nw_handoff *h, nw_score_counts *counts);
void nw_handoff_close(nw_handoff *h);

/* Hand a connection to the manager, waiting up to wait_ms for room in the
 * queue. Returns 0, or -1 with errno (still ours). */
int nw_handoff_give(nw_handoff *h, nw_wconn *wc, int wait_ms);

/* A hand-off to the manager that did not happen, so that its connection
 * is closed here: counted (narwhal_refused_total{reason="handoff"}) and
 * said in the log (the first in NW_LOG_LIMIT_MS, then a count). asked:
 * the caller answers 503 (a request waits on it), else it closes an idle
 * one. err: why the hand-off failed. */
void nw_handoff_refused(nw_handoff *h, int err, int asked);

/* A connection this worker lets go of for good (a leaving worker's
 * waiting request or new client): to the manager, waiting
 * NW_HANDOFF_PATIENCE_MS for room, or, when it cannot take it, answered
 * 503 and closed gently (nw_handoff_refused); freed either way. */
void nw_handoff_let_go(nw_handoff *h, nw_wconn *wc);

/* A response whose rest could not be written yet (output offload,
 * DESIGN.md) goes to the manager with it, which then keeps the connection
 * for its next request (keep_alive) or closes it. 1: handed off. 0: the
 * manager did not take it, and the rest was written here, waiting (or
 * failed: broken). */
int nw_handoff_rest(nw_handoff *h, nw_wconn *wc, int keep_alive);

#endif
