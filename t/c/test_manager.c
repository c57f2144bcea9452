/* Tests of the connection manager (src/nw_manager.c, through the
 * narwhal-manager executable), printing TAP. This program plays the master
 * (the control socket on the manager's fd 3) and the workers (real
 * SOCK_SEQPACKET channels), with real TCP clients on 127.0.0.1.
 * Every wait is bounded. Build and run through t/05-manager-unit.t, or:
 *
 *   cc -std=gnu99 -g -O1 -Wall -Wextra -Werror -fsanitize=address,undefined \
 *      -Isrc -o /tmp/narwhal-manager src/manager/narwhal-manager.c \
 *      src/nw_manager.c src/nw_frame.c src/nw_io.c
 *   cc -std=gnu99 -g -O1 -Wall -Wextra -Werror -fsanitize=address,undefined \
 *      -Isrc -It/c -o /tmp/test_manager t/c/test_manager.c src/nw_frame.c src/nw_io.c
 *   /tmp/test_manager /tmp/narwhal-manager
 *
 * With "--measure N" after the binary it prints, instead of tests, the
 * manager's resident memory per idle connection with N of them held. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "nw_frame.h"
#include "nw_io.h"
#include "tap.h"

#define REQ_A "GET /a HTTP/1.1\r\nHost: x\r\n\r\n"
#define RESP_408 "HTTP/1.1 408 Request Timeout\r\nContent-Type: text/plain\r\n" \
                 "Content-Length: 20\r\nConnection: close\r\n\r\n408 Request Timeout\n"
#define MANY 2000

static const char *g_bin;
static int g_listen = -1;
static struct sockaddr_in g_addr;

static void sleep_ms(int ms)
{
    struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static void die(const char *what)
{
    printf("Bail out! %s: %s\n", what, strerror(errno));
    exit(2);
}

/* ------------------------------------------------------------ the manager */

typedef struct {
    pid_t pid;
    int ctl;            /* our end of the control socket */
    int status;         /* wait status once reaped */
    char errpath[64];   /* its stderr */
} mgr_t;

static void mgr_start(mgr_t *m, const char *const *opts)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
        die("socketpair");
    snprintf(m->errpath, sizeof m->errpath, "/tmp/nw-manager-err-XXXXXX");
    int efd = mkostemp(m->errpath, O_CLOEXEC);
    if (efd < 0)
        die("mkostemp");
    fflush(stdout);
    m->pid = fork();
    if (m->pid < 0)
        die("fork");
    if (m->pid == 0) {
        char *argv[32];
        int n = 0;
        argv[n++] = (char *)g_bin;
        while (opts && *opts && n < 31)
            argv[n++] = (char *)*opts++;
        argv[n] = NULL;
        if (sv[1] == 3)
            fcntl(3, F_SETFD, 0);
        else
            dup2(sv[1], 3);
        dup2(efd, 2);
        execv(g_bin, argv);
        _exit(127);
    }
    close(sv[1]);
    close(efd);
    m->ctl = sv[0];
    m->status = -1;
}

/* Reap within timeout_ms. 1: exited (m->status set), 0: still running. */
static int mgr_reap(mgr_t *m, int timeout_ms)
{
    nw_msec end = nw_now_ms() + timeout_ms;
    for (;;) {
        int st;
        pid_t r = waitpid(m->pid, &st, WNOHANG);
        if (r == m->pid) {
            m->status = st;
            return 1;
        }
        if (nw_now_ms() >= end)
            return 0;
        sleep_ms(5);
    }
}

