/* The park watcher (docs/DESIGN.md, "Fairness and slow apps"): a thread
 * of the worker that, when the main thread has been out serving one
 * request for NW_PARK_SLOW_REQUEST_MS, lets the parked connections and
 * any wake-up the worker took and left (a listener, the serve queue) go
 * to the manager, so that they do not wait behind a slow request. This
 * part owns the thread, its lock (which the main thread holds whenever it
 * is inside the worker), its timing, its fork handling and the
 * connections it hands back to the main thread; it works on the worker's
 * parking, sources and handoff parts with the lock held. Part of the
 * worker (nw_worker.c), its only caller. */
#ifndef NW_WATCHER_H
#define NW_WATCHER_H

#include <pthread.h>
#include "nw_io.h"
#include "nw_handoff.h"
#include "nw_limits.h"
#include "nw_parking.h"
#include "nw_scoreboard.h"
#include "nw_sources.h"
#include "nw_wconn.h"

/* The worker's parts the watcher works on (with the lock). */
typedef struct {
    nw_parking *parking;        /* the parked connections it hands to the manager */
    nw_sources *sources;        /* the wake-ups left it passes on */
    nw_handoff *handoff;        /* to the manager */
} nw_watcher_shared;

typedef struct {
    nw_parking *parking;
    nw_sources *sources;
    nw_handoff *handoff;
    const nw_scoreboard *board; /* whether another worker is idle (pass on what a wake-up
                                 * left only then), or NULL */
    nw_score_slot *slot;        /* this worker's slot there */
    int running;                /* the thread runs */
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    int idle;                   /* waiting for work or a wake-up */
    int main_holds;             /* the main thread holds lock */
    int fork_locked;            /* the fork handler took lock */
    int quit;                   /* set to make the thread return */
    nw_msec gave_up;            /* out_since of a time out the watcher gave up on */
    nw_msec out_since;          /* the main thread went out to serve then (or up to a
                                 * coarse tick later: never earlier); 0: inside */
    nw_msec coarse_lag;         /* how far nw_coarse_ms may be behind (nw_coarse_lag_ms) */
    nw_wconn *evicted[NW_MAX_PARKED]; /* handed off by the watcher, for the main thread
                                 * to let go */
    int nevicted;
    nw_wconn *kept;             /* taken by the watcher from a wake-up left, refused by
                                 * the manager: the main thread's next connection */
} nw_watcher;

/* A watcher not started, for the parts in shared. */
void nw_watcher_init(nw_watcher *wt, const nw_watcher_shared *shared);

/* The pool on board, this worker in slot (NULL: none). */
void nw_watcher_count_in(nw_watcher *wt, const nw_scoreboard *board, nw_score_slot *slot);

/* Start the thread, with every signal blocked in it (the caller's signal
 * handlers run only in the main thread), the main thread inside. Returns
 * whether it runs. */
int nw_watcher_start(nw_watcher *wt);

/* Whether the watcher has something to watch: parked connections, or a
 * wake-up left. */
static inline int nw_watcher_has_work(const nw_watcher *wt)
{
    return wt->parking->set.count || nw_sources_wakeup_left(wt->sources);
}

/* The main thread comes inside (takes the lock; 1), or there is no
 * watcher (0). (Inline, as the leave: twice a request.) */
static inline int nw_watcher_enter(nw_watcher *wt)
{
    if (!wt->running)
        return 0;
    pthread_mutex_lock(&wt->lock);
    wt->main_holds = 1;
    wt->out_since = 0;
    return 1;
}

/* The main thread goes out to serve (safe to call twice): the lock is
 * let go, and the watcher woken when it has work. */
static inline void nw_watcher_leave(nw_watcher *wt)
{
    if (!wt->running || !wt->main_holds)
        return;
    wt->out_since = nw_coarse_ms() + wt->coarse_lag;  /* (a fifth of a precise reading's cost) */
    if (wt->idle && nw_watcher_has_work(wt))
        pthread_cond_signal(&wt->wake);
    wt->main_holds = 0;
    pthread_mutex_unlock(&wt->lock);
}

/* Whether the watcher runs while the main thread is out: a call into the
 * worker from outside must enter first. */
static inline int nw_watcher_main_outside(const nw_watcher *wt)
{
    return wt->running && !wt->main_holds;
}

/* A connection the watcher handed to the manager, for the main thread to
 * let go (nw_watcher_take_evicted) when it comes inside. */
static inline void nw_watcher_evicted(nw_watcher *wt, nw_wconn *wc)
{
    wt->evicted[wt->nevicted++] = wc;
}

/* The next of those, or NULL. */
static inline nw_wconn *nw_watcher_take_evicted(nw_watcher *wt)
{
    return wt->nevicted > 0 ? wt->evicted[--wt->nevicted] : NULL;
}

/* Stop the thread (idempotent). With the main thread inside. */
void nw_watcher_stop(nw_watcher *wt);

/* From a signal handler in a process about to die: whether the parked set
 * may be touched, the lock taken (tried for a while: the watcher holds it
 * for moments) when the main thread does not hold it itself; without a
 * watcher, when the main thread was not inside. Async-signal-safe. */
int nw_watcher_lock_from_handler(nw_watcher *wt);

#endif
