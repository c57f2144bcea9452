/* --max-queue-wait in the connection manager (DESIGN.md, "Shedding"): the
 * oldest requests on the serve queue (peeked at on the workers' end) and
 * in the manager's own queue that waited longer for a worker are answered
 * 503 and closed. And a lost wake-up: the oldest frame on the serve queue
 * that waited NW_SERVE_REPOST_MS while a worker is idle (the worker its
 * arrival woke could not take it: at its open-file limit) is taken back
 * and sent again, a new wake-up for another worker. */
#ifndef NW_MGR_SHED_H
#define NW_MGR_SHED_H

#include "nw_log.h"
#include "nw_mgr_clock.h"
#include "nw_mgr_handover.h"
#include "nw_mgr_table.h"
#include "nw_scoreboard.h"

typedef struct {
    nw_mgr_table *table;
    const nw_mgr_clock *clock;
    nw_mgr_handover *handover;      /* where a frame that may wait on goes back */
    int     serve_reader;           /* the workers' end of the serve queue, or -1 */
    nw_msec max_wait;               /* --max-queue-wait; 0: none */
    nw_msec next;                   /* the next look */
    char   *frame_data;             /* NW_FRAME_MAX_DATA bytes to receive a frame into */
    volatile int64_t *serve_queued; /* the board's count of SERVE frames, or NULL */
    const nw_scoreboard *board;     /* whether a worker is idle (lost wake-ups), or NULL */
    nw_msec next_repost;            /* the next look for a lost wake-up */
    uint32_t stalled_ready;         /* the oldest frame's ready_ms (| 1) at the last look, when
                                     * a worker was idle; 0: none */
    uint64_t reposted;              /* frames sent again, total */
    nw_log_limit said;              /* its 503s */
    nw_log_limit repost_said;       /* frames sent again */
    uint64_t shed;                  /* requests answered 503, total */
} nw_mgr_shed;

void nw_mgr_shed_init(nw_mgr_shed *d, nw_mgr_table *t, const nw_mgr_clock *clock,
                      nw_mgr_handover *handover, int serve_reader, nw_msec max_wait,
                      char *frame_data, volatile int64_t *serve_queued,
                      const nw_scoreboard *board);
/* Shed what waited too long, when its look is due. */
void nw_mgr_shed_look(nw_mgr_shed *d);
/* next, or the next look if that is sooner. */
nw_msec nw_mgr_shed_next(const nw_mgr_shed *d, nw_msec next);
void nw_mgr_shed_count(const nw_mgr_shed *d, nw_manager_stats *st);
void nw_mgr_shed_close(nw_mgr_shed *d);

#endif