static int exited_zero(int st)
{
    return st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

/* Closes the control socket (unless closed), reaps the manager and checks
 * its exit status and that its stderr has no sanitizer report. */
static void mgr_finish(mgr_t *m, const char *name)
{
    char msg[160], log[8192];
    if (m->ctl >= 0)
        close(m->ctl);
    m->ctl = -1;
    if (m->status < 0 && !mgr_reap(m, 5000)) {
        kill(m->pid, SIGKILL);
        mgr_reap(m, 5000);
    }
    snprintf(msg, sizeof msg, "%s: manager exited with status 0", name);
    if (!ok(exited_zero(m->status), msg))
        diag("wait status %d", m->status);
    FILE *f = fopen(m->errpath, "r");
    size_t n = f ? fread(log, 1, sizeof log - 1, f) : 0;
    log[n] = 0;
    if (f)
        fclose(f);
    unlink(m->errpath);
    snprintf(msg, sizeof msg, "%s: no sanitizer report from the manager", name);
    if (!ok(!strstr(log, "Sanitizer") && !strstr(log, "runtime error"), msg))
        diag("manager stderr:\n%s", log);
}

/* ------------------------------------------------------------ frames */

static int wait_fd(int fd, short events, int timeout_ms)
{
    struct pollfd p = { .fd = fd, .events = events };
    int r;
    do {
        r = poll(&p, 1, timeout_ms);
    } while (r < 0 && errno == EINTR);
    return r > 0;
}

/* Send one frame, waiting (bounded) while the channel is full. */
static int send_frame(int sock, int type, int fd, uint32_t requests, int32_t deadline,
                      uint32_t flags, const char *data, size_t len)
{
    nw_frame f;
    nw_frame_init(&f, type);
    f.requests = requests;
    f.deadline_ms = deadline;
    f.flags = flags;
    f.listener = 1;
    f.data_len = (uint32_t)len;
    nw_msec end = nw_now_ms() + 5000;
    for (;;) {
        if (nw_frame_send(sock, &f, data, fd) == 0)
            return 0;
        if (errno != EAGAIN || nw_now_ms() >= end)
            return -1;
        wait_fd(sock, POLLOUT, 100);
    }
}

/* Receive one frame within timeout_ms: 1 frame, 0 end of stream, -1 none. */
static int recv_frame(int sock, nw_frame *f, char *buf, size_t cap, int *fd, int timeout_ms)
{
    nw_msec end = nw_now_ms() + timeout_ms;
    *fd = -1;
    for (;;) {
        int r = nw_frame_recv(sock, f, buf, cap, fd);
        if (r >= 0)
            return r;
        nw_msec left = end - nw_now_ms();
        if (errno != EAGAIN || left <= 0)
            return -1;
        wait_fd(sock, POLLIN, (int)left);
    }
}

static int g_handoffs;   /* HANDOFF frames sent to the current manager */

/* Hand a connection to the manager the way a worker does: frame, then
 * close our copy. */
static void handoff(int wch, int server, uint32_t requests, int32_t deadline,
                    uint32_t flags, const char *data)
{
    if (send_frame(wch, NW_FRAME_HANDOFF, server, requests, deadline, flags,
                   data, data ? strlen(data) : 0) != 0)
        die("send HANDOFF");
    close(server);
    g_handoffs++;
}

static void ready(int wch)
{
    if (send_frame(wch, NW_FRAME_READY, -1, 0, -1, 0, NULL, 0) != 0)
        die("send READY");
}

/* A worker channel registered with the manager: returns the worker's end.
 * Like the master, we keep a copy of the manager's end open (*mend). */
static int add_worker(mgr_t *m, uint32_t pid, int *mend)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
        die("socketpair");
    if (send_frame(m->ctl, NW_FRAME_WORKER, sv[1], pid, -1, 0, NULL, 0) != 0)
        die("send WORKER");
    *mend = sv[1];
    return sv[0];
}

typedef struct {
    nw_frame f;
    int fd;
    char data[NW_FRAME_MAX_DATA + 1];
} serve_t;

static serve_t g_sv;

/* A SERVE on wch within timeout_ms? Its fd is left in g_sv.fd. */
static int got_serve(int wch, int timeout_ms)
{
    int r = recv_frame(wch, &g_sv.f, g_sv.data, NW_FRAME_MAX_DATA, &g_sv.fd, timeout_ms);
    if (r != 1)
        return 0;
    g_sv.data[g_sv.f.data_len] = 0;
    if (g_sv.f.type == NW_FRAME_SERVE && g_sv.fd >= 0)
        return 1;
    if (g_sv.fd >= 0)
        close(g_sv.fd);
    g_sv.fd = -1;
    return 0;
}

static void close_served(void)
{
    if (g_sv.fd >= 0)
        close(g_sv.fd);
    g_sv.fd = -1;
}

/* Next STATS frame on the control socket before end: 1, or 0. */
static int stats_next(mgr_t *m, nw_manager_stats *st, nw_msec end)
{
    nw_frame f;
    int fd;
    char buf[256];
    for (;;) {
        nw_msec left = end - nw_now_ms();
        if (left <= 0 || recv_frame(m->ctl, &f, buf, sizeof buf, &fd, (int)left) != 1)
            return 0;
        if (fd >= 0)
            close(fd);
        if (f.type == NW_FRAME_STATS && f.data_len == sizeof *st) {
            memcpy(st, buf, sizeof *st);
            return 1;
        }
    }
}

