/* What the worker's own files share (nw_worker.c and nw_adopt.c), and
 * nothing else includes: the epoll data that says which source an event is
 * for, and the few helpers of nw_worker.c that adoption needs. Each is
 * described where it is defined. */
#ifndef NW_WORKER_INTERNAL_H
#define NW_WORKER_INTERNAL_H

#include "nw_worker.h"

#define SIGNAL_EVENT      63    /* epoll data for the signalfd (listeners are 0..62) */
#define SERVE_QUEUE_EVENT 64    /* epoll data for the serve queue */
#define ADOPT_QUEUE_EVENT 65    /* epoll data for the adopt queue */
#define PARKED_EVENT      66    /* epoll data for parked slot i: PARKED_EVENT + i */
#define EVENTS_MAX (PARKED_EVENT + NW_MAX_PARKED)

nw_wconn *nw_wconn_new(nw_worker *w, int index, int fd,
                       const struct sockaddr_storage *peer, socklen_t plen);
void nw_worker_drop_owner(nw_worker *w, nw_wconn *wc);
int nw_worker_within_share(nw_worker *w, nw_msec now);
int nw_worker_hand_off(nw_worker *w, nw_wconn *wc, int wait_ms);
void nw_worker_let_go(nw_worker *w, nw_wconn *wc);     /* hand off patiently or close; freed */
void nw_worker_refused(nw_worker *w, int err, int asked); /* a hand-off refused: counted, said */
int nw_worker_park(nw_worker *w, nw_wconn *wc);

#endif
