/* The park watcher thread (see nw_watcher.h). */
#include "nw_watcher.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <time.h>

static nw_watcher *watched;     /* this process's running watcher, for fork */

void nw_watcher_init(nw_watcher *wt, const nw_watcher_shared *shared)
{
    wt->parking = shared->parking;
    wt->sources = shared->sources;
    wt->handoff = shared->handoff;
    wt->coarse_lag = nw_coarse_lag_ms();
}

void nw_watcher_count_in(nw_watcher *wt, const nw_scoreboard *board, nw_score_slot *slot)
{
    wt->board = board;
    wt->slot = slot;
}

/* Wait on wake until the monotonic millisecond `until`. */
static void watcher_sleep(nw_watcher *wt, nw_msec until)
{
    struct timespec ts = { (time_t)(until / 1000), (long)(until % 1000) * 1000000L };
    pthread_cond_timedwait(&wt->wake, &wt->lock, &ts);
}

/* What an eviction round came to. */
enum evict_result {
    EVICTED,                /* every parked connection went to the manager */
    EVICT_QUEUE_FULL,       /* the rest stay parked (none is closed here, readable
                             * ones hold a request): try again soon */
    EVICT_MANAGER_GONE,     /* another error: leave them */
};

/* Hand every parked connection to the manager, without waiting for room in
 * its queue. Runs in the watcher, with the lock: it touches the
 * connections' C side only. */
static enum evict_result evict_parked(nw_watcher *wt, nw_msec now)
{
    nw_wconn *wc;
    if (nw_conn_server_closing())
        return EVICT_MANAGER_GONE;  /* (see nw_parking_expire) they stay parked */
    while ((wc = nw_park_take_expired(&wt->parking->set, now, 1))) {
        wc->watch.registered = 0;     /* it left the epoll set */
        if (wc->c->fd >= 0 && nw_conn_handoff(wc->c, wt->handoff->queue) < 0) {
            int full = nw_conn_handoff_waits(errno);
            if (nw_park_add(&wt->parking->set, wc->c->fd, wc, now + wt->parking->keep_ms, 0, &wc->watch) < 0) {
                nw_conn_close_fd(wc->c);  /* cannot be watched any more */
                nw_watcher_evicted(wt, wc);
            }
            return full ? EVICT_QUEUE_FULL : EVICT_MANAGER_GONE;
        }
        nw_watcher_evicted(wt, wc);
    }
    return EVICTED;
}

/* One that the watcher passes on goes to the manager, without waiting
 * for room in its queue (the watcher holds the lock). One the manager
 * does not take is kept for the main thread, which takes it next, as it
 * would have without the watcher: it is not closed (a queued request
 * has its client waiting for an answer) nor parked (with --keepalive-wait
 * 0 it would expire at once). Returns 0 then: the rest are not tried. */
static int pass_on_one(nw_watcher *wt, nw_wconn *wc)
{
    if (nw_handoff_give(wt->handoff, wc, 0) == 0) {
        nw_wconn_free(wc);
        return 1;
    }
    wt->kept = wc;
    return 0;
}

/* Whether the manager's queue has room for a frame now. */
static int hand_off_room(const nw_watcher *wt)
{
    struct pollfd p = { .fd = wt->handoff->queue, .events = POLLOUT };
    return poll(&p, 1, 0) == 1 && (p.revents & POLLOUT) && !(p.revents & (POLLERR | POLLHUP));
}

/* In the watcher, the main thread out for NW_PARK_SLOW_REQUEST_MS: what
 * waits in the serve queue and on the listeners that epoll reported goes
 * to the manager, which queues it with a wake-up of its own, when another
 * worker is idle to take it. (With none idle, the first one free sees the
 * wake-up too, and the manager takes a stuck pool's listeners itself.) */
static void pass_on_left(nw_watcher *wt)
{
    nw_wconn *wc;
    if (wt->kept || !wt->board || !nw_scoreboard_other_idle(wt->board, wt->slot)
        || nw_conn_server_closing() || !hand_off_room(wt))
        return;     /* (a full queue: the watcher looks again) */
    nw_sources *src = wt->sources;
    for (int i = 0; i < NW_PASS_ON_MAX && (wc = nw_sources_take_served(src)); i++)
        if (!pass_on_one(wt, wc))
            return;
    for (int idx = 0; idx < src->count; idx++) {
        for (int i = 0; i < NW_PASS_ON_MAX && (src->listener_ready & ((uint64_t)1 << idx)); i++) {
            if (!(wc = nw_sources_accept_on(src, idx))) {
                if (errno != ENOMEM)
                    nw_sources_listener_empty(src, idx);
                break;
            }
            if (!pass_on_one(wt, wc))
                return;
        }
    }
}

/* What a round of the watcher's work came to. */
typedef enum {
    WATCHER_DONE,           /* nothing left to do for this slow request */
    WATCHER_GAVE_UP,        /* the manager is gone: not tried again this time out */
    WATCHER_RETRY_SOON,     /* the manager's queue was full */
    WATCHER_LOOK_AGAIN,     /* a wake-up is still left (no worker was idle) */
} watcher_verdict;