/* Wait (bounded) for a STATS frame for which cond holds. */
#define STATS_UNTIL(m, st, cond, ms) __extension__ ({                    \
    nw_msec stats_end_ = nw_now_ms() + (ms);                            \
    int stats_ok_ = 0;                                                  \
    while (stats_next((m), &(st), stats_end_))                          \
        if (cond) { stats_ok_ = 1; break; }                             \
    stats_ok_; })

static void diag_stats(const nw_manager_stats *s)
{
    diag("stats: idle %llu queued %llu handed_off %llu received %llu timeout %llu "
         "full %llu peer %llu workers %llu free %llu",
         (unsigned long long)s->idle, (unsigned long long)s->queued,
         (unsigned long long)s->handed_off, (unsigned long long)s->received,
         (unsigned long long)s->closed_timeout, (unsigned long long)s->closed_full,
         (unsigned long long)s->closed_peer, (unsigned long long)s->workers,
         (unsigned long long)s->free_workers);
}

/* ------------------------------------------------------------ TCP */

static void listener_open(void)
{
    socklen_t len = sizeof g_addr;
    g_listen = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (g_listen < 0)
        die("socket");
    memset(&g_addr, 0, sizeof g_addr);
    g_addr.sin_family = AF_INET;
    g_addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(g_listen, (struct sockaddr *)&g_addr, sizeof g_addr) != 0
        || listen(g_listen, 4096) != 0
        || getsockname(g_listen, (struct sockaddr *)&g_addr, &len) != 0)
        die("listen on 127.0.0.1");
}

/* A connected pair: *client is ours, *server goes to the manager. */
static void tcp_pair(int *client, int *server)
{
    int one = 1;
    *client = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (*client < 0 || connect(*client, (struct sockaddr *)&g_addr, sizeof g_addr) != 0)
        die("connect");
    setsockopt(*client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    *server = accept4(g_listen, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (*server < 0)
        die("accept");
}

static void put(int fd, const char *s)
{
    if (send(fd, s, strlen(s), MSG_NOSIGNAL) != (ssize_t)strlen(s))
        die("send to the client socket");
}

/* Read until end of stream (or a reset) within timeout_ms. Returns the ms
 * it took, or -1. Bytes read before it go to buf (NUL-terminated). */
static long read_to_eof(int fd, char *buf, size_t cap, int timeout_ms)
{
    nw_msec start = nw_now_ms(), end = start + timeout_ms;
    size_t got = 0;
    for (;;) {
        nw_msec left = end - nw_now_ms();
        if (left <= 0 || !wait_fd(fd, POLLIN, (int)left)) {
            if (buf)
                buf[got] = 0;
            return -1;
        }
        char tmp[4096];
        ssize_t n = recv(fd, tmp, sizeof tmp, MSG_DONTWAIT);
        if (n > 0) {
            size_t k = buf && got < cap - 1 ? (size_t)n : 0;
            if (k > cap - 1 - got)
                k = cap - 1 - got;
            if (k)
                memcpy(buf + got, tmp, k);
            got += k;
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
            continue;
        if (buf)
            buf[got] = 0;
        return (long)(nw_now_ms() - start);
    }
}

/* Still open and silent: nothing to read, no end of stream. */
static int still_open(int fd)
{
    return !wait_fd(fd, POLLIN, 0);
}

/* The manager's CPU time (user + system) in clock ticks. */
static long cpu_ticks(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    unsigned long ut, st;
    if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
        return -1;
    return (long)(ut + st);
}

static long rss_kib(pid_t pid)
{
    char path[64], line[256];
    long kib = -1;
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %ld", &kib) == 1)
            break;
    fclose(f);
    return kib;
}

/* The kernel's slab memory, system-wide (sockets, epoll items, files). */
static long slab_kib(void)
{
    char line[256];
    long kib = -1;
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f)
        return -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "Slab: %ld", &kib) == 1)
            break;
    fclose(f);
    return kib;
}

/* ------------------------------------------------------------ tests */

static void test_arguments(void)
{
    static const char *const bad[][3] = {
        { "--read-timeout", "soon", NULL },
        { "--max-connections", "-1", NULL },
        { "--no-such-option", NULL, NULL },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        mgr_t m;
        char name[96];
        mgr_start(&m, bad[i]);
        close(m.ctl);
        snprintf(name, sizeof name, "bad option %s %s: exit status 2", bad[i][0],
                 bad[i][1] ? bad[i][1] : "");
        int reaped = mgr_reap(&m, 5000);
        if (!reaped) {
            kill(m.pid, SIGKILL);
            mgr_reap(&m, 5000);
        }
        ok(reaped && WIFEXITED(m.status) && WEXITSTATUS(m.status) == 2, name);
        unlink(m.errpath);
    }
}

