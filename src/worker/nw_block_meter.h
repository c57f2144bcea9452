/* Whether a worker's requests block: spend their time asleep (a database
 * query, a sleep, a lock) rather than on a CPU or waiting for one. Each
 * worker has one, for its serving thread; it measures only requests that
 * last NW_BLOCK_MEASURE_US or more, from the kernel's schedstat of that
 * thread. See "Requests that block" in docs/DESIGN.md. */
#ifndef NW_BLOCK_METER_H
#define NW_BLOCK_METER_H

#include <stdint.h>
#include "nw_io.h"

typedef struct {
    int fd;                 /* /proc/thread-self/schedstat of the serving thread;
                             * -1: not opened yet, -2: none (the CPU clock instead) */
    int armed;              /* the next request is measured */
    int measuring;          /* the current one's start was read */
    uint64_t run0_ns;       /* at its start: time on a CPU so far */
    uint64_t wait0_ns;      /* ... and time runnable, waiting for one */
    int share;              /* the blocked share of measured requests, a moving
                             * average, in 1/1024 */
    nw_msec blocked_at;     /* the last measured request that blocked ended then */
    int blocking;           /* the verdict (nw_block_meter_blocking) */
    uint64_t measured;      /* requests measured (tests, /status) */
    uint64_t last_wait_us;  /* the last request's time waiting for a CPU (0: not measured) */
    nw_msec measure_until;  /* every request is measured until then (0: none asked) */
} nw_block_meter;

/* A meter that has measured nothing: not blocking. Opens nothing yet (the
 * first measured request opens its thread's schedstat). */
void nw_block_meter_init(nw_block_meter *m);
void nw_block_meter_close(nw_block_meter *m);

/* A request begins on the calling (serving) thread: read its clocks when
 * the meter is armed. */
void nw_block_meter_start(nw_block_meter *m);

/* It ended after wall_us, at now: the verdict is updated. */
void nw_block_meter_end(nw_block_meter *m, uint64_t wall_us, nw_msec now);

/* One measured request: wall_us long, of which run_us on a CPU and
 * runnable_us waiting for one (the rest asleep). What _end does with its
 * readings; public for the unit tests' made-up requests. */
void nw_block_meter_note(nw_block_meter *m, uint64_t wall_us, uint64_t run_us,
                         uint64_t runnable_us, nw_msec now);

/* Measure every request until `until` (parking, after a slow one: how
 * much of the next slow one was a wait for a CPU). */
void nw_block_meter_measure_until(nw_block_meter *m, nw_msec until);

/* How long the last request waited for a CPU, when it was measured (0
 * when not): a request slow for want of a CPU is slow for every worker. */
static inline uint64_t nw_block_meter_cpu_wait_us(const nw_block_meter *m)
{
    return m->last_wait_us;
}

/* Whether this worker's requests block, now. */
int nw_block_meter_blocking(nw_block_meter *m, nw_msec now);

#endif
