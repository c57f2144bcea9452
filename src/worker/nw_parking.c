/* Parking (see nw_parking.h). */
#include "nw_parking.h"

#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "nw_limits.h"

void nw_parking_init(nw_parking *p, const nw_parking_shared *with, int epfd,
                     uint32_t event_base, nw_msec keep_ms, nw_msec idle_ms)
{
    p->with = *with;
    p->keep_ms = keep_ms;
    p->idle_ms = idle_ms > keep_ms ? idle_ms : keep_ms;
    p->paused_until = 0;
    p->slow_at = 0;
    nw_park_init(&p->set, epfd, event_base);
}

nw_wconn *nw_parking_take_any(nw_parking *p)
{
    nw_wconn *wc = nw_park_take_expired(&p->set, 0, 1);
    if (wc)
        wc->watch.registered = 0;   /* (taken out of epoll) */
    return wc;
}

#define CACHE_LINE 64    /* bytes (x86-64, and most of the rest) */

/* Ask the CPU for n bytes at p, a cache line at a time. */
static void prefetch_bytes(const void *p, size_t n)
{
    for (size_t off = 0; off < n; off += CACHE_LINE)
        __builtin_prefetch((const char *)p + off);
}

/* With hundreds of parked connections a worker cycles through more
 * connection state than its caches hold, and a request's first touches of
 * its nw_wconn, nw_conn and the caller's object miss (PERFORMANCE.md,
 * eighteenth round). So, as one is taken, the CPU is asked for the next
 * one's: it arrives while this request is served. (The park keeps the
 * pointers: reading them from the nw_wconn would wait for that miss.) */
static void prefetch_ready(nw_parking *p)
{
    const void *const *warm;
    void *next = nw_park_peek_ready(&p->set, &warm);
    if (!next)
        return;
    prefetch_bytes(next, sizeof(nw_wconn));
    prefetch_bytes(warm[0], sizeof(nw_conn));
    __builtin_prefetch(warm[1]);    /* the owner, and what it owns (one line each) */
    __builtin_prefetch(warm[2]);
}

/* The pointers prefetch_ready asks for. The owner's are NULL until the
 * connection is first served (an adopted one): a prefetch never faults. */
static void keep_warm(nw_parking *p, nw_wconn *wc)
{
    const void **warm = p->set.warm[wc->watch.slot];
    warm[0] = wc->c;
    warm[1] = wc->owner;
    warm[2] = wc->owner_mem;
}

nw_wconn *nw_parking_take_ready(nw_parking *p)
{
    int hangup;
    nw_wconn *wc = nw_park_take_ready(&p->set, &hangup);
    if (wc && hangup)
        wc->peer_closed = 1;
    if (wc && p->set.ready_count)
        prefetch_ready(p);
    return wc;
}

/* An often slow app pauses parking: a connection parked here could wait
 * behind this worker's next slow request while another worker is free.
 * Often: a request of NW_PARK_SLOW_REQUEST_MS or more within
 * NW_PARK_PAUSE_MS of the last one. A lone one (a stalled machine, a rare
 * slow page) does not: the park watcher already passes on what waits
 * behind it, and a pause would send every client through the manager to
 * the standby workers for seconds. Nor does time spent waiting for a CPU:
 * on a busy machine every worker waits as long. The block meter measures
 * every request for NW_PARK_PAUSE_MS after a slow one, so the second is
 * always measured (time a VM's host takes from it is not seen). */
static void note_slow_request(nw_parking *p, const nw_wconn *wc, nw_msec now)
{
    nw_msec waited = p->with.place ? (nw_msec)(nw_pool_place_cpu_wait_us(p->with.place) / 1000) : 0;
    if (!wc->started || now - wc->started - waited < NW_PARK_SLOW_REQUEST_MS)
        return;
    if (p->slow_at && now - p->slow_at < NW_PARK_PAUSE_MS)
        p->paused_until = now + NW_PARK_PAUSE_MS;
    p->slow_at = now;
    if (p->with.place)
        nw_pool_place_measure_until(p->with.place, now + NW_PARK_PAUSE_MS);
}