/* Hand-offs, serving, the queue, limits, malformed frames, worker loss,
 * counts, and exit when the master goes away. */
static void test_serving(void)
{
    static const char *const opts[] = { "--keepalive-timeout", "10", "--read-timeout", "10",
        "--max-header-bytes", "4096", "--max-request-line", "1024", "--max-connections", "100",
        NULL };
    mgr_t m;
    nw_manager_stats st;
    char buf[8192];
    int c, s, c2, s2, m1, m2, served = 0;

    g_handoffs = 0;
    mgr_start(&m, opts);
    int w1 = add_worker(&m, 1001, &m1);
    int w2 = add_worker(&m, 1002, &m2);
    ok(STATS_UNTIL(&m, st, st.workers == 2 && st.free_workers == 0, 3000),
       "WORKER frames register two workers (STATS within a second or so)");

    /* An idle connection, then its request. */
    tcp_pair(&c, &s);
    handoff(w1, s, 3, -1, 0, NULL);
    ready(w1);
    sleep_ms(50);
    put(c, REQ_A);
    ok(got_serve(w1, 3000), "idle hand-off + request: SERVE on the worker that sent READY");
    served++;
    is(g_sv.f.requests, 3, "SERVE carries the requests count of the HANDOFF");
    is(g_sv.f.listener, 1, "SERVE carries the listener of the HANDOFF");
    is(g_sv.f.deadline_ms, -1, "SERVE carries no deadline");
    is_str(g_sv.data, g_sv.f.data_len, REQ_A, "SERVE carries the request bytes");
    put(g_sv.fd, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
    close_served();
    shutdown(c, SHUT_WR);
    ok(read_to_eof(c, buf, sizeof buf, 2000) >= 0
       && strstr(buf, "200 OK") && strstr(buf, "\r\n\r\nok"),
       "the fd in SERVE is the client's connection");
    close(c);
    ok(!wait_fd(w2, POLLIN, 0), "nothing went to the worker that sent no READY");

    /* A partial head in the HANDOFF, the rest later. */
    tcp_pair(&c, &s);
    ready(w1);
    handoff(w1, s, 7, 5000, NW_FRAME_F_HEAD_STARTED, "GET /b HTTP/1.1\r\nHo");
    ok(!got_serve(w1, 200), "partial head in HANDOFF: no SERVE yet");
    put(c, "st: x\r\n\r\n");
    ok(got_serve(w1, 3000), "partial head + the rest: SERVE");
    served++;
    is_str(g_sv.data, g_sv.f.data_len, "GET /b HTTP/1.1\r\nHost: x\r\n\r\n",
           "SERVE has the head's two parts joined");
    is(g_sv.f.requests, 7, "... and the requests count");
    close_served();
    close(c);

    /* Pipelined: the HANDOFF already holds a complete head. */
    tcp_pair(&c, &s);
    ready(w1);
    handoff(w1, s, 1, -1, 0, "GET /c HTTP/1.1\r\nHost: x\r\n\r\nGET /d HTTP/1.1\r\n");
    ok(got_serve(w1, 1000), "a complete head in HANDOFF is served at once");
    served++;
    is_str(g_sv.data, g_sv.f.data_len,
           "GET /c HTTP/1.1\r\nHost: x\r\n\r\nGET /d HTTP/1.1\r\n",
           "... with every byte, the pipelined rest too");
    close_served();
    close(c);

    /* A head in pieces, after a blank line, the end split across reads. */
    tcp_pair(&c, &s);
    ready(w1);
    handoff(w1, s, 2, -1, 0, NULL);
    put(c, "\r\n");
    ok(!got_serve(w1, 150), "a blank line alone is not a head");
    put(c, "GET /e HTTP/1.1\r\n");
    sleep_ms(40);
    put(c, "Host: x\r\n\r");
    ok(!got_serve(w1, 100), "no SERVE before the head's last byte");
    put(c, "\n");
    ok(got_serve(w1, 3000), "a head arriving in pieces: SERVE");
    served++;
    is_str(g_sv.data, g_sv.f.data_len, "GET /e HTTP/1.1\r\nHost: x\r\n\r\n",
           "... with the pieces joined, the leading blank line dropped");
    close_served();
    close(c);

    /* No free worker: queued (FIFO), served when READY comes. */
    tcp_pair(&c, &s);
    tcp_pair(&c2, &s2);
    handoff(w1, s, 4, -1, 0, NULL);
    handoff(w1, s2, 5, -1, 0, NULL);
    put(c, "GET /q1 HTTP/1.1\r\n\r\n");
    sleep_ms(50);
    put(c2, "GET /q2 HTTP/1.1\r\n\r\n");
    ok(!got_serve(w1, 300) && !got_serve(w2, 0), "no READY: heads are not sent");
    ok(STATS_UNTIL(&m, st, st.queued == 2, 3000), "STATS counts two queued heads");
    ready(w2);
    ok(got_serve(w2, 2000), "READY: the queued connection is served at once");
    served++;
    is_str(g_sv.data, g_sv.f.data_len, "GET /q1 HTTP/1.1\r\n\r\n", "... the oldest first");
    is(g_sv.f.requests, 4, "... with its own requests count");
    close_served();
    ok(!got_serve(w2, 100), "one READY, one SERVE");
    ready(w2);
    ready(w2);   /* twice: a worker is on the free stack once */
    ok(got_serve(w2, 2000), "next READY: the second queued connection");
    served++;
    is_str(g_sv.data, g_sv.f.data_len, "GET /q2 HTTP/1.1\r\n\r\n", "... in order");
    close_served();
    close(c);
    close(c2);
    tcp_pair(&c, &s);
    handoff(w1, s, 0, -1, 0, "GET /once HTTP/1.1\r\n\r\n");
    ok(got_serve(w2, 2000), "the second READY left the worker free");
    served++;
    close_served();
    close(c);
    tcp_pair(&c, &s);
    handoff(w1, s, 0, -1, 0, "GET /twice HTTP/1.1\r\n\r\n");
    ok(!got_serve(w2, 150), "... but only once: two READYs in a row free a worker once");
    ready(w1);
    ok(got_serve(w1, 2000), "... and the head waits for the next READY");
    served++;
    is_str(g_sv.data, g_sv.f.data_len, "GET /twice HTTP/1.1\r\n\r\n", "... which gets it");
    close_served();
    close(c);

    /* Over the limits: the worker gets it to answer 414 / 431. */
    tcp_pair(&c, &s);
    handoff(w1, s, 0, -1, 0, NULL);
    memset(buf, 'a', 1500);
    memcpy(buf, "GET /", 5);
    buf[1500] = 0;
    put(c, buf);
    ok(!got_serve(w1, 100), "no free worker: the long line waits");
    ready(w1);
    ok(got_serve(w1, 3000) && g_sv.f.data_len > 1024 && !memchr(g_sv.data, '\n', g_sv.f.data_len),
       "a request line over --max-request-line without LF goes to a worker (414)");
    served++;
    close_served();
    close(c);
    tcp_pair(&c, &s);
    ready(w1);
    handoff(w1, s, 0, -1, 0, NULL);
    put(c, "GET / HTTP/1.1\r\n");
    for (int i = 0; i < 60; i++)
        put(c, "X-Filler: 0123456789012345678901234567890123456789012345678901234567890123456789\r\n");
    ok(got_serve(w1, 3000) && g_sv.f.data_len > 4096,
       "a head over --max-header-bytes goes to a worker (431)");
    served++;
    close_served();
    close(c);

    /* Malformed frames are dropped; the manager carries on. */
    tcp_pair(&c, &s);
    {
        char junk[24] = "this is not a frame...";
        union { char b[CMSG_SPACE(sizeof(int))]; struct cmsghdr a; } cm;
        struct iovec iov = { junk, sizeof junk };
        struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1,
                              .msg_control = cm.b, .msg_controllen = sizeof cm.b };
        struct cmsghdr *h = CMSG_FIRSTHDR(&msg);
        memset(&cm, 0, sizeof cm);
        h->cmsg_level = SOL_SOCKET;
        h->cmsg_type = SCM_RIGHTS;
        h->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(h), &s, sizeof s);
        ok(sendmsg(w1, &msg, MSG_NOSIGNAL) == (ssize_t)sizeof junk, "sent a frame with bad magic and an fd");
        close(s);
        ok(send(m.ctl, junk, 10, 0) == 10, "sent a short frame on control");
    }
    ok(read_to_eof(c, NULL, 0, 2000) >= 0, "the fd of a malformed frame is closed");
    close(c);
    tcp_pair(&c, &s);
    handoff(w1, s, 9, -1, 0, "GET /after HTTP/1.1\r\n\r\n");
    ready(w1);
    ok(got_serve(w1, 3000) && g_sv.f.requests == 9, "after malformed frames the manager still serves");
    served++;
    close_served();
    close(c);

    /* A worker channel ends (its worker died) while on the free stack. */
    ready(w2);
    sleep_ms(50);
    close(w2);
    ok(STATS_UNTIL(&m, st, st.workers == 1 && st.free_workers == 0, 3000),
       "worker channel EOF: the worker is forgotten (STATS workers=1, free=0)");
    {
        long t0 = cpu_ticks(m.pid);
        sleep_ms(300);
        long t1 = cpu_ticks(m.pid);
        ok(t0 >= 0 && t1 - t0 <= 5, "the manager is quiet after it (no spinning on a dead channel)");
        if (t0 < 0 || t1 - t0 > 5)
            diag("cpu ticks over 300 ms: %ld", t1 - t0);
    }
    tcp_pair(&c, &s);
    handoff(w1, s, 0, -1, 0, "GET /w HTTP/1.1\r\n\r\n");
    ready(w1);
    ok(got_serve(w1, 3000), "a remaining worker serves");
    served++;
    close_served();
    close(c);

    /* Counts. */
    int idle_c, gone_c;
    tcp_pair(&idle_c, &s);
    handoff(w1, s, 0, -1, 0, NULL);
    tcp_pair(&gone_c, &s);
    handoff(w1, s, 0, -1, 0, NULL);
    sleep_ms(50);
    close(gone_c);
    ok(STATS_UNTIL(&m, st, st.closed_peer == 1 && st.idle == 1, 3000),
       "STATS: a client that closes is counted, one connection held");
    if (!ok(st.received == (uint64_t)g_handoffs && st.handed_off == (uint64_t)served
            && st.closed_timeout == 0 && st.closed_full == 0 && st.queued == 0
            && st.workers == 1, "STATS: received, handed_off and the rest add up"))
        diag("handoffs sent %d, serves seen %d", g_handoffs, served);
    diag_stats(&st);

    /* The master goes away. */
    close(m.ctl);
    m.ctl = -1;
    ok(mgr_reap(&m, 3000), "control EOF: the manager exits");
    ok(read_to_eof(idle_c, NULL, 0, 1000) >= 0, "... closing the connections it held");
    close(idle_c);
    close(w1);
    close(m1);
    close(m2);
    mgr_finish(&m, "control EOF");
}