/* The main thread has been out for NW_PARK_SLOW_REQUEST_MS: the parked
 * connections go to the manager, and what a wake-up left. */
static watcher_verdict watcher_work(nw_watcher *wt, nw_msec now)
{
    enum evict_result r = wt->parking->set.count ? evict_parked(wt, now) : EVICTED;
    if (r == EVICT_MANAGER_GONE)
        return WATCHER_GAVE_UP;
    if (nw_sources_wakeup_left(wt->sources))
        pass_on_left(wt);
    if (r == EVICT_QUEUE_FULL)
        return WATCHER_RETRY_SOON;
    return nw_sources_wakeup_left(wt->sources) ? WATCHER_LOOK_AGAIN : WATCHER_DONE;
}

/* The watcher's work, and when to look again. */
static void watcher_act(nw_watcher *wt, nw_msec now)
{
    switch (watcher_work(wt, now)) {
    case WATCHER_GAVE_UP:
        wt->gave_up = wt->out_since;
        break;
    case WATCHER_RETRY_SOON:
        watcher_sleep(wt, now + NW_PARK_EVICT_RETRY_MS);
        break;
    case WATCHER_LOOK_AGAIN:
        watcher_sleep(wt, now + NW_PARK_SLOW_REQUEST_MS);
        break;
    case WATCHER_DONE:
        break;
    }
}

static void *watcher_main(void *arg)
{
    nw_watcher *wt = arg;
    pthread_mutex_lock(&wt->lock);
    while (!wt->quit) {
        if (!nw_watcher_has_work(wt)) {
            wt->idle = 1;
            pthread_cond_wait(&wt->wake, &wt->lock);
            wt->idle = 0;
            continue;
        }
        nw_msec now = nw_now_ms();
        if (!wt->out_since || wt->out_since == wt->gave_up)
            watcher_sleep(wt, now + NW_PARK_SLOW_REQUEST_MS);
        else if (now - wt->out_since < NW_PARK_SLOW_REQUEST_MS)
            watcher_sleep(wt, wt->out_since + NW_PARK_SLOW_REQUEST_MS);
        else
            watcher_act(wt, now);
    }
    pthread_mutex_unlock(&wt->lock);
    return NULL;
}

/* A fork by the app: the parked set must not be half-way through an
 * eviction, so the lock is taken around it (unless the main thread holds
 * it already). The child has no watcher thread: it starts afresh, without. */
static void watcher_before_fork(void)
{
    nw_watcher *wt = watched;
    if (wt && wt->running && !wt->main_holds) {
        pthread_mutex_lock(&wt->lock);
        wt->fork_locked = 1;
    }
}

static void watcher_after_fork_parent(void)
{
    nw_watcher *wt = watched;
    if (wt && wt->fork_locked) {
        wt->fork_locked = 0;
        pthread_mutex_unlock(&wt->lock);
    }
}

static void watcher_after_fork_child(void)
{
    nw_watcher *wt = watched;
    if (wt && wt->running) {
        wt->running = 0;
        wt->fork_locked = 0;
        wt->main_holds = 0;
        pthread_mutex_init(&wt->lock, NULL);
        pthread_cond_init(&wt->wake, NULL);
    }
    watched = NULL;
}

int nw_watcher_start(nw_watcher *wt)
{
    static int atfork_done;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&wt->wake, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&wt->lock, NULL);
    pthread_mutex_lock(&wt->lock);          /* the main thread is inside */
    wt->main_holds = 1;
    if (!atfork_done && pthread_atfork(watcher_before_fork, watcher_after_fork_parent,
                                       watcher_after_fork_child) == 0)
        atfork_done = 1;
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    wt->running = atfork_done && pthread_create(&wt->thread, NULL, watcher_main, wt) == 0;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (wt->running)
        watched = wt;
    else
        pthread_mutex_unlock(&wt->lock);
    wt->main_holds = wt->running;
    return wt->running;
}

void nw_watcher_stop(nw_watcher *wt)
{
    if (!wt->running)
        return;
    wt->quit = 1;
    pthread_cond_signal(&wt->wake);
    wt->main_holds = 0;
    pthread_mutex_unlock(&wt->lock);
    pthread_join(wt->thread, NULL);
    wt->running = 0;
    if (watched == wt)
        watched = NULL;
}

/* The lock, from a signal handler: the watcher holds it for moments (it
 * is often just awake, since the main thread wakes it when it goes out to
 * run the app), so try for a while; never if the crashing main thread
 * holds it itself (then the set may be half-changed). */
static int crash_lock(nw_watcher *wt)
{
    if (wt->main_holds)
        return 0;
    for (int i = 0; i < NW_CRASH_LOCK_TRIES; i++) {
        if (pthread_mutex_trylock(&wt->lock) == 0)
            return 1;
        struct timespec pause = { 0, 100000 };     /* 0.1 ms */
        nanosleep(&pause, NULL);
    }
    return 0;
}

int nw_watcher_lock_from_handler(nw_watcher *wt)
{
    return wt->running ? crash_lock(wt) : !wt->main_holds;
}
