/* A worker process's signal handlers, and the other ways it is made to
 * leave: a crash hands the parked connections on before the process dies,
 * the request watchdog answers 504 and exits when the app is stuck outside
 * Perl, the stop signals' sender is noted (a retirement or the whole
 * server's stop), and the memory limit is checked. Perl-free; process-wide
 * (one of each per process), so the state is this unit's own statics. The
 * handlers sit in front of Perl's (nw_signal.h) and use only
 * async-signal-safe calls; what they need of the worker's scheduling
 * (the connection being served, the parked set) they get through
 * nw_worker.h. Signals deferred while the app runs are the scheduler's
 * (nw_worker_defer_signals in nw_worker.h): they are part of its wait.
 * See "The operator layer" in docs/DESIGN.md. */
#ifndef NW_WORKER_SIGNALS_H
#define NW_WORKER_SIGNALS_H

#include <stdint.h>
#include "nw_scoreboard.h"
#include "nw_worker.h"

/* On a crash (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT), hand the parked
 * connections to the manager before the process dies, when the parked set
 * is not in the middle of a change. The signal's default action follows.
 * Call once, after nw_worker_start. */
void nw_worker_hand_off_on_crash(nw_worker *w);

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
 * any) with the status the client got; before_exit (if any) runs just
 * before the last resort exits, in the signal handler. */
void nw_worker_watchdog_arm(int sig, nw_score_slot *slot, void (*before_exit)(void));

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