/* Idle and read deadlines, 408, and SIGTERM. */
static void test_deadlines(void)
{
    static const char *const opts[] = { "--keepalive-timeout", "0.5", "--read-timeout", "0.8",
                                        NULL };
    mgr_t m;
    nw_manager_stats st;
    char buf[1024];
    int cx, cy, cz, c, s, m1;

    mgr_start(&m, opts);
    int w1 = add_worker(&m, 2001, &m1);

    tcp_pair(&cx, &s);
    nw_msec t0 = nw_now_ms();
    handoff(w1, s, 0, -1, 0, NULL);
    tcp_pair(&cy, &s);
    handoff(w1, s, 0, 200, 0, NULL);
    long ty = read_to_eof(cy, NULL, 0, 3000);
    long tx = read_to_eof(cx, NULL, 0, 3000);
    if (tx >= 0)
        tx = (long)(nw_now_ms() - t0);
    ok(ty >= 150 && ty <= 900, "HANDOFF with 200 ms left: closed after about 200 ms");
    ok(tx >= 450 && tx <= 1500, "idle connection closed after --keepalive-timeout (0.5 s)");
    diag("idle closes after %ld ms (200 ms left) and %ld ms (0.5 s timeout)", ty, tx);
    close(cx);
    close(cy);

    /* A head started later than the hand-off gets the read timeout from its
     * first byte, not the idle one; then a 408. */
    tcp_pair(&cz, &s);
    handoff(w1, s, 0, -1, 0, NULL);
    sleep_ms(300);
    put(cz, "GET /slow HTTP/1.1\r\n");
    long tz = read_to_eof(cz, buf, sizeof buf, 3000);
    ok(tz >= 700 && tz <= 1800, "slow head: closed after --read-timeout (0.8 s) from its first byte");
    is_str(buf, strlen(buf), RESP_408, "slow head: the client gets a 408");
    diag("slow head closed %ld ms after its first byte", tz);
    close(cz);

    /* HEAD_STARTED with 100 ms left of the read timeout. */
    tcp_pair(&c, &s);
    handoff(w1, s, 0, 100, NW_FRAME_F_HEAD_STARTED, "GET / HTT");
    long tc = read_to_eof(c, buf, sizeof buf, 3000);
    ok(tc >= 50 && tc <= 900, "HANDOFF with HEAD_STARTED and 100 ms left: 408 after about 100 ms");
    is_str(buf, strlen(buf), RESP_408, "... a full 408 response");
    close(c);
    ok(STATS_UNTIL(&m, st, st.closed_timeout == 4 && st.idle == 0, 3000),
       "STATS: four closed by timeout, none held");
    diag_stats(&st);

    /* SIGTERM: close everything, exit 0, promptly. */
    tcp_pair(&c, &s);
    handoff(w1, s, 0, -1, 0, NULL);
    sleep_ms(30);
    nw_msec tk = nw_now_ms();
    kill(m.pid, SIGTERM);
    ok(read_to_eof(c, NULL, 0, 1000) >= 0 && nw_now_ms() - tk < 400,
       "SIGTERM: the connections it held get end-of-stream at once");
    close(c);   /* the manager lingers until its clients close, 1 s at most */
    ok(mgr_reap(&m, 2000) && exited_zero(m.status) && nw_now_ms() - tk < 900,
       "SIGTERM: the manager exits 0 once they have closed");
    close(w1);
    close(m1);
    mgr_finish(&m, "SIGTERM");
}

