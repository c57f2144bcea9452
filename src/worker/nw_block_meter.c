/* Whether a worker's requests block (nw_block_meter.h). */
#include "nw_block_meter.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "nw_limits.h"

#define SHARE_ONE 1024      /* the share's unit: 1/1024 */

void nw_block_meter_init(nw_block_meter *m)
{
    *m = (nw_block_meter){ .fd = -1 };
}

void nw_block_meter_close(nw_block_meter *m)
{
    if (m->fd >= 0)
        close(m->fd);
    m->fd = -1;
}

/* schedstat: "RUN_NS RUNNABLE_NS TIMESLICES\n": the second. Returns 0, or -1. */
static int read_runnable(int fd, uint64_t *wait_ns)
{
    char buf[96];
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    if (n <= 0)
        return -1;
    buf[n] = 0;
    char *p = strchr(buf, ' '), *end;
    if (!p)
        return -1;
    *wait_ns = strtoull(++p, &end, 10);
    return end == p ? -1 : 0;
}

/* The serving thread's time on a CPU (its CPU clock: schedstat's first
 * field is brought up to date only at a tick or a switch, so a thread on
 * a CPU reads an old value there) and waiting for one (schedstat's
 * second, brought up to date as the thread got the CPU, so current
 * whenever it reads it). Without schedstat no wait is known. */
static int read_clocks(nw_block_meter *m, uint64_t *run_ns, uint64_t *wait_ns)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) < 0)
        return -1;
    *run_ns = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
    if (m->fd == -1) {
        m->fd = open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
        if (m->fd < 0)
            m->fd = -2;
    }
    if (m->fd < 0 || read_runnable(m->fd, wait_ns) < 0)
        *wait_ns = 0;
    return 0;
}

void nw_block_meter_start(nw_block_meter *m)
{
    m->measuring = m->armed && read_clocks(m, &m->run0_ns, &m->wait0_ns) == 0;
}

void nw_block_meter_end(nw_block_meter *m, uint64_t wall_us, nw_msec now)
{
    uint64_t run_ns, wait_ns;
    m->last_wait_us = 0;
    if (m->measuring && read_clocks(m, &run_ns, &wait_ns) == 0 && run_ns >= m->run0_ns
        && wait_ns >= m->wait0_ns)
        nw_block_meter_note(m, wall_us, (run_ns - m->run0_ns) / 1000,
                            (wait_ns - m->wait0_ns) / 1000, now);
    m->measuring = 0;
    /* The next request is measured after a long one, always while
     * blocking, and while asked: a hello app's requests are never read. */
    m->armed = wall_us >= NW_BLOCK_MEASURE_US || m->blocking || now < m->measure_until;
}

void nw_block_meter_measure_until(nw_block_meter *m, nw_msec until)
{
    m->measure_until = until;
    m->armed = 1;
}

void nw_block_meter_note(nw_block_meter *m, uint64_t wall_us, uint64_t run_us,
                         uint64_t runnable_us, nw_msec now)
{
    m->measured++;
    m->last_wait_us = runnable_us;
    if (wall_us < NW_BLOCK_MEASURE_US)
        return;     /* (too short to say) */
    uint64_t awake = run_us + runnable_us;
    uint64_t asleep = awake < wall_us ? wall_us - awake : 0;
    int share = (int)(asleep * SHARE_ONE / wall_us);
    m->share += (share - m->share) / 4;
    if (share * 100 >= NW_BLOCK_SHARE_ON * SHARE_ONE)
        m->blocked_at = now ? now : 1;
    if (m->share * 100 >= NW_BLOCK_SHARE_ON * SHARE_ONE)
        m->blocking = 1;
    else if (m->share * 100 < NW_BLOCK_SHARE_OFF * SHARE_ONE)
        m->blocking = 0;
}

int nw_block_meter_blocking(nw_block_meter *m, nw_msec now)
{
    if (m->blocking && now - m->blocked_at >= NW_BLOCK_HOLD_MS) {
        m->blocking = 0;
        m->share = 0;   /* (a fresh start: the next verdict is the next requests') */
    }
    return m->blocking;
}
