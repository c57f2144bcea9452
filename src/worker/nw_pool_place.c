/* A worker's place in the pool (see nw_pool_place.h). */
#include "nw_pool_place.h"

#include <string.h>

#include "nw_limits.h"

void nw_pool_place_init(nw_pool_place *p, const nw_pool_place_ops *ops, void *ctx)
{
    memset(p, 0, sizeof *p);
    p->ops = *ops;
    p->ctx = ctx;
    nw_block_meter_init(&p->meter);
}

void nw_pool_place_close(nw_pool_place *p)
{
    nw_block_meter_close(&p->meter);
}

void nw_pool_place_count_in(nw_pool_place *p, const nw_scoreboard *board, nw_score_slot *slot)
{
    p->board = board;
    p->slot = slot;
}

int nw_pool_place_stand_by(nw_pool_place *p, int chosen)
{
    if (p->ops.watch_listeners(p->ctx, 0) < 0)
        return -1;
    p->standby = 1;
    if (chosen)
        p->chosen = 1;
    return 0;
}

/* The listeners back in the epoll (the caller tries them all next). */
void nw_pool_place_accept(nw_pool_place *p)
{
    if (p->ops.watch_listeners(p->ctx, 1) == 0)
        p->standby = 0;
}

void nw_pool_place_follow(nw_pool_place *p, nw_msec now)
{
    int accepts = nw_block_meter_blocking(&p->meter, now);
    if (p->slot && p->slot->blocking != accepts)
        p->slot->blocking = accepts;
    if (accepts == !p->standby)
        return;
    if (accepts)
        nw_pool_place_accept(p);
    else
        nw_pool_place_stand_by(p, 0);
    if (p->slot)
        p->slot->standby = p->standby;
}

int nw_pool_place_within_share(nw_pool_place *p, nw_msec now, uint32_t parked)
{
    if (p->standby)
        return 0;       /* (the load belongs to the accepting workers) */
    if (!p->share_at || now - p->share_at >= NW_SHARE_LOOK_MS) {
        p->share_at = now ? now : 1;
        p->within_share = nw_scoreboard_at_most_mean_parked(p->board, parked);
    }
    return p->within_share;
}

/* So that the first worker woken does not take the most of a burst for
 * the connections' whole lives (1,000 clients opened at once were held
 * 359, 237, 204 and 200, and the busiest worker's share set the time for
 * all; PERFORMANCE.md, thirteenth round). With nothing else to do it
 * accepts: the listener, level-triggered, would wake it again at once. */
int nw_pool_place_defers_accept(nw_pool_place *p, int taken_any, uint32_t parked,
                                int parked_ready)
{
    if (!p->board || !taken_any || !parked_ready)
        return 0;
    nw_msec now = nw_now_ms();
    if (nw_pool_place_within_share(p, now, parked)) {
        p->accept_deferred_since = 0;
        return 0;
    }
    if (!p->accept_deferred_since)
        p->accept_deferred_since = now ? now : 1;
    return now - p->accept_deferred_since < NW_ACCEPT_OVER_MEAN_WAIT_MS;
}

void nw_pool_place_request_started(nw_pool_place *p)
{
    nw_block_meter_start(&p->meter);
}

void nw_pool_place_request_ended(nw_pool_place *p, uint64_t wall_us, nw_msec now)
{
    nw_block_meter_end(&p->meter, wall_us, now);
    if (p->slot && p->slot->blocking != p->meter.blocking)
        p->slot->blocking = p->meter.blocking;  /* (the elastic pool reads it) */
}