/* --max-connections: the longest idle goes first; if none is idle, the new one. */
static void test_full(void)
{
    static const char *const opts[] = { "--max-connections", "3", "--keepalive-timeout", "10",
                                        "--max-header-bytes", "1000000", NULL };
    mgr_t m;
    nw_manager_stats st;
    int c[5], s, m1;

    mgr_start(&m, opts);
    int w1 = add_worker(&m, 3001, &m1);

    /* A head bigger than a frame can carry goes to a worker at the frame limit. */
    tcp_pair(&c[0], &s);
    handoff(w1, s, 0, -1, 0, NULL);
    ready(w1);
    {
        static char big[NW_FRAME_MAX_DATA + 4096];
        memset(big, 'x', sizeof big - 1);
        memcpy(big, "GET / HTTP/1.1\r\nX: ", 19);
        big[sizeof big - 1] = 0;
        put(c[0], big);
    }
    ok(got_serve(w1, 3000) && g_sv.f.data_len == NW_FRAME_MAX_DATA,
       "a head longer than a frame goes to a worker at the frame size limit");
    close_served();
    close(c[0]);
    for (int i = 0; i < 4; i++) {
        tcp_pair(&c[i], &s);
        handoff(w1, s, 0, -1, 0, NULL);
        sleep_ms(10);
    }
    ok(read_to_eof(c[0], NULL, 0, 2000) >= 0, "full: the longest-idle connection is closed");
    ok(still_open(c[1]) && still_open(c[2]) && still_open(c[3]), "... and only that one");
    for (int i = 1; i < 4; i++)
        put(c[i], "GET / HTTP/1.1\r\n");   /* reading, no longer idle */
    sleep_ms(100);
    tcp_pair(&c[4], &s);
    handoff(w1, s, 0, -1, 0, NULL);
    ok(read_to_eof(c[4], NULL, 0, 2000) >= 0, "full and nothing idle: the new connection is closed");
    ok(still_open(c[1]) && still_open(c[2]) && still_open(c[3]), "... and the others kept");
    ok(STATS_UNTIL(&m, st, st.closed_full == 2 && st.idle == 3, 3000),
       "STATS: two closed to stay under --max-connections, three held");
    for (int i = 0; i < 5; i++)
        close(c[i]);
    close(w1);
    close(m1);
    mgr_finish(&m, "max-connections");
}

