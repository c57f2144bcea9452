/* The park watcher thread (see nw_watcher.h). */
#include "nw_watcher.h"

#include <signal.h>
#include <time.h>

static nw_watcher *watched;     /* this process's running watcher, for fork */

void nw_watcher_init(nw_watcher *wt, const nw_watcher_ops *ops, void *ctx)
{
    wt->ops = *ops;
    wt->ctx = ctx;
    wt->coarse_lag = nw_coarse_tick_ms() + 1;
}

/* Wait on wake until the monotonic millisecond `until`. */
static void watcher_sleep(nw_watcher *wt, nw_msec until)
{
    struct timespec ts = { (time_t)(until / 1000), (long)(until % 1000) * 1000000L };
    pthread_cond_timedwait(&wt->wake, &wt->lock, &ts);
}

/* The main thread has been out for NW_PARK_SLOW_REQUEST_MS: the worker's
 * work, and when to look again. */
static void watcher_act(nw_watcher *wt, nw_msec now)
{
    switch (wt->ops.act(wt->ctx, now)) {
    case NW_WATCHER_GAVE_UP:
        wt->gave_up = wt->out_since;
        break;
    case NW_WATCHER_RETRY_SOON:
        watcher_sleep(wt, now + NW_PARK_EVICT_RETRY_MS);
        break;
    case NW_WATCHER_LOOK_AGAIN:
        watcher_sleep(wt, now + NW_PARK_SLOW_REQUEST_MS);   /* (no worker idle: look again) */
        break;
    case NW_WATCHER_DONE:
        break;
    }
}

static void *watcher_main(void *arg)
{
    nw_watcher *wt = arg;
    pthread_mutex_lock(&wt->lock);
    while (!wt->quit) {
        if (!wt->ops.has_work(wt->ctx)) {
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

int nw_watcher_enter(nw_watcher *wt)
{
    if (!wt->running)
        return 0;
    pthread_mutex_lock(&wt->lock);
    wt->main_holds = 1;
    wt->out_since = 0;
    return 1;
}

void nw_watcher_leave(nw_watcher *wt)
{
    if (!wt->running || !wt->main_holds)
        return;
    wt->out_since = nw_coarse_ms() + wt->coarse_lag;  /* (a fifth of a precise reading's cost) */
    if (wt->idle && wt->ops.has_work(wt->ctx))
        pthread_cond_signal(&wt->wake);
    wt->main_holds = 0;
    pthread_mutex_unlock(&wt->lock);
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
