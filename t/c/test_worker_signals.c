/* Unit tests for src/worker/nw_worker_signals.c (a worker process's signal
 * handlers and its memory limit), printing TAP: the stop sender noted and
 * the signal passed on; the memory limit's answer and how often it looks;
 * the request watchdog's first signal passed on, its 504 on the connection
 * being served (counted on the slot), its last resort (exit status,
 * last words, the parked connections handed to the manager); a crash
 * handing the parked connections to the manager before the signal's
 * default action. Real sockets: a TCP listener on 127.0.0.1 and
 * SOCK_SEQPACKET socketpairs standing in for the manager's queues. What
 * ends a process runs in a forked child. Build and run through
 * t/12-worker-unit.t (under ASan/UBSan), or by hand:
 *   cc -std=gnu99 -g -Wall -Wextra -Werror -pthread -Isrc/shared -Isrc/worker -Isrc/manager -It/c \
 *      t/c/test_worker_signals.c $(perl inc/NarwhalLink.pm t/c/test_worker_signals.c \
 *      | cut -d' ' -f2-) -o /tmp/test_worker_signals && /tmp/test_worker_signals
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "nw_frame.h"
#include "nw_scoreboard.h"
#include "nw_worker.h"
#include "nw_worker_signals.h"
#include "loopback.h"
#include "tap.h"
#include "worker_test.h"

#define WAIT_MS 2000    /* the longest a step that must happen is waited for */



/* What s reads until end-of-stream (or WAIT_MS), NUL-terminated in buf. */
static size_t read_all(int s, char *buf, size_t cap)
{
    size_t len = 0;
    struct pollfd p = { .fd = s, .events = POLLIN };
    while (len + 1 < cap && poll(&p, 1, WAIT_MS) == 1) {
        ssize_t r = read(s, buf + len, cap - 1 - len);
        if (r <= 0)
            break;
        len += (size_t)r;
    }
    buf[len] = 0;
    return len;
}

/* The next connection within WAIT_MS, or NULL. */
static nw_wconn *next_conn(nw_worker *w)
{
    nw_msec until = nw_now_ms() + WAIT_MS;
    nw_wconn *wc = NULL;
    while (!wc && nw_now_ms() < until)
        wc = nw_worker_next(w, 50);
    return wc;
}

static volatile sig_atomic_t behind_ran;

static void behind(int sig)
{
    (void)sig;
    behind_ran++;
}

/* ---------------------------------------------------------------- tests */

static void test_stop_sender(void)
{
    is(nw_worker_stop_sender(), -1, "no stop signal yet: -1");
    signal(SIGUSR1, behind);            /* the handler already there (Perl's) */
    nw_worker_note_stop_sender(SIGUSR1);
    nw_worker_note_stop_sender(0);      /* out of range: nothing */
    nw_worker_note_stop_sender(NSIG);
    behind_ran = 0;
    kill(getpid(), SIGUSR1);
    is(nw_worker_stop_sender(), getpid(), "a stop signal: its sender's pid is noted");
    is(behind_ran, 1, "and the signal goes on to the handler behind");
    signal(SIGUSR1, SIG_DFL);
}

static void test_rss_over(void)
{
    is(nw_worker_rss_over(UINT64_MAX / 2), 0, "under the memory limit: 0");
    ok(nw_worker_rss_over(1) > 1, "over it: the resident size in KiB");
    is(nw_worker_rss_over(1), 0, "asked again at once: not looked at again yet");
}

static void test_watchdog_first_signal(void)
{
    signal(SIGUSR2, behind);
    nw_worker_watchdog_arm(SIGUSR2, NULL, NULL, NULL);
    behind_ran = 0;
    raise(SIGUSR2);
    is(behind_ran, 1, "the watchdog's first signal goes on to the handler behind");
    nw_worker_watchdog_rearm();
    raise(SIGUSR2);
    is(behind_ran, 2, "re-armed: the next one is a first again");
    nw_worker_watchdog_rearm();
    is(nw_worker_watchdog_reply(), 0, "no request running: no 504");
}

static void test_watchdog_reply(void)
{
    nw_conn_config c = test_worker_config();
    nw_score_slot slot;
    memset(&slot, 0, sizeof slot);
    slot.state = NW_WORKER_BUSY;
    nw_worker_watchdog_arm(SIGUSR2, &slot, NULL, NULL);
    nw_worker *w = nw_worker_new(&c, 0, -1, -1, NULL);
    if (!w || nw_worker_listen(w, dup(g_listener), 1) < 0)
        die("nw_worker_new");
    nw_worker_start(w);
    int s = client();
    nw_wconn *wc = next_conn(w);
    if (!ok(wc != NULL, "watchdog: a client"))
        return;
    nw_wconn_request_started(wc);
    ok(nw_wconn_serving() == wc, "its request runs: it is the one being served");
    is(nw_worker_watchdog_reply(), 1, "the watchdog answers it");
    char buf[1024];
    read_all(s, buf, sizeof buf);
    ok(strncmp(buf, "HTTP/1.1 504 ", 13) == 0 && strstr(buf, "Connection: close\r\n"),
       "the client gets a 504 with Connection: close, then end-of-stream");
    is(slot.counts.by_class[4], 1, "counted on the slot as a 5xx");
    is(slot.exit_reason, NW_EXIT_WATCHDOG, "the slot says the watchdog ends the worker");
    is(slot.state, NW_WORKER_STOPPING, "and that it is stopping");
    nw_worker_release(w, wc, NW_RELEASE_CLOSE);
    ok(nw_wconn_serving() == NULL, "released: nothing is being served");
    is(nw_worker_watchdog_reply(), 0, "and the watchdog has nothing to answer");
    nw_wconn_free(wc);
    close(s);

    /* A response already begun: no 504 in its middle, only the end. */
    s = client();
    wc = next_conn(w);
    if (!ok(wc != NULL, "watchdog: another client"))
        return;
    nw_wconn_request_started(wc);
    wc->c->responded = 1;
    is(nw_worker_watchdog_reply(), 0, "a response begun: no 504");
    is(read_all(s, buf, sizeof buf), 0, "the client sees end-of-stream only");
    close(s);                   /* (as a client does: the release's lingering close ends then) */
    nw_worker_release(w, wc, NW_RELEASE_CLOSE);
    nw_wconn_free(wc);
    int lfd = w->sources.listener[0].fd;
    nw_worker_free(w);
    close(lfd);
    nw_worker_watchdog_arm(SIGUSR2, NULL, NULL, NULL);
}