static int raise_nofile(size_t want)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return 0;
    if (rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
        getrlimit(RLIMIT_NOFILE, &rl);
    }
    return rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= want;
}

/* Hand off n idle connections; their client ends go to clients[]. */
static void handoff_many(int w, int *clients, int n)
{
    for (int i = 0; i < n; i++) {
        int s;
        tcp_pair(&clients[i], &s);
        handoff(w, s, 0, -1, 0, NULL);
    }
}

/* Many idle connections at once, all closed by their deadline. */
static void test_many(void)
{
    static const char *const opts[] = { "--keepalive-timeout", "1.5", NULL };
    static int cl[MANY];
    static struct pollfd pf[MANY];
    mgr_t m;
    nw_manager_stats st;
    int m1;

    if (!raise_nofile(MANY + 200)) {
        ok(1, "# SKIP RLIMIT_NOFILE too low for the many-connections test");
        return;
    }
    mgr_start(&m, opts);
    int w1 = add_worker(&m, 4001, &m1);
    nw_msec t0 = nw_now_ms();
    handoff_many(w1, cl, MANY);
    nw_msec t1 = nw_now_ms();
    diag("%d hand-offs took %lld ms", MANY, (long long)(t1 - t0));
    int open_now = 0;
    for (int i = 0; i < MANY; i++) {
        pf[i].fd = cl[i];
        pf[i].events = POLLIN;
        open_now += still_open(cl[i]);
    }
    ok(open_now == MANY, "2000 idle connections held at once");
    int left = MANY;
    nw_msec first = 0, end = t1 + 5000;
    while (left > 0 && nw_now_ms() < end) {
        if (poll(pf, MANY, 100) <= 0)
            continue;
        for (int i = 0; i < MANY; i++) {
            char b[64];
            if (pf[i].fd < 0 || !pf[i].revents)
                continue;
            if (recv(pf[i].fd, b, sizeof b, MSG_DONTWAIT) > 0)
                continue;
            if (!first)
                first = nw_now_ms();
            close(pf[i].fd);
            pf[i].fd = -1;
            left--;
        }
    }
    ok(left == 0, "... all closed by the keep-alive timeout");
    ok(first && first - t0 >= 1400, "... none before it");
    diag("first close %lld ms after the first hand-off, last %lld ms",
         (long long)(first - t0), (long long)(nw_now_ms() - t0));
    for (int i = 0; i < MANY; i++)
        if (pf[i].fd >= 0)
            close(pf[i].fd);
    ok(STATS_UNTIL(&m, st, st.closed_timeout == MANY && st.idle == 0 && st.received == MANY, 3000),
       "STATS: 2000 received, 2000 closed by timeout");
    close(w1);
    close(m1);
    mgr_finish(&m, "many idle connections");
}

