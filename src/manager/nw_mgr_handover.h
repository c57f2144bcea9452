/* The connection manager's hand-off to the workers: a connection whose
 * head is complete goes on the serve queue (a SERVE frame with its fd),
 * where the next free worker takes it; while the queue is full, or the
 * kernel refuses for a while, it waits in the manager's own queue (the
 * table's QUEUED list), oldest first. A connection that can be neither
 * passed on nor kept is refused: answered 503 when it asked something,
 * closed, counted and said in the log (DESIGN.md, "The connection
 * manager"). */
#ifndef NW_MGR_HANDOVER_H
#define NW_MGR_HANDOVER_H

#include "nw_frame.h"
#include "nw_log.h"
#include "nw_mgr_clock.h"
#include "nw_mgr_table.h"
#include "nw_status.h"

typedef struct {
    nw_mgr_table *table;
    const nw_mgr_clock *clock;
    int     ep;
    int     serve_queue;    /* SERVE frames, taken by whichever worker is free */
    int     watched;        /* waiting for room on it (EPOLLOUT, edge-triggered) */
    nw_msec retry_at;       /* it refused for a while: try again then (0: no retry due;
                             * room is then waited for with EPOLLOUT alone) */
    volatile int64_t *serve_queued;     /* the board's count of SERVE frames on it, or NULL */
    uint64_t handed_off;                /* SERVE frames sent, total */
    uint64_t queue_full;                /* times it had no room, total */
    uint64_t refused[NW_REFUSED_REASONS];       /* closed unserved, by reason, total */
    nw_log_limit refused_said[NW_REFUSED_REASONS];
    nw_log_limit waits_said;            /* "the serve queue refused ...: it waits" lines */
} nw_mgr_handover;

/* Sets the serve queue's send buffer to room for the largest frame. */
void nw_mgr_handover_init(nw_mgr_handover *h, nw_mgr_table *t, const nw_mgr_clock *clock,
                          int ep, int serve_queue, volatile int64_t *serve_queued);

/* fd (detached, its record's ready_ms set) has a complete head in data:
 * on the serve queue now, or to the back of the manager's queue until
 * there is room (data is kept in its record then); refused when neither
 * can be. */
void nw_mgr_handover_queue_up(nw_mgr_handover *h, int fd, const char *data, size_t len);

/* Room on the serve queue (or a retry due): send queued connections,
 * oldest first. */
void nw_mgr_handover_drain(nw_mgr_handover *h);
/* A refusal to wait out is tried again when its time comes, if no
 * worker's take came first. */
void nw_mgr_handover_retry(nw_mgr_handover *h);
/* Connections left the manager's queue other than through the serve
 * queue: stop waiting for room once it is empty. */
void nw_mgr_handover_queue_shrank(nw_mgr_handover *h);
/* Whether fd is the serve queue (its EPOLLOUT: room). */
static inline int nw_mgr_handover_is_queue(const nw_mgr_handover *h, int fd)
{
    return fd == h->serve_queue;
}
/* next, or the time of a retry due sooner. */
nw_msec nw_mgr_handover_next(const nw_mgr_handover *h, nw_msec next);

/* A connection the manager can neither pass on nor keep (detached, or
 * never held): answered 503 when asked, closed with its record, counted
 * in narwhal_refused_total{reason}, said in the log (the first in
 * NW_LOG_LIMIT_MS, then a count). err: the errno that refused it, or 0. */
void nw_mgr_handover_refuse(nw_mgr_handover *h, int fd, int reason, int asked, int err);
/* A zeroed record for a connection that came in frame f, with its
 * listener, requests and PROXY flag; NULL when there is no memory for
 * one (fd refused then). */
nw_mgr_slot *nw_mgr_handover_adopt(nw_mgr_handover *h, int fd, const nw_frame *f);

/* The manager's own answers (408, 503, with Date; 503 with Retry-After),
 * sent just before it closes fd: best effort and never blocking. */
void nw_mgr_answer(int fd, int status);

/* Add its counts to a STATS record; its refusals by reason. */
void nw_mgr_handover_count(const nw_mgr_handover *h, nw_manager_stats *st);
void nw_mgr_handover_refused(const nw_mgr_handover *h, uint64_t *refused);
/* Say what its log limiters held back. */
void nw_mgr_handover_flush_said(nw_mgr_handover *h);
void nw_mgr_handover_close(nw_mgr_handover *h);

#endif
