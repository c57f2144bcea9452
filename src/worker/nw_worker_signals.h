/* A worker process's signals, and the other ways it is made to leave.
 * Two kinds:
 *  - the handlers: a crash hands the parked connections on before the
 *    process dies, the request watchdog answers 504 and exits when the app
 *    is stuck outside Perl, the stop signals' sender is noted (a
 *    retirement or the whole server's stop); and the memory limit.
 *    Process-wide (one of each per process), so their state is this
 *    unit's own statics. They sit in front of Perl's (nw_signal.h) and use
 *    only async-signal-safe calls; what they need of the worker (the
 *    connection being served, the parked set) they get through the
 *    call-backs the worker gives nw_worker_signals_attach.
 *  - the deferred signals (nw_deferred_signals): blocked while the app
 *    runs, seen through a signalfd while the worker waits, delivered
 *    between requests into the worker's life (nw_worker_life). Part of
 *    the worker (nw_worker.c: nw_worker_defer_signals), its only caller.
 * See "The operator layer" in docs/DESIGN.md. */
#ifndef NW_WORKER_SIGNALS_H
#define NW_WORKER_SIGNALS_H

#include <signal.h>
#include <stdint.h>
#include "nw_conn.h"
#include "nw_io.h"
#include "nw_scoreboard.h"

/* Whether the worker leaves, why, and what it has served: the one record
 * of its life. C sets it (the request sequence; a stop signal read from
 * the signalfd by nw_deferred_signals_deliver), Perl through the XS
 * setters for what it decides (an orphaned worker, psgix.harakiri.commit),
 * and Perl reads it when serve returns. */
typedef struct {
    int stopping;       /* leave once the current request is done */
    int closing;        /* the server stops: serve what has arrived (Connection:
                         * close), close what is parked */
    int replacing;      /* it asked the master for its replacement (a USR2 then
                         * is still a recycle) */
    int exit_reason;    /* enum nw_exit_reason; NW_EXIT_NONE until one is known */
    uint64_t served;    /* requests finished */
} nw_worker_life;

/* What a stop signal means for the worker's life: TERM, INT and QUIT
 * stop and close; USR2 stops, and the reason is a retirement (or a
 * recycle, once it asked for its replacement). Returns 1 when sig is one
 * of those, else 0 (nothing changes). Async-signal-safe. */
int nw_worker_life_signal(nw_worker_life *life, int sig);

/* Decided elsewhere: leave (closing: the server stops), with a reason
 * when none is known yet (0: none given). */
void nw_worker_life_stop(nw_worker_life *life, int closing, int reason);

/* Deferred signals: blocked, so that they never interrupt the app (a
 * sleep or a blocking call in it), and watched through a signalfd in the
 * worker's epoll instead. */
typedef struct {
    int fd;                 /* the signalfd; -1 when signals are not deferred */
    sigset_t set;           /* the signals deferred */
    int ready;              /* epoll reported the signalfd readable */
    nw_msec next_look;      /* a busy worker asks the kernel for pending ones then */
} nw_deferred_signals;

/* None deferred yet. */
void nw_deferred_signals_init(nw_deferred_signals *d);

/* Defer these signals, their signalfd in epoll epfd with event as its
 * data. A child the process forks starts with them unblocked. Returns 0
 * or -1. */
int nw_deferred_signals_start(nw_deferred_signals *d, const int *signals, int n,
                              int epfd, uint64_t event);

/* Whether one is pending: reported by epoll (ready), or, for a worker
 * that has not waited lately, asked of the kernel at most every
 * NW_SIGNAL_LOOK_MS. */
int nw_deferred_signals_pending(nw_deferred_signals *d, nw_msec now);

/* The worker waited in epoll at now: epoll would have said, so the kernel
 * is not asked before NW_SIGNAL_LOOK_MS from then. */
static inline void nw_deferred_signals_waited(nw_deferred_signals *d, nw_msec now)
{
    d->next_look = now + NW_SIGNAL_LOOK_MS;
}

/* Take the pending ones from the signalfd: a stop signal goes into life
 * (nw_worker_life_signal); any other is returned for the caller to act
 * on, as a mask of (1 << signo). */
uint64_t nw_deferred_signals_deliver(nw_deferred_signals *d, nw_worker_life *life);

void nw_deferred_signals_close(nw_deferred_signals *d);

/* What the handlers need of this process's worker. Both async-signal-safe. */
typedef struct {
    nw_conn *(*serving)(void);      /* the connection whose request runs, or NULL */
    void (*hand_off_parked)(void);  /* the parked connections to the other workers or
                                     * the manager, when the parked set is not in the
                                     * middle of a change; frees and closes nothing */
} nw_worker_signal_ops;

/* The worker that serves in this process (nw_worker_start): the handlers
 * ask it through ops from now on. */
void nw_worker_signals_attach(const nw_worker_signal_ops *ops);

/* On a crash (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT), hand the parked
 * connections on before the process dies (the attached worker's
 * hand_off_parked). The signal's default action follows. Call once, after
 * nw_worker_start. */
void nw_worker_hand_off_on_crash(void);

/* --max-worker-rss: this process's resident size in KiB when it is over
 * limit_kb, else 0. Cheap enough for every request (see the .c). */
uint64_t nw_worker_rss_over(uint64_t limit_kb);

/* The request watchdog (DESIGN.md, "The operator layer"). A worker it
 * ends exits with this status. */
#define NW_WORKER_EXIT_WATCHDOG 72

/* Put a handler for sig in front of the one installed now (Perl's): the
 * first signal goes on to it (the Perl handler logs a backtrace at the
 * next safe point); a second one means Perl never got there, and the
 * handler answers 504, hands the parked connections to the manager and
 * exits with NW_WORKER_EXIT_WATCHDOG. The request is counted on slot (if
 * any) with the status the client got; before_exit(arg) (if any) runs
 * just before the last resort exits, in the signal handler. */
void nw_worker_watchdog_arm(int sig, nw_score_slot *slot, void (*before_exit)(void *arg),
                            void *arg);

/* A first signal was let go (its request had ended): the next is a first. */
void nw_worker_watchdog_rearm(void);

/* Answer 504 on the connection whose request is running, unless a byte of
 * its response went out already, and end the connection's output.
 * Async-signal-safe. Returns 1 when the 504 was sent. */
int nw_worker_watchdog_reply(void);

/* Who sent the stop signals sig (TERM, INT, QUIT): a C handler goes in
 * front of the one installed now and notes the sender of each. The pid of
 * the last one, 0 when the kernel sent it (Ctrl-C from a terminal), or -1
 * when none came. The master sends TERM to retire a worker as well as to
 * stop it; a stop sent by anybody else is the whole server's. */
void nw_worker_note_stop_sender(int sig);
long nw_worker_stop_sender(void);

/* A stop signal taken from the signalfd (nw_worker_deliver_signals), where
 * no handler runs: its sender (ssi_pid) is noted as the handler notes it. */
void nw_worker_stop_sent_by(long pid);

#endif