int nw_parking_add(nw_parking *p, nw_wconn *wc)
{
    nw_msec now = wc->ended ? wc->ended : nw_now_ms();  /* (a request just ended: its end) */
    note_slow_request(p, wc, now);
    wc->started = 0;
    wc->ended = 0;
    if (p->keep_ms <= 0 || now < p->paused_until || wc->c->in.len > 0 || wc->c->fd < 0)
        return -1;
    /* Its requests block: the next one goes through the serve queue, where
     * any free worker takes it (DESIGN.md, "Requests that block"). */
    if (p->with.handoff->queue >= 0 && nw_pool_place_blocking(p->with.place, now))
        return -1;
    /* Not drained if the app may have read from the socket behind our
     * back, or if a FIN came with the last bytes (it raised no edge of its
     * own): then the watch is re-armed, which reports it. */
    int drained = wc->c->drained && !wc->peer_closed && !wc->socket_lent;
    if (nw_park_add(&p->set, wc->c->fd, wc, now + p->keep_ms, drained, &wc->watch) < 0)
        return -1;
    keep_warm(p, wc);
    nw_conn_shed_buffers(wc->c);    /* (none is buffered: see above) */
    if (p->with.owner->hold && wc->owner)   /* (an adopted one has none until it is served) */
        p->with.owner->hold(wc->owner);
    /* custody: the manager will hold a copy, so that this process's
     * death does not take the connection with it */
    nw_custody_wait_add(p->with.custody, wc, now);
    return 0;
}

/* If the manager does not take one within the patience, the
 * rest of this round are not waited for: they are closed (a parked
 * connection has nothing unread, so a plain close is a clean FIN). */
/* The server is draining or stopping: the manager may stop reading the
 * handoff queue at any moment, and a connection left there would be lost.
 * Parked ones stay here until their keep-alive time is out (every one
 * was parked keep_ms before its park deadline and idle_ms before that),
 * then are closed: nothing unread, so a plain close is a clean FIN. */
static void close_idle(nw_parking *p, nw_msec now)
{
    nw_wconn *wc;
    while ((wc = nw_park_take_expired(&p->set, now - (p->idle_ms - p->keep_ms), 0))) {
        wc->watch.registered = 0;
        nw_conn_close_fd(wc->c);
        nw_wconn_drop(wc, p->with.owner);
    }
}

nw_msec nw_parking_next(const nw_parking *p)
{
    nw_msec due = nw_park_nearest(&p->set);
    return due && nw_conn_server_closing() ? due + (p->idle_ms - p->keep_ms) : due;
}

void nw_parking_expire(nw_parking *p, nw_msec now, int everything)
{
    nw_wconn *wc;
    int patience = NW_HANDOFF_PATIENCE_MS;
    if (!everything && nw_conn_server_closing()) {
        close_idle(p, now);
        return;
    }
    while ((wc = nw_park_take_expired(&p->set, now, everything))) {
        wc->watch.registered = 0;  /* nw_park_take_expired took it out of epoll */
        if (wc->c->fd >= 0 && nw_handoff_give(p->with.handoff, wc, patience) < 0) {
            if (p->with.handoff->queue >= 0)
                nw_handoff_refused(p->with.handoff, errno, 0);
            patience = 0;           /* dropping it below closes it */
        }
        nw_wconn_drop(wc, p->with.owner);
    }
}

/* A FIN to all at once, then read and drop what they still send until each closes
 * too or NW_PARK_CLOSE_LINGER_MS passes, so that none is reset. Waits with
 * poll on the parked fds alone: the epoll set also holds listeners whose
 * fds may be closed already and that would keep reporting readiness. */
void nw_parking_close_all(nw_parking *p)
{
    nw_msec until = nw_now_ms() + NW_PARK_CLOSE_LINGER_MS, now;
    nw_wconn *held[NW_MAX_PARKED], *wc;
    struct pollfd pf[NW_MAX_PARKED];
    int n = 0;
    while ((wc = nw_park_take_expired(&p->set, 0, 1))) {
        wc->watch.registered = 0;
        if (wc->c->fd < 0) {
            nw_wconn_drop(wc, p->with.owner);
            continue;
        }
        shutdown(wc->c->fd, SHUT_WR);
        pf[n].fd = wc->c->fd;
        pf[n].events = POLLIN;
        held[n++] = wc;
    }
    int open_count = n;
    while (open_count > 0 && (now = nw_now_ms()) < until) {
        if (poll(pf, (nfds_t)n, (int)(until - now)) <= 0)
            continue;
        for (int k = 0; k < n; k++) {
            if (pf[k].fd < 0 || !pf[k].revents)
                continue;
            char drop[4096];
            ssize_t r = read(pf[k].fd, drop, sizeof drop);
            if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
                pf[k].fd = -1;          /* poll skips it from now on */
                open_count--;
            }
        }
    }
    for (int k = 0; k < n; k++)
        nw_wconn_drop(held[k], p->with.owner);   /* closes the socket */
}

