/* A worker process's signal handlers, its memory limit and its deferred
 * signals (see nw_worker_signals.h; the scheduling they serve is
 * nw_worker.c's). Every handler here runs in a signal's own context: only
 * async-signal-safe calls, and only this file's statics or the attached
 * worker's call-backs. */
#include "nw_worker_signals.h"

#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "nw_io.h"
#include "nw_limits.h"
#include "nw_log.h"
#include "nw_response.h"
#include "nw_scoreboard.h"
#include "nw_signal.h"

/* The attached worker's call-backs (nw_worker_signals_attach). */
static nw_worker_signal_ops worker_ops;

void nw_worker_signals_attach(const nw_worker_signal_ops *ops)
{
    worker_ops = *ops;
}

/* The parked connections on, when a worker is attached. */
static void hand_off_parked(void)
{
    if (worker_ops.hand_off_parked)
        worker_ops.hand_off_parked();
}

/* ---- crashes ------------------------------------------------------- */

static const int crash_signals[] = { SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT };

static void crash_hand_off(int sig)
{
    hand_off_parked();
    signal(sig, SIG_DFL);
    raise(sig);
}

void nw_worker_hand_off_on_crash(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = crash_hand_off;
    sa.sa_flags = SA_RESETHAND | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < sizeof crash_signals / sizeof crash_signals[0]; i++)
        sigaction(crash_signals[i], &sa, NULL);
}

/* ---- the memory limit ---------------------------------------------- */

/* The peak RSS (getrusage) is one system call and never reads a file; only
 * when the peak passes the limit is the current size read from /proc, at
 * most every NW_RSS_LOOK_MS (the peak stays high after a big request whose
 * memory went back). */
uint64_t nw_worker_rss_over(uint64_t limit_kb)
{
    static nw_msec next_look;
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0 || (uint64_t)ru.ru_maxrss <= limit_kb)
        return 0;
    nw_msec now = nw_now_ms();
    if (now < next_look)
        return 0;
    next_look = now + NW_RSS_LOOK_MS;
    uint64_t kb = nw_rss_bytes(0) / 1024;
    return kb > limit_kb ? kb : 0;
}

/* ---- the request watchdog ------------------------------------------ */

static struct sigaction watchdog_next;      /* the handler in front of which ours sits */
static nw_score_slot *watchdog_slot;        /* the worker's scoreboard slot, or NULL */
static void (*watchdog_before_exit)(void *);   /* the last resort's last words (flush a log) */
static void *watchdog_before_exit_arg;
static volatile sig_atomic_t watchdog_hits;

int nw_worker_watchdog_reply(void)
{
    static const char status_line[] = "HTTP/1.1 504 Gateway Timeout\r\n";
    static const char rest[] = "Content-Type: text/plain\r\n"
        "Content-Length: 20\r\nConnection: close\r\n\r\n504 Gateway Timeout\n";
    char resp[sizeof status_line + NW_DATE_FIELD_LEN + sizeof rest];
    nw_conn *c = worker_ops.serving ? worker_ops.serving() : NULL;
    if (!c || c->fd < 0)
        return 0;
    int answered = 0;
    if (!c->responded && !c->broken) {
        /* (time and nw_date_field are safe in a signal handler) */
        size_t n = sizeof status_line - 1;
        memcpy(resp, status_line, n);
        n += nw_date_field(resp + n, time(NULL));
        memcpy(resp + n, rest, sizeof rest - 1);
        n += sizeof rest - 1;
        answered = send(c->fd, resp, n, MSG_DONTWAIT | MSG_NOSIGNAL) > 0;
    }
    c->broken = 1;
    shutdown(c->fd, SHUT_WR);
    if (watchdog_slot) {    /* counted as what the client got */
        nw_scoreboard_request_end(watchdog_slot, answered || !c->status ? 504 : c->status,
                                  c->body_sent, nw_now_us());
        watchdog_slot->exit_reason = NW_EXIT_WATCHDOG;
        watchdog_slot->state = NW_WORKER_STOPPING;
    }
    return answered;
}

/* The second signal: the first one's Perl handler never ran, so the app is
 * in C code (or a system call that restarts). Only async-signal-safe calls. */
static void watchdog_last_resort(void)
{
    static const char msg[] =
        "the request watchdog found the app outside Perl (in C code or a system call "
        "that does not return), so no Perl backtrace; answering 504 and exiting";
    (void)nw_log_write(2, "error", msg, sizeof msg - 1);
    nw_worker_watchdog_reply();
    hand_off_parked();
    if (watchdog_before_exit)
        watchdog_before_exit(watchdog_before_exit_arg);
    _exit(NW_WORKER_EXIT_WATCHDOG);
}

static void watchdog_handler(int sig, siginfo_t *si, void *uc)
{
    if (++watchdog_hits >= 2)
        watchdog_last_resort();
    nw_signal_chain(&watchdog_next, sig, si, uc);
}

void nw_worker_watchdog_rearm(void)
{
    watchdog_hits = 0;
}

