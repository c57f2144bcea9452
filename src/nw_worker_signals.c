/* A worker process's signal handlers and its memory limit (see
 * nw_worker_signals.h; the scheduling they serve is nw_worker.c's). Every
 * handler here runs in a signal's own context: only async-signal-safe
 * calls, and only this file's statics or what nw_worker.h says is safe. */
#include "nw_worker_signals.h"

#include <signal.h>
#include <string.h>
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
#include "nw_worker.h"

/* ---- crashes ------------------------------------------------------- */

static const int crash_signals[] = { SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT };

static void crash_hand_off(int sig)
{
    nw_worker_hand_off_parked_from_handler();
    signal(sig, SIG_DFL);
    raise(sig);
}

void nw_worker_hand_off_on_crash(nw_worker *w)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = crash_hand_off;
    sa.sa_flags = SA_RESETHAND | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < sizeof crash_signals / sizeof crash_signals[0]; i++)
        sigaction(crash_signals[i], &sa, NULL);
    (void)w;
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
static void (*watchdog_before_exit)(void);  /* the last resort's last words (flush a log) */
static volatile sig_atomic_t watchdog_hits;

int nw_worker_watchdog_reply(void)
{
    static const char status_line[] = "HTTP/1.1 504 Gateway Timeout\r\n";
    static const char rest[] = "Content-Type: text/plain\r\n"
        "Content-Length: 20\r\nConnection: close\r\n\r\n504 Gateway Timeout\n";
    char resp[sizeof status_line + NW_DATE_FIELD_LEN + sizeof rest];
    nw_wconn *wc = nw_worker_serving();
    if (!wc || !wc->c || wc->c->fd < 0)
        return 0;
    int answered = 0;
    if (!wc->c->responded && !wc->c->broken) {
        /* (time and nw_date_field are safe in a signal handler) */
        size_t n = sizeof status_line - 1;
        memcpy(resp, status_line, n);
        n += nw_date_field(resp + n, time(NULL));
        memcpy(resp + n, rest, sizeof rest - 1);
        n += sizeof rest - 1;
        answered = send(wc->c->fd, resp, n, MSG_DONTWAIT | MSG_NOSIGNAL) > 0;
    }
    wc->c->broken = 1;
    shutdown(wc->c->fd, SHUT_WR);
    if (watchdog_slot) {    /* counted as what the client got */
        nw_scoreboard_request_end(watchdog_slot, answered || !wc->c->status ? 504 : wc->c->status,
                                  wc->c->body_sent, nw_now_us());
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
    nw_worker_hand_off_parked_from_handler();
    if (watchdog_before_exit)
        watchdog_before_exit();
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

void nw_worker_watchdog_arm(int sig, nw_score_slot *slot, void (*before_exit)(void))
{
    watchdog_slot = slot;
    watchdog_before_exit = before_exit;
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