/* The child of the two tests below: a worker with the manager's queues
 * (the parent holds their other ends) parks the parent's client, goes out
 * as if to serve a request, and is then ended by `end`. */
static int g_last_words[2] = { -1, -1 };

static void last_words(void *arg)
{
    (void)arg;
    (void)write(g_last_words[1], "!", 1);
}

static void child_parks_then(int serve_fd, int handoff_fd, void (*end)(nw_worker *))
{
    nw_conn_config c = test_worker_config();
    nw_worker *w = nw_worker_new(&c, 30, serve_fd, handoff_fd, NULL);
    if (!w || nw_worker_listen(w, dup(g_listener), 1) < 0)
        _exit(3);
    nw_worker_start(w);
    nw_worker_enter(w);
    nw_wconn *wc = next_conn(w);
    if (!wc || nw_worker_release(w, wc, NW_RELEASE_KEEPALIVE) != NW_RELEASE_PARKED)
        _exit(4);
    nw_worker_leave(w);             /* out serving: the parked set is not changing */
    end(w);
    _exit(5);                       /* (not reached) */
}

static void end_by_crash(nw_worker *w)
{
    (void)w;
    nw_worker_hand_off_on_crash();
    raise(SIGABRT);
}

static void end_by_watchdog(nw_worker *w)
{
    (void)w;
    dup2(g_last_words[1], 2);       /* its line in the error log, for the parent */
    signal(SIGUSR2, SIG_IGN);
    nw_worker_watchdog_rearm();
    nw_worker_watchdog_arm(SIGUSR2, NULL, last_words, NULL);
    raise(SIGUSR2);                 /* the first: passed on (ignored) */
    raise(SIGUSR2);                 /* the second: the last resort */
}

/* Runs child_parks_then(end) in a child; returns its wait status, and
 * whether the parked connection reached the manager's end of the handoff
 * queue and is still the client's. */
static int run_child(void (*end)(nw_worker *), int *handed_off)
{
    int serve[2], handoff[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK, 0, serve) < 0
        || socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK, 0, handoff) < 0)
        die("socketpair");
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0)
        die("fork");
    if (pid == 0) {
        close(serve[0]);
        close(handoff[0]);
        child_parks_then(serve[1], handoff[1], end);
    }
    close(serve[1]);
    close(handoff[1]);
    int s = client();
    int status = 0;
    waitpid(pid, &status, 0);
    *handed_off = 0;
    struct pollfd p = { .fd = handoff[0], .events = POLLIN };
    nw_frame f;
    char *data = malloc(NW_FRAME_MAX_DATA);
    int fd = -1;
    /* (a CUSTODY frame first: the parked connection's copy, let go here) */
    while (data && poll(&p, 1, WAIT_MS) == 1
           && nw_frame_recv(handoff[0], &f, data, NW_FRAME_MAX_DATA, &fd) == 1
           && f.type == NW_FRAME_CUSTODY && fd >= 0) {
        close(fd);
        fd = -1;
    }
    if (fd >= 0) {
        char byte = 0;
        *handed_off = f.type == NW_FRAME_HANDOFF && write(s, "x", 1) == 1
                      && read(fd, &byte, 1) == 1 && byte == 'x';
    }
    if (fd >= 0)
        close(fd);
    free(data);
    close(s);
    close(serve[0]);
    close(handoff[0]);
    return status;
}

static void test_crash(void)
{
    int handed_off;
    int status = run_child(end_by_crash, &handed_off);
    ok(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT,
       "a crash: the signal's default action follows the handler");
    if (!WIFSIGNALED(status))
        diag("the child exited with %d", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    ok(handed_off, "and the parked connection went to the manager first");
}

static void test_watchdog_last_resort(void)
{
    int handed_off;
    char said[1024];
    if (pipe(g_last_words) < 0)
        die("pipe");
    int status = run_child(end_by_watchdog, &handed_off);
    ok(WIFEXITED(status) && WEXITSTATUS(status) == NW_WORKER_EXIT_WATCHDOG,
       "the watchdog's second signal: the worker exits with NW_WORKER_EXIT_WATCHDOG");
    close(g_last_words[1]);
    size_t len = read_all(g_last_words[0], said, sizeof said);
    ok(strstr(said, "error: the request watchdog found the app outside Perl") != NULL,
       "it says why in the error log");
    ok(len > 0 && said[len - 1] == '!', "then its last words run");
    close(g_last_words[0]);
    ok(handed_off, "and with its parked connection handed to the manager");
}

int main(void)
{
    alarm(60);
    signal(SIGPIPE, SIG_IGN);
    listen_once();
    test_stop_sender();
    test_rss_over();
    test_watchdog_first_signal();
    test_watchdog_reply();
    test_crash();
    test_watchdog_last_resort();
    close(g_listener);
    return done_testing();
}