/* --measure N: RSS of the manager per idle connection. */
static int measure(int n)
{
    static const char *const opts[] = { "--keepalive-timeout", "3600", NULL };
    mgr_t m;
    nw_manager_stats st;
    int m1;
    int *cl = calloc((size_t)n, sizeof *cl);

    if (!cl || !raise_nofile((size_t)n + 200)) {
        fprintf(stderr, "need %d fds\n", n + 200);
        return 2;
    }
    mgr_start(&m, opts);
    int w1 = add_worker(&m, 5001, &m1);
    handoff_many(w1, cl, 8);   /* warm up: first frames, first slab */
    STATS_UNTIL(&m, st, st.idle == 8, 3000);
    long before = rss_kib(m.pid), slab_before = slab_kib();
    handoff_many(w1, cl + 8, n - 8);
    if (!STATS_UNTIL(&m, st, st.idle == (uint64_t)n, 10000)) {
        fprintf(stderr, "the manager did not report %d idle connections\n", n);
        return 2;
    }
    long after = rss_kib(m.pid), slab_after = slab_kib();
    printf("manager RSS: %ld KiB with 8 idle connections, %ld KiB with %d: "
           "%.0f bytes per idle connection\n",
           before, after, n, (after - before) * 1024.0 / (n - 8));
    printf("kernel slab, system-wide (both ends of each TCP connection, epoll, "
           "files; noisy): %.0f bytes per connection\n",
           (slab_after - slab_before) * 1024.0 / (n - 8));
    for (int i = 0; i < n; i++)
        close(cl[i]);
    close(w1);
    close(m1);
    close(m.ctl);
    mgr_reap(&m, 5000);
    unlink(m.errpath);
    free(cl);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s path/to/narwhal-manager [--measure N]\n", argv[0]);
        return 2;
    }
    g_bin = argv[1];
    g_sv.fd = -1;
    signal(SIGPIPE, SIG_IGN);
    alarm(120);   /* a hang is a failure, not a stuck test run */
    listener_open();
    if (argc == 4 && strcmp(argv[2], "--measure") == 0)
        return measure(atoi(argv[3]));

    test_arguments();
    test_serving();
    test_deadlines();
    test_full();
    test_many();
    close(g_listen);
    return done_testing();
}