void nw_worker_watchdog_arm(int sig, nw_score_slot *slot, void (*before_exit)(void *arg),
                            void *arg)
{
    watchdog_slot = slot;
    watchdog_before_exit = before_exit;
    watchdog_before_exit_arg = arg;
    nw_signal_in_front(sig, watchdog_handler, &watchdog_next);
}

/* ---- who sent the stop --------------------------------------------- */

static struct sigaction stop_next[NSIG];    /* the handlers in front of which ours sit */
static volatile sig_atomic_t stop_sender_pid = -1;

static void stop_sender_handler(int sig, siginfo_t *si, void *uc)
{
    stop_sender_pid = si ? (sig_atomic_t)si->si_pid : 0;
    nw_signal_chain(&stop_next[sig], sig, si, uc);
}

void nw_worker_note_stop_sender(int sig)
{
    if (sig > 0 && sig < NSIG)
        nw_signal_in_front(sig, stop_sender_handler, &stop_next[sig]);
}

void nw_worker_stop_sent_by(long pid)
{
    stop_sender_pid = (sig_atomic_t)pid;
}

long nw_worker_stop_sender(void)
{
    return stop_sender_pid;
}

/* ---- deferred signals ---------------------------------------------- */

static sigset_t deferred_in_parent;     /* for the fork handler */

/* A child of the worker (the app's fork, system, a pipe open) starts with
 * the deferred signals unblocked, as it would under any other server. */
static void deferred_after_fork_child(void)
{
    sigprocmask(SIG_UNBLOCK, &deferred_in_parent, NULL);
}

void nw_deferred_signals_init(nw_deferred_signals *d)
{
    memset(d, 0, sizeof *d);
    d->fd = -1;
}

int nw_deferred_signals_start(nw_deferred_signals *d, const int *signals, int n,
                              int epfd, uint64_t event)
{
    static int atfork_done;
    sigemptyset(&d->set);
    for (int i = 0; i < n; i++)
        sigaddset(&d->set, signals[i]);
    if (!atfork_done) {
        if (pthread_atfork(NULL, NULL, deferred_after_fork_child) != 0)
            return -1;
        atfork_done = 1;
    }
    deferred_in_parent = d->set;
    if (sigprocmask(SIG_BLOCK, &d->set, NULL) < 0)
        return -1;
    d->fd = signalfd(-1, &d->set, SFD_NONBLOCK | SFD_CLOEXEC);
    struct epoll_event ev = { .events = EPOLLIN, .data.u64 = event };
    if (d->fd < 0 || epoll_ctl(epfd, EPOLL_CTL_ADD, d->fd, &ev) < 0) {
        sigprocmask(SIG_UNBLOCK, &d->set, NULL);
        return -1;
    }
    return 0;
}

int nw_deferred_signals_pending(nw_deferred_signals *d, nw_msec now)
{
    if (d->fd < 0)
        return 0;
    if (!d->ready && now >= d->next_look) {
        sigset_t pending;
        d->next_look = now + NW_SIGNAL_LOOK_MS;
        if (sigpending(&pending) == 0)
            for (int sig = 1; sig < NSIG && !d->ready; sig++)
                d->ready = sigismember(&d->set, sig) && sigismember(&pending, sig);
    }
    return d->ready;
}

uint64_t nw_deferred_signals_deliver(nw_deferred_signals *d, nw_worker_life *life)
{
    uint64_t others = 0;
    if (d->fd < 0 || !nw_deferred_signals_pending(d, nw_now_ms()))
        return 0;           /* a clock read, and a sigpending every NW_SIGNAL_LOOK_MS */
    d->ready = 0;
    struct signalfd_siginfo si;
    while (read(d->fd, &si, sizeof si) == (ssize_t)sizeof si) {
        int sig = (int)si.ssi_signo;
        if (sig == SIGTERM || sig == SIGINT || sig == SIGQUIT)
            nw_worker_stop_sent_by((long)si.ssi_pid);   /* (no handler runs to note it) */
        if (!nw_worker_life_signal(life, sig) && sig > 0 && sig < 64)
            others |= (uint64_t)1 << sig;
    }
    return others;
}

void nw_deferred_signals_close(nw_deferred_signals *d)
{
    if (d->fd >= 0)
        close(d->fd);
    d->fd = -1;
}

/* ---- the worker's life ---------------------------------------------- */

int nw_worker_life_signal(nw_worker_life *life, int sig)
{
    if (sig == SIGTERM || sig == SIGINT || sig == SIGQUIT) {
        life->stopping = life->closing = 1;
        return 1;
    }
    if (sig == SIGUSR2) {
        life->stopping = 1;
        if (!life->exit_reason)
            life->exit_reason = life->replacing ? NW_EXIT_MAX_REQUESTS : NW_EXIT_RETIRED;
        return 1;
    }
    return 0;
}

void nw_worker_life_stop(nw_worker_life *life, int closing, int reason)
{
    life->stopping = 1;
    if (closing)
        life->closing = 1;
    if (reason && !life->exit_reason)
        life->exit_reason = reason;
}

