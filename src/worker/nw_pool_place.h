/* A worker's place in the pool: whether it accepts new clients or stands
 * by (DESIGN.md, "Accepting workers" and "Requests that block": a standby
 * worker accepts while its requests block, measured by its block meter),
 * and whether it holds no more than its share of the pool's parked
 * connections (who adopts a leaving worker's, who leaves a burst of new
 * clients to the others). Published in its scoreboard slot for the
 * manager, the master and the status pages. Part of the worker
 * (nw_worker.c), its only caller; moving the listeners in and out of the
 * epoll is the worker's, asked through the call-back below. */
#ifndef NW_POOL_PLACE_H
#define NW_POOL_PLACE_H

#include <stdint.h>
#include "nw_block_meter.h"
#include "nw_io.h"
#include "nw_scoreboard.h"

typedef struct {
    /* The listeners into the worker's epoll (1) or out of it (0): 0, or
     * -1 when that failed. */
    int (*watch_listeners)(void *ctx, int watched);
} nw_pool_place_ops;

typedef struct nw_pool_place {
    nw_pool_place_ops ops;
    void *ctx;
    int standby;                /* the listeners are not in its epoll */
    int chosen;                 /* the master made it a standby worker; it accepts while
                                 * its requests block */
    nw_block_meter meter;       /* whether its requests block */
    nw_msec share_at;           /* the pool's parked counts were last compared then */
    int within_share;           /* ... and this worker held no more than their mean */
    nw_msec accept_deferred_since; /* over the mean, it left new clients to others since */
    const nw_scoreboard *board; /* the pool (its parked counts), or NULL */
    nw_score_slot *slot;        /* this worker's slot there, or NULL */
} nw_pool_place;

/* An accepting worker, not in a pool yet, whose listeners ops moves. */
void nw_pool_place_init(nw_pool_place *p, const nw_pool_place_ops *ops, void *ctx);
void nw_pool_place_close(nw_pool_place *p);

/* In the pool on board, in slot (NULL: none). */
void nw_pool_place_count_in(nw_pool_place *p, const nw_scoreboard *board, nw_score_slot *slot);

/* A standby worker: the listeners leave the epoll (chosen: the master
 * chose it, and from then on it follows its requests). Returns 0, or -1
 * with errno. */
int nw_pool_place_stand_by(nw_pool_place *p, int chosen);

/* Among the accepting workers again: the listeners are back in the epoll. */
void nw_pool_place_accept(nw_pool_place *p);

/* A chosen standby worker accepts while its requests block, and stands by
 * again once they do not; its slot says which. */
void nw_pool_place_follow(nw_pool_place *p, nw_msec now);

/* Whether this worker, holding parked connections, holds no more than the
 * pool's serving workers do on average (with a board; the least loaded
 * one always does). The board's slots are read again NW_SHARE_LOOK_MS
 * later at the soonest: a busy worker may ask before every request. */
int nw_pool_place_within_share(nw_pool_place *p, nw_msec now, uint32_t parked);

/* A burst of new clients: a worker over the pool's mean that has parked
 * connections with a request to serve (parked_ready) leaves the listeners
 * to the others for up to NW_ACCEPT_OVER_MEAN_WAIT_MS. */
int nw_pool_place_defers_accept(nw_pool_place *p, int taken_any, uint32_t parked,
                                int parked_ready);

/* It took a new client: a deferral is over. */
static inline void nw_pool_place_accepted(nw_pool_place *p)
{
    p->accept_deferred_since = 0;
}

/* A request began; it ended after wall_us, at now (the meter's verdict
 * goes to the slot, which the elastic pool reads). */
void nw_pool_place_request_started(nw_pool_place *p);
void nw_pool_place_request_ended(nw_pool_place *p, uint64_t wall_us, nw_msec now);

/* How long the last request waited for a CPU (0: not measured), and
 * every request measured until `until`. */
static inline uint64_t nw_pool_place_cpu_wait_us(const nw_pool_place *p)
{
    return nw_block_meter_cpu_wait_us(&p->meter);
}

static inline void nw_pool_place_measure_until(nw_pool_place *p, nw_msec until)
{
    nw_block_meter_measure_until(&p->meter, until);
}

/* Whether this worker's requests block, now. */
static inline int nw_pool_place_blocking(nw_pool_place *p, nw_msec now)
{
    return nw_block_meter_blocking(&p->meter, now);
}

#endif
