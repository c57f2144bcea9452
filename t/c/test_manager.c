/* Tests of the connection manager (src/manager/nw_manager.c, through the
 * narwhal-manager executable), printing TAP. This program plays the master
 * (the control socket on the manager's fd 3, and a copy of every end it
 * passes, as the master keeps them) and the workers (the shared workers'
 * ends of to-manager, fd 4, where it writes HANDOFF frames, and of
 * to-workers, fd 5, where it reads SERVE frames), with real TCP clients on
 * 127.0.0.1. See docs/PROTOCOL.md. Every wait is bounded, and an alarm is
 * the backstop. Build and run through t/10-manager-unit.t, or:
 *
 *   cc -std=gnu99 -g -O1 -Wall -Wextra -Werror -fsanitize=address,undefined \
 *      -Isrc/shared -Isrc/worker -Isrc/manager -o /tmp/narwhal-manager $(perl inc/NarwhalLink.pm src/manager/narwhal-manager.c)
 *   cc -std=gnu99 -g -O1 -Wall -Wextra -Werror -fsanitize=address,undefined \
 *      -Isrc/shared -Isrc/worker -Isrc/manager -It/c -o /tmp/test_manager $(perl inc/NarwhalLink.pm t/c/test_manager.c)
 *   /tmp/test_manager /tmp/narwhal-manager
 *
 * With "--measure N" after the binary it prints, instead of tests, the
 * manager's resident memory per idle connection with N of them held;
 * with "--only GROUP,..." it runs those groups of tests only, and
 * "--groups" lists them. */
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
#include <sys/ioctl.h>
#include <linux/sockios.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <grp.h>
#include <time.h>
#include <unistd.h>

#include "nw_conn.h"
#include "nw_frame.h"
#include "nw_http.h"
#include "nw_io.h"
#include "nw_limits.h"
#include "tap.h"

#define REQ_A "GET /a HTTP/1.1\r\nHost: x\r\n\r\n"
#define RESP_408_STATUS "HTTP/1.1 408 Request Timeout\r\n"
#define RESP_408_REST "Content-Type: text/plain\r\n" \
                 "Content-Length: 20\r\nConnection: close\r\n\r\n408 Request Timeout\n"
#define MANY 2000
#define QMAX 2048       /* clients at most to fill to-workers */
#define QPAD 8000       /* bytes of padding in each of their heads */

static const char *g_bin;

/* 1 when got is the manager's whole 408: its status line, a Date of the
 * last few seconds (RFC 9110 6.6.1: the manager has a clock), the rest. */
static int is_408(const char *got, const char *name)
{
    char want[256];
    size_t sl = strlen(RESP_408_STATUS);
    memcpy(want, RESP_408_STATUS, sl);
    for (time_t t = time(NULL); t > time(NULL) - 5; t--) {
        size_t n = sl + nw_date_field(want + sl, t);
        memcpy(want + n, RESP_408_REST, sizeof RESP_408_REST);
        if (strcmp(got, want) == 0)
            return ok(1, name);
    }
    ok(0, name);
    diag("got: %s", got);
    return 0;
}
static int g_listen = -1;
static struct sockaddr_in g_addr;
static uint16_t g_listener_no = 1;   /* the listener index HANDOFF frames carry */

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

/* The master's three socketpairs. Ours: ctl (control), tom (the workers'
 * shared end of to-manager: HANDOFF frames go in), tow (the workers' shared
 * end of to-workers: SERVE frames come out). The manager's ends (its fds 3,
 * 4 and 5) are kept open here too, as the master keeps them, so frames in
 * flight outlive a manager and a new one can be started on them. */
typedef struct {
    pid_t pid;
    int ctl, mctl;
    int tom, mtom;
    int tow, mtow;
    int clk, mclk;      /* a test clock (mgr_start_clocked), or -1: ours and the manager's */
    nw_msec now;        /* ...the time on it, as the manager last answered */
    int status;         /* wait status once reaped; -1 before */
    char errpath[64];   /* its stderr */
    uid_t uid;          /* run it as this user, with... (0: as the test runs) */
    int nofile;         /* ...this open-file limit (0: the test's) */
} mgr_t;

static void pair(int *ours, int *theirs)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
        die("socketpair");
    *ours = sv[0];
    *theirs = sv[1];
}

static void mgr_open(mgr_t *m)
{
    memset(m, 0, sizeof *m);
    pair(&m->ctl, &m->mctl);
    pair(&m->tom, &m->mtom);
    pair(&m->tow, &m->mtow);
    m->clk = m->mclk = -1;
    m->pid = -1;
    m->status = -1;
}

/* Fork and exec the manager on the sockets of m: mctl, mtom and mtow
 * become its fds 3, 4 and 5, its stderr goes to a temp file. */
static void mgr_exec(mgr_t *m, const char *const *opts)
{
    snprintf(m->errpath, sizeof m->errpath, "/tmp/nw-manager-err-XXXXXX");
    int efd = mkostemp(m->errpath, O_CLOEXEC);
    if (efd < 0)
        die("mkostemp");
    fflush(stdout);
    m->status = -1;
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
        /* Via fds above 5 first, so no dup2 overwrites a source; dup2
         * leaves the new fds without FD_CLOEXEC, everything else has it. */
        int a = fcntl(m->mctl, F_DUPFD_CLOEXEC, 10);
        int b = fcntl(m->mtom, F_DUPFD_CLOEXEC, 10);
        int c = fcntl(m->mtow, F_DUPFD_CLOEXEC, 10);
        if (a < 0 || b < 0 || c < 0 || dup2(a, 3) != 3 || dup2(b, 4) != 4 || dup2(c, 5) != 5)
            _exit(126);
        /* a test clock: the manager's end as its fd 6 */
        unsetenv("NARWHAL_TEST_MANAGER_CLOCK_FD");
        if (m->mclk >= 0) {
            int d = fcntl(m->mclk, F_DUPFD_CLOEXEC, 10);
            if (d < 0 || dup2(d, 6) != 6)
                _exit(126);
            setenv("NARWHAL_TEST_MANAGER_CLOCK_FD", "6", 1);
        }
        dup2(efd, 2);
        struct rlimit rl = { (rlim_t)m->nofile, (rlim_t)m->nofile };
        if (m->nofile && setrlimit(RLIMIT_NOFILE, &rl) != 0)
            _exit(126);
        if (m->uid) {   /* (run through a descriptor opened first: its directory may be root's) */
            extern char **environ;
            int exe = open(g_bin, O_RDONLY | O_CLOEXEC);
            if (exe < 0 || setgroups(0, NULL) != 0 || setgid(m->uid) != 0 || setuid(m->uid) != 0)
                _exit(126);
            fexecve(exe, argv, environ);
            _exit(127);
        }
        execv(g_bin, argv);
        _exit(127);
    }
    close(efd);
}

static void mgr_start(mgr_t *m, const char *const *opts)
{
    mgr_open(m);
    mgr_exec(m, opts);
}

static void clock_advance(mgr_t *m, int ms);

/* A manager on a test clock (NARWHAL_TEST_MANAGER_CLOCK_FD): its time
 * stands still but for clock_advance, so that an expiry test steps over a
 * timeout instead of waiting it out, and sees the manager at a time of
 * its choosing (not whenever this process got the CPU). m->now: the time
 * on it. */
static void mgr_start_clocked(mgr_t *m, const char *const *opts)
{
    mgr_open(m);
    pair(&m->clk, &m->mclk);
    mgr_exec(m, opts);
    clock_advance(m, 0);
}

/* Reap within timeout_ms. 1: exited (m->status set), 0: still running. */
static int mgr_reap(mgr_t *m, int timeout_ms)
{
    nw_msec end = nw_now_ms() + timeout_ms;
    if (m->status >= 0)
        return 1;
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

/* Reaps the manager (killing it after 5 s), checks its exit status and that
 * its stderr has no sanitizer report. The sockets stay open. */
static void mgr_check(mgr_t *m, const char *name)
{
    char msg[160], log[8192];
    if (!mgr_reap(m, 5000)) {
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

static void close_fd(int *fd)
{
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
}

static void mgr_close(mgr_t *m)
{
    close_fd(&m->ctl);
    close_fd(&m->mctl);
    close_fd(&m->tom);
    close_fd(&m->mtom);
    close_fd(&m->tow);
    close_fd(&m->mtow);
    close_fd(&m->clk);
    close_fd(&m->mclk);
}

/* The master goes away: control EOF, then mgr_check, then every socket closed. */
static void mgr_finish(mgr_t *m, const char *name)
{
    close_fd(&m->ctl);
    mgr_check(m, name);
    mgr_close(m);
}

/* ------------------------------------------------------------ frames */

#define STATS_MS_TEXT "50"

static int wait_fd(int fd, short events, int timeout_ms)
{
    struct pollfd p = { .fd = fd, .events = events };
    int r;
    do {
        r = poll(&p, 1, timeout_ms);
    } while (r < 0 && errno == EINTR);
    return r > 0;
}

/* Move the test clock of m on by ms and wait (bounded) for the manager's
 * answer: it has then expired what is due by the new time (m->now). */
static void clock_advance(mgr_t *m, int ms)
{
    int64_t step = ms, now = 0;
    if (send(m->clk, &step, sizeof step, MSG_NOSIGNAL) != (ssize_t)sizeof step)
        die("send to the test clock");
    if (!wait_fd(m->clk, POLLIN, 5000) || recv(m->clk, &now, sizeof now, 0) != (ssize_t)sizeof now) {
        printf("Bail out! the manager did not answer its test clock\n");
        exit(2);
    }
    m->now = (nw_msec)now;
}

/* Wait (bounded) until the manager has read every frame sent on
 * to-manager (the unix socket's bytes not yet read are ours until then):
 * a clock advance sent after it comes after those hand-offs. */
static void handoffs_taken(mgr_t *m)
{
    nw_msec end = nw_now_ms() + 3000;
    int unread = 1;
    while (nw_now_ms() < end && ioctl(m->tom, SIOCOUTQ, &unread) == 0 && unread > 0)
        sleep_ms(1);
    if (unread > 0)
        diag("the manager has not read its HANDOFF frames after 3 s");
}

static void put(int fd, const char *s);

/* Send s on a TCP client and wait (bounded) until the kernel has it on the
 * manager's side (acknowledged): the manager is woken for it before a
 * clock advance sent after it. */
static void put_delivered(int fd, const char *s)
{
    put(fd, s);
    nw_msec end = nw_now_ms() + 3000;
    int unacked = 1;
    while (nw_now_ms() < end && ioctl(fd, SIOCOUTQ, &unacked) == 0 && unacked > 0)
        sleep_ms(1);
}

/* Send one frame, waiting (bounded) while the socket is full. */
static uint32_t g_ready_ms;  /* the ready_ms frames carry (HANDOFF: the head's start) */

static int send_frame(int sock, int type, int fd, uint32_t requests, int32_t deadline,
                      uint32_t flags, const char *data, size_t len)
{
    nw_frame f;
    nw_frame_init(&f, type);
    f.ready_ms = g_ready_ms;
    f.requests = requests;
    f.deadline_ms = deadline;
    f.flags = flags;
    f.listener = g_listener_no;
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

/* One message of raw bytes, with fd as SCM_RIGHTS unless fd < 0. */
static ssize_t send_raw(int sock, const void *bytes, size_t len, int fd)
{
    union { char b[CMSG_SPACE(sizeof(int))]; struct cmsghdr a; } cm;
    struct iovec iov = { (void *)bytes, len };
    struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
    if (fd >= 0) {
        memset(&cm, 0, sizeof cm);
        msg.msg_control = cm.b;
        msg.msg_controllen = sizeof cm.b;
        struct cmsghdr *h = CMSG_FIRSTHDR(&msg);
        h->cmsg_level = SOL_SOCKET;
        h->cmsg_type = SCM_RIGHTS;
        h->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(h), &fd, sizeof fd);
    }
    return sendmsg(sock, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
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

static int g_handoffs;   /* HANDOFF frames (with an fd) sent to the current manager */

/* Hand a connection to the manager the way a worker does: frame on the
 * shared to-manager socket, then close our copy. */
static void handoff(int tom, int server, uint32_t requests, int32_t deadline,
                    uint32_t flags, const char *data)
{
    if (send_frame(tom, NW_FRAME_HANDOFF, server, requests, deadline, flags,
                   data, data ? strlen(data) : 0) != 0)
        die("send HANDOFF");
    close(server);
    g_handoffs++;
}

typedef struct {
    nw_frame f;
    int fd;
    char data[NW_FRAME_MAX_DATA + 1];
} serve_t;

static serve_t g_sv;

/* A SERVE (with an fd) on to-workers within timeout_ms? Its fd is left in
 * g_sv.fd, its bytes in g_sv.data (NUL-terminated). Anything else read
 * there is a failure (and says so). */
static int got_serve(int tow, int timeout_ms)
{
    int r = recv_frame(tow, &g_sv.f, g_sv.data, NW_FRAME_MAX_DATA, &g_sv.fd, timeout_ms);
    if (r != 1)
        return 0;
    g_sv.data[g_sv.f.data_len] = 0;
    if (g_sv.f.type == NW_FRAME_SERVE && g_sv.fd >= 0)
        return 1;
    diag("to-workers carried a frame of type %d, fd %d: not a SERVE", g_sv.f.type, g_sv.fd);
    if (g_sv.fd >= 0)
        close(g_sv.fd);
    g_sv.fd = -1;
    return 0;
}

static void close_served(void)
{
    close_fd(&g_sv.fd);
}

/* Next STATS frame on the control socket before end: 1, or 0. */
static int stats_next(mgr_t *m, nw_manager_stats *st, nw_msec end)
{
    nw_frame f;
    int fd;
    char buf[256];
    for (;;) {
        nw_msec left = end - nw_now_ms();
        if (m->clk >= 0 && left > 0)
            clock_advance(m, atoi(STATS_MS_TEXT));   /* (its counts are due by then) */
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

/* Drop the frames already waiting on control: the counts to look at are
 * those sent from now on (they come every STATS_MS). */
static void stats_drain(mgr_t *m)
{
    nw_frame f;
    int fd;
    char buf[256];
    while (recv_frame(m->ctl, &f, buf, sizeof buf, &fd, 0) == 1)
        if (fd >= 0)
            close(fd);
}

/* Wait (bounded) for a STATS frame, sent from now on, for which cond holds. */
#define STATS_UNTIL(m, st, cond, ms) __extension__ ({                    \
    nw_msec stats_end_ = nw_now_ms() + (ms);                            \
    int stats_ok_ = 0;                                                  \
    stats_drain(m);                                                     \
    while (stats_next((m), &(st), stats_end_))                          \
        if (cond) { stats_ok_ = 1; break; }                             \
    stats_ok_; })

static void diag_stats(const nw_manager_stats *s)
{
    diag("stats: idle %llu queued %llu handed_off %llu received %llu timeout %llu "
         "full %llu peer %llu",
         (unsigned long long)s->idle, (unsigned long long)s->queued,
         (unsigned long long)s->handed_off, (unsigned long long)s->received,
         (unsigned long long)s->closed_timeout, (unsigned long long)s->closed_full,
         (unsigned long long)s->closed_peer);
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

/* The local (client) or the remote port of a TCP socket; -1 on error. */
static int port_of(int fd, int peer)
{
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    int r = peer ? getpeername(fd, (struct sockaddr *)&a, &len)
                 : getsockname(fd, (struct sockaddr *)&a, &len);
    return r == 0 && a.sin_family == AF_INET ? ntohs(a.sin_port) : -1;
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

/* A deadline on the test clock: open open_ms from now, just before it is
 * due, and ended due_ms later (what came until the end read into buf, as
 * read_to_eof does). True when both hold. */
static int open_then_ended(mgr_t *m, int fd, int open_ms, int due_ms, char *buf, size_t cap)
{
    clock_advance(m, open_ms);
    int open = still_open(fd);
    clock_advance(m, due_ms);
    return open && read_to_eof(fd, buf, cap, 1000) >= 0;
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

/* One test: the manager uses (almost) no CPU for 300 ms. */
static void quiet(mgr_t *m, const char *name)
{
    long t0 = cpu_ticks(m->pid);
    sleep_ms(300);
    long t1 = cpu_ticks(m->pid);
    if (!ok(t0 >= 0 && t1 - t0 <= 5, name))
        diag("cpu ticks over 300 ms: %ld", t1 - t0);
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
static void handoff_many(int tom, int *clients, int n)
{
    for (int i = 0; i < n; i++) {
        int s;
        tcp_pair(&clients[i], &s);
        handoff(tom, s, 0, -1, 0, NULL);
    }
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
        close_fd(&m.ctl);
        snprintf(name, sizeof name, "bad option %s %s: exit status 2", bad[i][0],
                 bad[i][1] ? bad[i][1] : "");
        int reaped = mgr_reap(&m, 5000);
        if (!reaped) {
            kill(m.pid, SIGKILL);
            mgr_reap(&m, 5000);
        }
        ok(reaped && WIFEXITED(m.status) && WEXITSTATUS(m.status) == 2, name);
        unlink(m.errpath);
        mgr_close(&m);
    }
}

/* Hand-offs and serving, limits, malformed frames, counts, and exit when
 * the master goes away. */
static void test_serving(void)
{
    static const char *const opts[] = { "--keepalive-timeout", "10", "--read-timeout", "10",
        "--max-header-bytes", "4096", "--max-request-line", "1024", "--max-connections", "100",
        NULL };
    mgr_t m;
    nw_manager_stats st;
    char buf[8192];
    int c, s, c2, s2, served = 0;

    g_handoffs = 0;
    mgr_open(&m);
    /* A frame written before the manager runs waits in the socket. */
    tcp_pair(&c, &s);
    handoff(m.tom, s, 6, -1, 0, "GET /early HTTP/1.1\r\n\r\n");
    mgr_exec(&m, opts);
    ok(got_serve(m.tow, 3000), "a HANDOFF written before the manager started is read and served");
    served++;
    is_str(g_sv.data, g_sv.f.data_len, "GET /early HTTP/1.1\r\n\r\n", "... with its bytes");
    close_served();
    close(c);
    ok(STATS_UNTIL(&m, st, 1, 3000), "STATS frames come on control (one within a second or so)");
    quiet(&m, "an idle manager does not spin (CPU ticks over 300 ms)");

    /* An idle connection, then its request. */
    tcp_pair(&c, &s);
    g_listener_no = 2;
    handoff(m.tom, s, 3, -1, 0, NULL);
    g_listener_no = 1;
    ok(!got_serve(m.tow, 100), "an idle connection is held: no SERVE");
    put(c, REQ_A);
    ok(got_serve(m.tow, 3000), "idle hand-off + request: SERVE on to-workers");
    served++;
    is(g_sv.f.requests, 3, "SERVE carries the requests count of the HANDOFF");
    is(g_sv.f.listener, 2, "SERVE carries the listener of the HANDOFF");
    is_str(g_sv.data, g_sv.f.data_len, REQ_A, "SERVE carries the request bytes");
    is(port_of(g_sv.fd, 1), port_of(c, 0), "the fd in SERVE is connected to the client");
    put(g_sv.fd, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
    close_served();
    shutdown(c, SHUT_WR);
    ok(read_to_eof(c, buf, sizeof buf, 2000) >= 0
       && strstr(buf, "200 OK") && strstr(buf, "\r\n\r\nok"),
       "the fd in SERVE is the client's connection (a response written to it arrives)");
    close(c);
    ok(!wait_fd(m.tow, POLLIN, 0), "one request, one SERVE");

    /* A partial head in the HANDOFF, the rest later. */
    tcp_pair(&c, &s);
    handoff(m.tom, s, 7, 5000, NW_FRAME_F_HEAD_STARTED, "GET /b HTTP/1.1\r\nHo");
    ok(!got_serve(m.tow, 200), "partial head in HANDOFF: no SERVE yet");
    put(c, "st: x\r\n\r\n");
    ok(got_serve(m.tow, 3000), "partial head + the rest: SERVE");
    served++;
    is_str(g_sv.data, g_sv.f.data_len, "GET /b HTTP/1.1\r\nHost: x\r\n\r\n",
           "SERVE has the head's two parts joined");
    is(g_sv.f.requests, 7, "... and the requests count");
    close_served();
    close(c);

    /* Pipelined: the HANDOFF already holds a complete head. */
    tcp_pair(&c, &s);
    handoff(m.tom, s, 1, -1, 0, "GET /c HTTP/1.1\r\nHost: x\r\n\r\nGET /d HTTP/1.1\r\n");
    ok(got_serve(m.tow, 1000), "a complete head in HANDOFF is served at once");
    served++;
    is_str(g_sv.data, g_sv.f.data_len,
           "GET /c HTTP/1.1\r\nHost: x\r\n\r\nGET /d HTTP/1.1\r\n",
           "... with every byte, the pipelined rest too");
    close_served();
    close(c);

    /* A head in pieces, after a blank line, the end split across reads. */
    tcp_pair(&c, &s);
    handoff(m.tom, s, 2, -1, 0, NULL);
    put(c, "\r\n");
    ok(!got_serve(m.tow, 150), "a blank line alone is not a head");
    put(c, "GET /e HTTP/1.1\r\n");
    sleep_ms(40);
    put(c, "Host: x\r\n\r");
    ok(!got_serve(m.tow, 100), "no SERVE before the head's last byte");
    put(c, "\n");
    ok(got_serve(m.tow, 3000), "a head arriving in pieces: SERVE");
    served++;
    is_str(g_sv.data, g_sv.f.data_len, "GET /e HTTP/1.1\r\nHost: x\r\n\r\n",
           "... with the pieces joined, the leading blank line dropped");
    close_served();
    close(c);

    /* Two connections: each SERVE in the order the heads completed. */
    tcp_pair(&c, &s);
    tcp_pair(&c2, &s2);
    handoff(m.tom, s, 4, -1, 0, NULL);
    handoff(m.tom, s2, 5, -1, 0, NULL);
    sleep_ms(50);
    put(c2, "GET /q2 HTTP/1.1\r\n\r\n");
    sleep_ms(50);
    put(c, "GET /q1 HTTP/1.1\r\n\r\n");
    ok(got_serve(m.tow, 2000) && g_sv.f.requests == 5
       && port_of(g_sv.fd, 1) == port_of(c2, 0), "two connections: the first complete head first");
    served++;
    is_str(g_sv.data, g_sv.f.data_len, "GET /q2 HTTP/1.1\r\n\r\n", "... with its bytes");
    close_served();
    ok(got_serve(m.tow, 2000) && g_sv.f.requests == 4
       && port_of(g_sv.fd, 1) == port_of(c, 0), "... then the other");
    served++;
    is_str(g_sv.data, g_sv.f.data_len, "GET /q1 HTTP/1.1\r\n\r\n", "... with its bytes");
    close_served();
    close(c);
    close(c2);

    /* Over the limits: a worker gets it, to answer 414 / 431. */
    tcp_pair(&c, &s);
    handoff(m.tom, s, 0, -1, 0, NULL);
    memset(buf, 'a', 1500);
    memcpy(buf, "GET /", 5);
    buf[1500] = 0;
    put(c, buf);
    ok(got_serve(m.tow, 3000) && g_sv.f.data_len > 1024 && !memchr(g_sv.data, '\n', g_sv.f.data_len),
       "a request line over --max-request-line without LF goes to a worker (414)");
    served++;
    close_served();
    close(c);
    tcp_pair(&c, &s);
    handoff(m.tom, s, 0, -1, 0, NULL);
    put(c, "GET / HTTP/1.1\r\n");
    for (int i = 0; i < 60; i++)
        put(c, "X-Filler: 0123456789012345678901234567890123456789012345678901234567890123456789\r\n");
    ok(got_serve(m.tow, 3000) && g_sv.f.data_len > 4096,
       "a head over --max-header-bytes goes to a worker (431)");
    served++;
    close_served();
    close(c);

    /* Malformed frames are dropped, any fd with them closed; the manager
     * carries on. */
    {
        char junk[24] = "this is not a frame...";
        nw_frame old;
        int c3, s3;
        tcp_pair(&c, &s);
        ok(send_raw(m.tom, junk, sizeof junk, s) == (ssize_t)sizeof junk,
           "sent a frame with bad magic and an fd on to-manager");
        close(s);
        tcp_pair(&c2, &s2);
        nw_frame_init(&old, 4);   /* the old WORKER frame: no longer a type */
        ok(send_raw(m.tom, &old, sizeof old, s2) == (ssize_t)sizeof old,
           "sent a frame of an unknown type with an fd on to-manager");
        close(s2);
        tcp_pair(&c3, &s3);
        ok(send_raw(m.ctl, &old, sizeof old, s3) == (ssize_t)sizeof old,
           "sent a frame of an unknown type with an fd on control");
        close(s3);
        ok(send_raw(m.ctl, junk, 10, -1) == 10, "sent a short frame on control");
        ok(read_to_eof(c, NULL, 0, 2000) >= 0, "the fd of a frame with bad magic is closed");
        ok(read_to_eof(c2, NULL, 0, 2000) >= 0, "the fd of a frame of unknown type is closed");
        ok(read_to_eof(c3, NULL, 0, 2000) >= 0, "the fd of a frame on control is closed");
        close(c);
        close(c2);
        close(c3);
    }
    ok(mgr_reap(&m, 0) == 0, "a short frame on control does not stop the manager");
    tcp_pair(&c, &s);
    handoff(m.tom, s, 9, -1, 0, "GET /after HTTP/1.1\r\n\r\n");
    ok(got_serve(m.tow, 3000) && g_sv.f.requests == 9, "after malformed frames the manager still serves");
    served++;
    close_served();
    close(c);
    quiet(&m, "... and is quiet after them");

    /* Counts. */
    int idle_c, gone_c;
    tcp_pair(&idle_c, &s);
    handoff(m.tom, s, 0, -1, 0, NULL);
    tcp_pair(&gone_c, &s);
    handoff(m.tom, s, 0, -1, 0, NULL);
    sleep_ms(50);
    close(gone_c);
    ok(STATS_UNTIL(&m, st, st.closed_peer == 1 && st.idle == 1, 3000),
       "STATS: a client that closes is counted, one connection held");
    if (!ok(st.received == (uint64_t)g_handoffs && st.handed_off == (uint64_t)served
            && st.closed_timeout == 0 && st.closed_full == 0 && st.queued == 0,
            "STATS: received, handed_off and the rest add up"))
        diag("handoffs sent %d, serves seen %d", g_handoffs, served);
    diag_stats(&st);

    /* The master goes away: the client gets end-of-stream at once, and
     * closes; the manager, which lingers for it (1 s at most, as the SIGTERM
     * test in test_deadlines checks), then exits. */
    close_fd(&m.ctl);
    int held_closed = read_to_eof(idle_c, NULL, 0, 1000) >= 0;
    close(idle_c);
    ok(mgr_reap(&m, 3000), "control EOF: the manager exits");
    ok(held_closed, "... closing the connections it held");
    mgr_finish(&m, "control EOF");
}

/* to-workers full: heads wait in the manager's FIFO, which it sends in
 * order when there is room, and no head overtakes a queued one. */
static void test_queue(void)
{
    static const char *const opts[] = { "--keepalive-timeout", "20", "--read-timeout", "20",
        "--max-header-bytes", "1000000", "--max-connections", "100000", NULL };
    static int cl[QMAX + 16], port[QMAX + 16];
    static char head[QPAD + 128];
    mgr_t m;
    nw_manager_stats st;
    int sndbuf = 0, s;
    socklen_t optlen = sizeof sndbuf;

    if (!raise_nofile(2 * QMAX + 400)) {
        ok(1, "# SKIP RLIMIT_NOFILE too low for the to-workers-full test");
        return;
    }
    g_handoffs = 0;
    mgr_start(&m, opts);
    STATS_UNTIL(&m, st, 1, 3000);   /* it has set its sockets up */
    if (getsockopt(m.mtow, SOL_SOCKET, SO_SNDBUF, &sndbuf, &optlen) != 0)
        die("SO_SNDBUF of to-workers");
    /* A send fails only once the bytes in flight reach SO_SNDBUF, and each
     * frame takes more than QPAD of it: n1 heads overflow it by 16 or more. */
    int n1 = sndbuf / QPAD + 17;
    if (n1 > QMAX)
        n1 = QMAX;
    diag("to-workers SO_SNDBUF %d: %d clients with %d-byte heads to fill it", sndbuf, n1, QPAD);

    /* Idle hand-offs, each followed by a big request from its client. */
    for (int i = 0; i < n1; i++) {
        tcp_pair(&cl[i], &s);
        port[i] = port_of(cl[i], 0);
        handoff(m.tom, s, (uint32_t)i, -1, 0, NULL);
        int len = snprintf(head, sizeof head, "GET /q%d HTTP/1.1\r\nX-Pad: ", i);
        memset(head + len, 'p', QPAD);
        memcpy(head + len + QPAD, "\r\n\r\n", 5);
        put(cl[i], head);
    }
    ok(STATS_UNTIL(&m, st, st.received == (uint64_t)n1 && st.queued > 0
                           && st.queued + st.handed_off == (uint64_t)n1, 5000),
       "to-workers full: the manager keeps the heads in its queue (STATS queued > 0)");
    diag_stats(&st);
    quiet(&m, "... and waits for room without spinning");

    /* More while it is full: complete heads in the HANDOFF, then idle ones
     * whose requests come later. They queue behind the others. */
    int n2 = n1 + 8;
    for (int i = n1; i < n2; i++) {
        tcp_pair(&cl[i], &s);
        port[i] = port_of(cl[i], 0);
        snprintf(head, sizeof head, "GET /q%d HTTP/1.1\r\n\r\n", i);
        handoff(m.tom, s, (uint32_t)i, -1, 0, i < n1 + 4 ? head : NULL);
        if (i >= n1 + 4)
            put(cl[i], head);
    }
    ok(STATS_UNTIL(&m, st, st.received == (uint64_t)n2 && st.queued >= 8
                           && st.queued + st.handed_off == (uint64_t)n2, 5000),
       "... new heads join the queue");

    /* Take one: now a send would fit, but the socket is not yet writable
     * for epoll (a quarter of SO_SNDBUF), and a new head must not overtake
     * the queue anyway. */
    int expect = 0, arrived = 0, in_order = 1, right_fd = 1, n3 = n2 + 1;
    if (got_serve(m.tow, 3000)) {
        int idx = -1;
        sscanf(g_sv.data, "GET /q%d ", &idx);
        in_order &= idx == expect;
        right_fd &= idx >= 0 && idx < n2 && (int)g_sv.f.requests == idx
                    && port_of(g_sv.fd, 1) == port[idx];
        arrived++;
        expect++;
        close_served();
    }
    sleep_ms(50);
    tcp_pair(&cl[n2], &s);
    port[n2] = port_of(cl[n2], 0);
    snprintf(head, sizeof head, "GET /q%d HTTP/1.1\r\n\r\n", n2);
    handoff(m.tom, s, (uint32_t)n2, -1, 0, head);
    ok(STATS_UNTIL(&m, st, st.received == (uint64_t)n3
                           && st.queued + st.handed_off == (uint64_t)n3, 5000),
       "one taken, one more complete head handed off");

    /* Read everything, as free workers would. */
    nw_msec t0 = nw_now_ms();
    while (arrived < n3 && got_serve(m.tow, 3000)) {
        int idx = -1;
        sscanf(g_sv.data, "GET /q%d ", &idx);
        if (idx != expect && in_order) {
            diag("SERVE number %d is head %d", arrived, idx);
            in_order = 0;
        }
        if (!(idx >= 0 && idx < n3 && (int)g_sv.f.requests == idx
              && port_of(g_sv.fd, 1) == port[idx]) && right_fd) {
            diag("SERVE number %d (head %d, requests %u): not its client's connection",
                 arrived, idx, (unsigned)g_sv.f.requests);
            right_fd = 0;
        }
        arrived++;
        expect++;
        close_served();
    }
    diag("read %d SERVE frames in %lld ms", arrived, (long long)(nw_now_ms() - t0));
    is(arrived, n3, "every connection arrives on to-workers");
    ok(in_order, "... in FIFO order (the one handed off last, last)");
    ok(right_fd, "... each with its own client's connection and requests count");
    ok(!got_serve(m.tow, 100), "... and nothing more");
    ok(STATS_UNTIL(&m, st, st.queued == 0 && st.handed_off == (uint64_t)n3 && st.idle == 0, 3000),
       "STATS: queue empty, every head handed off");
    diag_stats(&st);
    quiet(&m, "with the queue empty the manager is quiet (not spinning on a writable to-workers)");

    /* And it serves as before. */
    tcp_pair(&cl[n3], &s);
    handoff(m.tom, s, 1, -1, 0, NULL);
    put(cl[n3], REQ_A);
    ok(got_serve(m.tow, 3000) && g_sv.f.requests == 1, "after the queue drained a head goes straight out");
    close_served();
    for (int i = 0; i <= n3; i++)
        close(cl[i]);
    mgr_finish(&m, "to-workers full");
}

/* Idle and read deadlines and 408s, on a test clock (each checked open
 * just before it is due and closed once it is); then, on the real one,
 * SIGTERM, and a new manager on the same sockets. */
static void test_deadlines(void)
{
    static const char *const opts[] = { "--keepalive-timeout", "0.5", "--read-timeout", "0.8",
                                        NULL };
    mgr_t m;
    nw_manager_stats st;
    char buf[1024];
    int cx, cy, cz, c, c2, s;

    mgr_start_clocked(&m, opts);

    tcp_pair(&cx, &s);
    handoff(m.tom, s, 0, -1, 0, NULL);
    tcp_pair(&cy, &s);
    handoff(m.tom, s, 0, 200, 0, NULL);
    handoffs_taken(&m);
    nw_msec t0 = m.now;
    int y_ended = open_then_ended(&m, cy, 150, 100, NULL, 0);
    ok(y_ended && still_open(cx),
       "HANDOFF with 200 ms left: open at 150 ms, closed by 250 ms (before an older one)");
    ok(open_then_ended(&m, cx, 200, 100, NULL, 0),
       "idle connection: open at 450 ms, closed by 550 ms (--keepalive-timeout 0.5 s)");
    diag("test clock: %lld ms from the hand-offs", (long long)(m.now - t0));
    close(cx);
    close(cy);

    /* A head started later than the hand-off gets the read timeout from its
     * first byte, not the idle one; then a 408. */
    tcp_pair(&cz, &s);
    handoff(m.tom, s, 0, -1, 0, NULL);
    handoffs_taken(&m);
    clock_advance(&m, 300);
    put_delivered(cz, "GET /slow HTTP/1.1\r\n");
    ok(open_then_ended(&m, cz, 700, 100, buf, sizeof buf),
       "slow head: open 700 ms after its first byte (past the idle timeout), closed by 800 ms "
       "(--read-timeout 0.8 s)");
    is_408(buf, "slow head: the client gets a 408, with a Date");
    close(cz);

    /* HEAD_STARTED with 100 ms left of the read timeout. */
    tcp_pair(&c, &s);
    handoff(m.tom, s, 0, 100, NW_FRAME_F_HEAD_STARTED, "GET / HTT");
    handoffs_taken(&m);
    ok(open_then_ended(&m, c, 50, 50, buf, sizeof buf), "HANDOFF with HEAD_STARTED and 100 ms left: open at 50 ms, 408 by 100 ms");
    is_408(buf, "... a full 408 response");
    close(c);
    ok(STATS_UNTIL(&m, st, st.closed_timeout == 4 && st.idle == 0, 3000),
       "STATS: four closed by timeout, none held");
    diag_stats(&st);

    /* A head a worker saw begin 500 ms before it handed it over (ready_ms),
     * 300 ms left: a byte that comes 100 ms later leaves the deadline where
     * it was, 800 ms from the first byte. (Counted from the hand-off, the
     * 408 came 800 ms after it, 500 ms late.) */
    tcp_pair(&c, &s);
    g_ready_ms = (uint32_t)(m.now - 500);
    handoff(m.tom, s, 0, 300, NW_FRAME_F_HEAD_STARTED, "GET / HTT");
    g_ready_ms = 0;
    handoffs_taken(&m);
    clock_advance(&m, 100);
    put_delivered(c, "P");
    ok(open_then_ended(&m, c, 150, 50, buf, sizeof buf),
       "a head begun before its hand-off: open at 250 ms, 408 by 300 ms, when due from its first byte");
    is_408(buf, "... a full 408 response");
    close(c);
    mgr_finish(&m, "deadlines on a test clock");

    mgr_start(&m, opts);

    /* SIGTERM: FIN to everything held, linger at most 1 s, exit 0. */
    tcp_pair(&c, &s);
    handoff(m.tom, s, 0, -1, 0, NULL);
    tcp_pair(&c2, &s);
    handoff(m.tom, s, 0, 5000, NW_FRAME_F_HEAD_STARTED, "GET / HTT");
    handoffs_taken(&m);     /* (a new manager: in its loop, its signals blocked, by then) */
    sleep_ms(30);
    nw_msec tk = nw_now_ms();
    kill(m.pid, SIGTERM);
    ok(read_to_eof(c, NULL, 0, 1000) >= 0 && read_to_eof(c2, NULL, 0, 1000) >= 0
       && nw_now_ms() - tk < 400,
       "SIGTERM: the connections it held (idle and reading) get end-of-stream at once");
    close(c);   /* c2 stays open: the manager lingers for it, 1 s at most */
    ok(mgr_reap(&m, 3000) && nw_now_ms() - tk < 1600,
       "SIGTERM: the manager exits within about 1 s while a client stays open");
    diag("exited %lld ms after SIGTERM", (long long)(nw_now_ms() - tk));
    close(c2);
    mgr_check(&m, "SIGTERM, a client left open");

    /* A HANDOFF while no manager runs; a new one on the same sockets. */
    tcp_pair(&c, &s);
    handoff(m.tom, s, 8, -1, 0, "GET /between HTTP/1.1\r\n\r\n");
    mgr_exec(&m, opts);
    ok(got_serve(m.tow, 3000) && g_sv.f.requests == 8,
       "a new manager on the same sockets serves what the old one had not read");
    is_str(g_sv.data, g_sv.f.data_len, "GET /between HTTP/1.1\r\n\r\n", "... with its bytes");
    close_served();
    close(c);

    tcp_pair(&c, &s);
    handoff(m.tom, s, 0, -1, 0, NULL);
    sleep_ms(30);
    tk = nw_now_ms();
    kill(m.pid, SIGTERM);
    ok(read_to_eof(c, NULL, 0, 1000) >= 0 && nw_now_ms() - tk < 400,
       "SIGTERM: the connection it held gets end-of-stream at once");
    close(c);
    ok(mgr_reap(&m, 2000) && exited_zero(m.status) && nw_now_ms() - tk < 900,
       "SIGTERM: the manager exits 0 once its clients have closed");
    mgr_check(&m, "SIGTERM");
    mgr_close(&m);
}

/* --max-connections: the longest idle goes first; if none is idle, the new one. */
static void test_full(void)
{
    static const char *const opts[] = { "--max-connections", "3", "--keepalive-timeout", "10",
                                        "--max-header-bytes", "1000000", NULL };
    mgr_t m;
    nw_manager_stats st;
    int c[5], s;

    mgr_start(&m, opts);

    /* A head bigger than a frame can carry goes to a worker at the frame limit. */
    tcp_pair(&c[0], &s);
    handoff(m.tom, s, 0, -1, 0, NULL);
    {
        static char big[NW_FRAME_MAX_DATA + 4096];
        memset(big, 'x', sizeof big - 1);
        memcpy(big, "GET / HTTP/1.1\r\nX: ", 19);
        big[sizeof big - 1] = 0;
        put(c[0], big);
    }
    ok(got_serve(m.tow, 3000) && g_sv.f.data_len == NW_FRAME_MAX_DATA,
       "a head longer than a frame (128 KiB) goes to a worker at the frame size limit");
    close_served();
    close(c[0]);

    /* A HANDOFF without an fd holds nothing. */
    ok(send_frame(m.tom, NW_FRAME_HANDOFF, -1, 0, -1, 0, NULL, 0) == 0,
       "sent a HANDOFF without an fd");
    for (int i = 0; i < 4; i++) {
        tcp_pair(&c[i], &s);
        handoff(m.tom, s, 0, -1, 0, NULL);
        sleep_ms(10);
    }
    ok(read_to_eof(c[0], NULL, 0, 2000) >= 0, "full: the longest-idle connection is closed");
    ok(still_open(c[1]) && still_open(c[2]) && still_open(c[3]), "... and only that one");
    for (int i = 1; i < 4; i++)
        put(c[i], "GET / HTTP/1.1\r\n");   /* reading, no longer idle */
    sleep_ms(100);
    tcp_pair(&c[4], &s);
    handoff(m.tom, s, 0, -1, 0, NULL);
    ok(read_to_eof(c[4], NULL, 0, 2000) >= 0, "full and nothing idle: the new connection is closed");
    ok(still_open(c[1]) && still_open(c[2]) && still_open(c[3]), "... and the others kept");
    ok(STATS_UNTIL(&m, st, st.closed_full == 2 && st.idle == 3, 3000),
       "STATS: two closed to stay under --max-connections, three held");
    diag_stats(&st);
    ok(!wait_fd(m.tow, POLLIN, 0), "nothing went to the workers");
    for (int i = 0; i < 5; i++)
        close(c[i]);
    mgr_finish(&m, "max-connections");
}

/* The kernel counts the descriptors a user has in flight on unix sockets
 * and refuses a sender one more beyond its open-file limit (ETOOMANYREFS)
 * unless it has CAP_SYS_RESOURCE: a manager that is not root meets that
 * with SERVE frames unread while the serve queue still has room. Its
 * clients must wait in its queue until the workers take what is in
 * flight, not be closed unread (before, every one past the limit was).
 * The manager runs as a user of its own (no other process adds to its
 * count), so this needs root. */
static void test_in_flight(void)
{
    static const char *const opts[] = { "--keepalive-timeout", "20", "--read-timeout", "20", NULL };
    enum { LIMIT = 32, N = 48 };
    int cl[N], port[N], s;
    char head[64];
    mgr_t m;
    nw_manager_stats st;

    if (geteuid() != 0) {
        ok(1, "# SKIP descriptors in flight: needs root (the manager runs as a user of its own)");
        return;
    }
    mgr_open(&m);
    m.uid = 64999;      /* (no process of the machine runs as it) */
    m.nofile = LIMIT;
    mgr_exec(&m, opts);
    if (mgr_reap(&m, 300)) {
        ok(1, "# SKIP descriptors in flight: the manager cannot start as uid 64999");
        diag("wait status %d", m.status);
        mgr_close(&m);
        return;
    }
    STATS_UNTIL(&m, st, 1, 3000);
    for (int i = 0; i < N; i++) {
        tcp_pair(&cl[i], &s);
        port[i] = port_of(cl[i], 0);
        snprintf(head, sizeof head, "GET /f%d HTTP/1.1\r\n\r\n", i);
        handoff(m.tom, s, (uint32_t)i, -1, 0, head);
    }
    ok(STATS_UNTIL(&m, st, st.received == (uint64_t)N && st.queued > 0
                           && st.queued + st.handed_off == (uint64_t)N, 5000),
       "descriptors in flight at the manager's open-file limit: it keeps the rest in its queue");
    diag_stats(&st);
    quiet(&m, "... and tries again without spinning");
    int arrived = 0, right = 1;
    while (arrived < N && got_serve(m.tow, 3000)) {
        int idx = -1;
        sscanf(g_sv.data, "GET /f%d ", &idx);
        right &= idx == arrived && (int)g_sv.f.requests == idx && port_of(g_sv.fd, 1) == port[idx];
        arrived++;
        close_served();
    }
    is(arrived, N, "... and every client arrives once the workers take what was in flight");
    ok(right, "... in order, each with its own connection");
    for (int i = 0; i < N; i++)
        close(cl[i]);
    mgr_finish(&m, "descriptors in flight");
}

/* Many idle connections at once, all closed by their deadline (on a test
 * clock: none open at 1.4 s, all closed once it is 1.5 s). */
static void test_many(void)
{
    static const char *const opts[] = { "--keepalive-timeout", "1.5", NULL };
    static int cl[MANY];
    static struct pollfd pf[MANY];
    mgr_t m;
    nw_manager_stats st;

    if (!raise_nofile(MANY + 200)) {
        ok(1, "# SKIP RLIMIT_NOFILE too low for the many-connections test");
        return;
    }
    mgr_start_clocked(&m, opts);
    nw_msec t0 = nw_now_ms();
    handoff_many(m.tom, cl, MANY);
    nw_msec t1 = nw_now_ms();
    diag("%d hand-offs took %lld ms", MANY, (long long)(t1 - t0));
    int open_now = 0;
    for (int i = 0; i < MANY; i++) {
        pf[i].fd = cl[i];
        pf[i].events = POLLIN;
        open_now += still_open(cl[i]);
    }
    ok(open_now == MANY, "2000 idle connections held at once");
    handoffs_taken(&m);
    clock_advance(&m, 1400);
    int open_before = 0;
    for (int i = 0; i < MANY; i++)
        open_before += still_open(cl[i]);
    clock_advance(&m, 100);
    int left = MANY;
    nw_msec end = nw_now_ms() + 5000;
    while (left > 0 && nw_now_ms() < end) {
        if (poll(pf, MANY, 100) <= 0)
            continue;
        for (int i = 0; i < MANY; i++) {
            char b[64];
            if (pf[i].fd < 0 || !pf[i].revents)
                continue;
            if (recv(pf[i].fd, b, sizeof b, MSG_DONTWAIT) > 0)
                continue;
            close(pf[i].fd);
            pf[i].fd = -1;
            left--;
        }
    }
    ok(left == 0, "... all closed by the keep-alive timeout");
    ok(open_before == MANY, "... none before it");
    diag("open at 1.4 s on the test clock: %d; closed by 1.5 s: %d", open_before, MANY - left);
    for (int i = 0; i < MANY; i++)
        if (pf[i].fd >= 0)
            close(pf[i].fd);
    ok(STATS_UNTIL(&m, st, st.closed_timeout == MANY && st.idle == 0 && st.received == MANY, 3000),
       "STATS: 2000 received, 2000 closed by timeout");
    ok(!wait_fd(m.tow, POLLIN, 0), "nothing went to the workers");
    mgr_finish(&m, "many idle connections");
}

/* --measure N: RSS of the manager per idle connection. */
static int measure(int n)
{
    static const char *const opts[] = { "--keepalive-timeout", "3600", NULL };
    mgr_t m;
    nw_manager_stats st;
    int *cl = n > 8 ? calloc((size_t)n, sizeof *cl) : NULL;

    if (!cl || !raise_nofile((size_t)n + 200)) {
        fprintf(stderr, "need more than 8 connections and %d fds\n", n + 200);
        free(cl);
        return 2;
    }
    mgr_start(&m, opts);
    handoff_many(m.tom, cl, 8);   /* warm up: first frames, first slab */
    STATS_UNTIL(&m, st, st.idle == 8, 3000);
    long before = rss_kib(m.pid), slab_before = slab_kib();
    handoff_many(m.tom, cl + 8, n - 8);
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
    close_fd(&m.ctl);
    mgr_reap(&m, 5000);
    unlink(m.errpath);
    mgr_close(&m);
    free(cl);
    return 0;
}

/* ------------------------------------------------------------ one scanner */

/* The same byte streams, cut into the same pieces, through both paths that
 * find the end of a request head: the manager's (a held connection, SERVE
 * once the head is complete or over a limit) and the worker's
 * (nw_conn_read_head). Each stream is cut at every point into two pieces,
 * and at random points (fixed seed) into up to six. Both paths must decide
 * after the piece the reference below names, the worker's head must end
 * where the reference says, and so must one nw_http_head_end call over the
 * whole stream. The reference is written here, simply, on purpose: it is
 * not the scanner under test. */
#define SCAN_MAX_HEADER 512     /* both paths' head limit in these tests */
#define SCAN_MAX_PIECES 6
#define SCAN_RANDOM_CUTS 40     /* random cuttings per stream */

typedef struct {
    const char *name;
    const char *bytes;
} scan_stream_t;

static char g_oversized[SCAN_MAX_HEADER + 160];

static const scan_stream_t g_scan_streams[] = {
    { "complete, CRLF", "GET /a HTTP/1.1\r\nHost: x\r\n\r\n" },
    { "pipelined", "GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\n" },
    { "LF only", "GET /a HTTP/1.1\nHost: x\nAccept: */*\n\n" },
    { "CRLF lines, a bare LF ends", "GET /a HTTP/1.1\r\nHost: x\r\n\n" },
    { "LF lines, CRLF ends", "GET /a HTTP/1.1\nHost: x\n\r\n" },
    { "empty lines before the request line", "\r\n\r\n\nGET /a HTTP/1.1\r\nHost: x\r\n\r\n" },
    { "a bare CR before the request line", "\rGET /a HTTP/1.1\r\nHost: x\r\n\r\n" },
    { "a bare CR after empty lines", "\n\r\n\r\rGET /a HTTP/1.1\r\nHost: x\r\n\r\n" },
    { "a bare CR, then what looks like an end", "\n\r\r\n\nGET /a HTTP/1.1\r\n\r\n" },
    { "LF CR that is not an end", "GET /a HTTP/1.1\r\nX: a\n\rY: b\r\n\r\n" },
    { "a body after the head",
      "POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nab\r\n\r\ncd\n\n" },
    { "oversized", g_oversized },
};

static void scan_streams_init(void)
{
    char pad[SCAN_MAX_HEADER + 1];
    memset(pad, 'a', SCAN_MAX_HEADER);
    pad[SCAN_MAX_HEADER] = 0;
    snprintf(g_oversized, sizeof g_oversized,
             "GET /a HTTP/1.1\r\nHost: x\r\nX-Pad: %s\r\n\r\n", pad);
}

/* Empty lines before the request line: CRLF or LF each. *bad: a CR
 * followed by anything else (a bare CR) ends them, and the request is
 * refused. A CR at the end of what has arrived may still become one. */
static size_t scan_blank_prefix(const char *p, size_t len, int *bad)
{
    size_t i = 0;
    *bad = 0;
    while (i < len) {
        if (p[i] == '\n') {
            i++;
        } else if (p[i] == '\r' && i + 1 < len && p[i + 1] == '\n') {
            i += 2;
        } else {
            *bad = p[i] == '\r' && i + 1 < len;
            break;
        }
    }
    return i;
}

/* Just past the first LF LF or LF CR LF after the empty lines, or 0. */
static size_t scan_reference_end(const char *p, size_t len)
{
    int bad;
    for (size_t j = scan_blank_prefix(p, len, &bad); j < len; j++) {
        if (p[j] != '\n')
            continue;
        if (j + 1 < len && p[j + 1] == '\n')
            return j + 2;
        if (j + 2 < len && p[j + 1] == '\r' && p[j + 2] == '\n')
            return j + 3;
    }
    return 0;
}

/* The piece after which a path must decide: the head has ended, or what
 * has arrived is already over the head limit, or a bare CR came before
 * the request line. */
static int scan_reference_piece(const char *bytes, const size_t *upto, int npieces)
{
    for (int k = 0; k < npieces; k++) {
        int bad;
        scan_blank_prefix(bytes, upto[k], &bad);
        if (bad || scan_reference_end(bytes, upto[k]) || upto[k] > SCAN_MAX_HEADER)
            return k;
    }
    return -1;
}

/* Wait until the manager has read everything sent on the connection
 * (watch is our copy of its server end) or has put it on the serve queue:
 * so each piece is read alone. Nothing signals the read: it is looked for
 * every 0.1 ms (about what the manager takes), as there are thousands
 * of cuttings of up to six pieces each. */
static void scan_wait_manager_read(mgr_t *m, int watch)
{
    nw_msec end = nw_now_ms() + 2000;
    int queued = 1;
    while (nw_now_ms() < end) {
        if (ioctl(watch, FIONREAD, &queued) == 0 && queued == 0)
            return;
        struct pollfd p = { .fd = m->tow, .events = POLLIN };
        struct timespec look = { 0, 100000 };
        if (ppoll(&p, 1, &look, NULL) > 0)
            return;
    }
}

/* The piece after which the manager served the connection, from the bytes
 * it served (every byte so far but the empty lines before the head): -1
 * not served, -2 served with bytes that match no piece. */
static int scan_manager_piece(mgr_t *m, const char *bytes, const size_t *upto, int npieces)
{
    int c, s;
    tcp_pair(&c, &s);
    int watch = dup(s);
    if (watch < 0)
        die("dup");
    handoff(m->tom, s, 0, -1, 0, NULL);
    for (int k = 0; k < npieces; k++) {
        size_t from = k ? upto[k - 1] : 0;
        if (send(c, bytes + from, upto[k] - from, MSG_NOSIGNAL) != (ssize_t)(upto[k] - from))
            die("send a piece");
        scan_wait_manager_read(m, watch);
        if (wait_fd(m->tow, POLLIN, 0))
            break;
    }
    int at = -1;
    if (got_serve(m->tow, 2000)) {
        int bad;
        size_t skip = scan_blank_prefix(bytes, upto[npieces - 1], &bad);
        at = -2;
        for (int k = 0; k < npieces && at == -2; k++)
            if (upto[k] > skip && g_sv.f.data_len == upto[k] - skip
                && memcmp(g_sv.data, bytes + skip, g_sv.f.data_len) == 0)
                at = k;
        close_served();
    }
    close(watch);
    close(c);
    return at;
}

/* The piece after which the worker decided (-1: never), and in *head_len
 * where its head ends (0: it answered an error instead). */
static int scan_worker_piece(const char *bytes, const size_t *upto, int npieces,
                             size_t *head_len)
{
    int sv[2], at = -1;
    nw_conn_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.parse.max_request_line = NW_DEFAULT_MAX_REQUEST_LINE;
    cfg.parse.max_header_bytes = SCAN_MAX_HEADER;
    cfg.parse.max_headers = 100;
    cfg.timeout = cfg.read_timeout = cfg.keepalive_timeout = 5;
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) < 0)
        die("socketpair");
    nw_conn *c = nw_conn_new(sv[0], 0, &cfg);
    if (!c)
        die("nw_conn_new");
    *head_len = 0;
    for (int k = 0; k < npieces && at < 0; k++) {
        size_t from = k ? upto[k - 1] : 0;
        if (send(sv[1], bytes + from, upto[k] - from, MSG_NOSIGNAL) != (ssize_t)(upto[k] - from))
            die("send a piece");
        int r = nw_conn_read_head(c, 0, 1);   /* a brief look: the piece is there */
        if (r == NW_REQ_READY)
            *head_len = c->head_len;
        if (r == NW_REQ_READY || r == NW_REQ_ERROR)
            at = k;
    }
    nw_conn_destroy(c);
    close(sv[1]);
    return at;
}

/* One cutting of a stream through both paths. 0: they agree with the
 * reference; otherwise says how they differ. */
static int scan_check_cutting(mgr_t *m, const char *bytes, const size_t *upto, int npieces)
{
    size_t len = upto[npieces - 1], whole_end = scan_reference_end(bytes, len);
    nw_head_scan fresh = { 0, 0 };
    size_t one_call = nw_http_head_end(bytes, len, &fresh);
    int want = scan_reference_piece(bytes, upto, npieces);
    size_t worker_head;
    int by_worker = scan_worker_piece(bytes, upto, npieces, &worker_head);
    int by_manager = scan_manager_piece(m, bytes, upto, npieces);
    int bad;
    size_t skip = scan_blank_prefix(bytes, len, &bad);   /* the worker drops them */
    int head_ok = worker_head == 0 || worker_head == whole_end - skip;
    if (want >= 0 && by_worker == want && by_manager == want && head_ok && one_call == whole_end)
        return 0;
    char cuts[160] = "";
    for (int k = 0, n = 0; k < npieces - 1 && n < (int)sizeof cuts - 8; k++)
        n += snprintf(cuts + n, sizeof cuts - (size_t)n, " %zu", upto[k]);
    diag("cut at%s: want piece %d; worker piece %d (head %zu), manager piece %d; "
         "the end at %zu, one call says %zu", cuts, want, by_worker, worker_head,
         by_manager, whole_end, one_call);
    return 1;
}

static uint32_t g_scan_seed = 20261124u;

static uint32_t scan_random(uint32_t below)
{
    g_scan_seed = g_scan_seed * 1103515245u + 12345u;   /* fixed seed: reproducible */
    return (g_scan_seed >> 8) % below;
}

/* A random cutting of len bytes: sorted distinct cut points, then len. */
static int scan_random_cutting(size_t len, size_t *upto)
{
    int npieces = 2 + (int)scan_random(SCAN_MAX_PIECES - 1);
    if ((size_t)npieces > len)
        npieces = (int)len;
    for (int k = 0; k < npieces - 1; k++) {
        size_t cut;
        int fresh;
        do {
            cut = 1 + scan_random((uint32_t)len - 1);
            fresh = 1;
            for (int j = 0; j < k; j++)
                fresh &= upto[j] != cut;
        } while (!fresh);
        int j = k;
        for (; j > 0 && upto[j - 1] > cut; j--)
            upto[j] = upto[j - 1];
        upto[j] = cut;
    }
    upto[npieces - 1] = len;
    return npieces;
}

static void test_one_scanner(void)
{
    static const char *const opts[] = { "--keepalive-timeout", "10", "--read-timeout", "10",
                                        "--max-header-bytes", "512", NULL };
    mgr_t m;
    mgr_open(&m);
    mgr_exec(&m, opts);
    scan_streams_init();
    for (size_t i = 0; i < sizeof g_scan_streams / sizeof g_scan_streams[0]; i++) {
        const scan_stream_t *st = &g_scan_streams[i];
        size_t len = strlen(st->bytes), upto[SCAN_MAX_PIECES];
        int bad = 0, tried = 0;
        for (size_t cut = 1; cut < len; cut++, tried++) {
            upto[0] = cut;
            upto[1] = len;
            bad += bad < 5 ? scan_check_cutting(&m, st->bytes, upto, 2) : 0;
        }
        for (int r = 0; r < SCAN_RANDOM_CUTS; r++, tried++) {
            int npieces = scan_random_cutting(len, upto);
            bad += bad < 5 ? scan_check_cutting(&m, st->bytes, upto, npieces) : 0;
        }
        char name[200];
        snprintf(name, sizeof name, "one scanner, %s: the manager and the worker decide after "
                 "the same piece, the worker's head ends where a whole scan says (%d cuttings)",
                 st->name, tried);
        ok(bad == 0, name);
    }
    mgr_finish(&m, "one scanner");
}

/* ---- output offload: the manager finishes a response ---------------- */

/* A memfd holding len bytes of a pattern (byte i is 'a' + i % 26). */
static int pattern_memfd(size_t len)
{
    int fd = memfd_create("test-rest", MFD_CLOEXEC);
    char buf[65536];
    if (fd < 0)
        die("memfd_create");
    for (size_t i = 0; i < sizeof buf; i++)
        buf[i] = (char)('a' + i % 26);
    for (size_t done = 0; done < len;) {
        size_t want = len - done < sizeof buf ? len - done : sizeof buf;
        /* keep the pattern continuous across pieces: sizeof buf % 26 != 0 */
        size_t shift = done % 26;
        char piece[sizeof buf];
        for (size_t i = 0; i < want; i++)
            piece[i] = (char)('a' + (i + shift) % 26);
        if (write(fd, piece, want) != (ssize_t)want)
            die("write memfd");
        done += want;
    }
    return fd;
}

/* Hand server to the manager with the rest [offset, offset+length) of
 * rest_fd and the bytes read past the request; closes our copies. */
static int handoff_output(int tom, int server, int rest_fd, uint64_t offset, uint64_t length,
                          uint64_t counted, int keep, const char *unread, int nfds)
{
    char data[sizeof(nw_frame_output) + 256];
    nw_frame_output out = { .offset = offset, .length = length, .counted = counted,
                            .keep_alive = (uint32_t)keep };
    size_t ulen = unread ? strlen(unread) : 0;
    memcpy(data, &out, sizeof out);
    memcpy(data + sizeof out, unread ? unread : "", ulen);
    nw_frame f;
    nw_frame_init(&f, NW_FRAME_HANDOFF);
    f.flags = NW_FRAME_F_OUTPUT;
    f.listener = g_listener_no;
    f.requests = 1;
    f.data_len = (uint32_t)(sizeof out + ulen);
    int fds[2] = { server, rest_fd };
    int r = nw_frame_send_fds(tom, &f, NULL, 0, data, fds, nfds);
    close(server);
    close(rest_fd);
    return r;
}

/* Read exactly len bytes within timeout_ms and check they are the pattern
 * from offset on. 1: all there and right. */
static int read_pattern(int fd, uint64_t offset, size_t len, int timeout_ms)
{
    nw_msec end = nw_now_ms() + timeout_ms;
    size_t got = 0;
    int right = 1;
    while (got < len) {
        nw_msec left = end - nw_now_ms();
        if (left <= 0 || !wait_fd(fd, POLLIN, (int)left)) {
            diag("read_pattern: %zu of %zu bytes came", got, len);
            return 0;
        }
        char tmp[65536];
        size_t want = len - got < sizeof tmp ? len - got : sizeof tmp;
        ssize_t n = recv(fd, tmp, want, MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
            diag("read_pattern: %zu of %zu bytes, then %s", got, len, n ? strerror(errno) : "end of stream");
            return 0;
        }
        for (ssize_t i = 0; i < n; i++)
            if (right && tmp[i] != (char)('a' + (offset + got + (size_t)i) % 26)) {
                diag("read_pattern: byte %zu is wrong", got + (size_t)i);
                right = 0;
            }
        if (n > 0)
            got += (size_t)n;
    }
    return right;
}

static void test_output(void)
{
    static const char *const opts[] = { "--keepalive-timeout", "10", "--read-timeout", "10",
                                        "--timeout", "1.5", NULL };
    mgr_t m;
    nw_manager_stats st;
    int c, s;
    const size_t big = 16u << 20;   /* more than loopback's socket buffers hold */

    mgr_start_clocked(&m, opts);   /* (--timeout below: stepped over, not waited out) */
    /* Keep-alive: the rest is written as the client reads, then the
     * pipelined request behind it is served. */
    tcp_pair(&c, &s);
    ok(handoff_output(m.tom, s, pattern_memfd(big), 100, big - 100, 0, 1,
                      "GET /next HTTP/1.1\r\nHost: x\r\n\r\n", 2) == 0,
       "a HANDOFF with OUTPUT (two fds) is sent");
    ok(STATS_UNTIL(&m, st, st.writing == 1 && st.offloaded == 1, 3000),
       "the manager is writing it (STATS: writing 1, offloaded 1)");
    ok(!got_serve(m.tow, 200), "the pipelined request waits while the response is unread");
    ok(read_pattern(c, 100, big - 100, 10000), "the client reads the whole rest, byte for byte, from the offset");
    ok(got_serve(m.tow, 3000), "then the pipelined request goes to a worker");
    is_str(g_sv.data, g_sv.f.data_len, "GET /next HTTP/1.1\r\nHost: x\r\n\r\n", "... with its bytes");
    close_served();
    ok(STATS_UNTIL(&m, st, st.writing == 0, 3000), "nothing left being written");
    close(c);

    /* Keep-alive with nothing pipelined: idle afterwards, served on its next request. */
    tcp_pair(&c, &s);
    handoff_output(m.tom, s, pattern_memfd(1000), 0, 1000, 0, 1, NULL, 2);
    ok(read_pattern(c, 0, 1000, 3000), "a short rest arrives");
    ok(!got_serve(m.tow, 100), "then the connection is held idle");
    put(c, REQ_A);
    ok(got_serve(m.tow, 3000), "and its next request is served");
    close_served();
    close(c);

    /* Without keep-alive: the rest, then end of stream. */
    tcp_pair(&c, &s);
    handoff_output(m.tom, s, pattern_memfd(5000), 0, 5000, 0, 0, NULL, 2);
    char buf[8192];
    ok(read_pattern(c, 0, 5000, 3000) && read_to_eof(c, buf, sizeof buf, 3000) >= 0 && buf[0] == 0,
       "without keep-alive: the rest, then end of stream");
    close(c);

    /* A client that reads nothing for --timeout (1.5 s) is closed. */
    tcp_pair(&c, &s);
    nw_msec tw = m.now;     /* (its writes make progress from then on, not after) */
    handoff_output(m.tom, s, pattern_memfd(big), 0, big, 0, 1, NULL, 2);
    ok(STATS_UNTIL(&m, st, st.writing == 1, 2000), "a client that reads nothing: being written");
    if (tw + 1350 > m.now)
        clock_advance(&m, (int)(tw + 1350 - m.now));   /* (and STATS_UNTIL's step: 1.4 s) */
    ok(STATS_UNTIL(&m, st, st.writing == 1, 2000),
       "... and still, 1.4 s after its hand-off (test clock)");
    clock_advance(&m, 100);
    ok(STATS_UNTIL(&m, st, st.writing == 0 && st.closed_timeout >= 1, 6000),
       "... closed after --timeout without progress");
    ok(!read_pattern(c, 0, big, 3000), "... and its response is cut short (never complete)");
    close(c);

    /* A rest that the socket takes whole while the client reads nothing:
     * it has left the manager, not the socket. The connection is not idle
     * while the kernel holds the response (--timeout while the client
     * takes none of it), and its keep-alive time starts once the kernel
     * has sent everything, not at the hand-off (test clock). */
    const size_t fits = 2u << 20;
    const int sndbuf = 4 << 20;     /* (the kernel doubles it: room for fits) */
    tcp_pair(&c, &s);
    setsockopt(s, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf);
    tw = m.now;
    handoff_output(m.tom, s, pattern_memfd(fits), 0, fits, 0, 1, NULL, 2);
    ok(STATS_UNTIL(&m, st, st.writing == 1, 2000),
       "a rest the socket took whole, unread: still writing, not idle");
    if (tw + 1350 > m.now)
        clock_advance(&m, (int)(tw + 1350 - m.now));
    ok(STATS_UNTIL(&m, st, st.writing == 1, 2000), "... 1.4 s after its hand-off too (test clock)");
    ok(read_pattern(c, 0, fits, 10000), "the client reads it all");
    tw = m.now;
    ok(STATS_UNTIL(&m, st, st.writing == 0 && st.idle == 1, 3000), "then the connection is idle");
    if (tw + 9900 > m.now)
        clock_advance(&m, (int)(tw + 9900 - m.now));
    put(c, REQ_A);
    ok(got_serve(m.tow, 3000),
       "9.9 s later its next request is served: --keepalive-timeout (10 s) counted from "
       "when the response had left the socket, 11.3 s after the hand-off");
    close_served();
    close(c);

    tcp_pair(&c, &s);
    setsockopt(s, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf);
    tw = m.now;
    handoff_output(m.tom, s, pattern_memfd(fits), 0, fits, 0, 1, NULL, 2);
    ok(STATS_UNTIL(&m, st, st.writing == 1, 2000), "the same rest, and a client that reads nothing");
    uint64_t timeouts = st.closed_timeout;
    if (tw + 1600 > m.now)
        clock_advance(&m, (int)(tw + 1600 - m.now));
    ok(STATS_UNTIL(&m, st, st.writing == 0 && st.closed_timeout > timeouts, 3000),
       "... is closed after --timeout without progress, as a writing one");
    close(c);

    /* A frame that says OUTPUT but carries one fd is dropped, its fd closed. */
    tcp_pair(&c, &s);
    handoff_output(m.tom, s, pattern_memfd(10), 0, 10, 0, 1, NULL, 1);
    ok(read_to_eof(c, buf, sizeof buf, 3000) >= 0, "OUTPUT with one fd: dropped, the connection closed");
    close(c);
    mgr_finish(&m, "output offload");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s path/to/narwhal-manager [--measure N | --only GROUP,... | --groups]\n", argv[0]);
        return 2;
    }
    g_bin = argv[1];
    g_sv.fd = -1;
    /* The manager's counts every STATS_MS, not once a second: a test
     * waiting for a count waits that long at most (the manager reads
     * this once as it starts; for tests only, not an option). */
    setenv("NARWHAL_TEST_MANAGER_STATS_MS", STATS_MS_TEXT, 1);
    /* A stop signal: the manager serves on for 20 ms, not NW_STOP_SERVE_MS
     * (200 ms), as the suite's servers do (TEST_TIMING in
     * t/lib/NarwhalTest.pm; t/41 and t/43 check the real one). The SIGTERM
     * tests time what comes after it: the FIN, the linger, the exit. */
    setenv("NARWHAL_TEST_STOP_SERVE_MS", "20", 1);
    signal(SIGPIPE, SIG_IGN);
    alarm(120);   /* a hang is a failure, not a stuck test run */
    listener_open();
    if (argc == 4 && strcmp(argv[2], "--measure") == 0)
        return measure(atoi(argv[3]));

    /* "--only NAME,..." after the binary: those groups only; "--groups":
     * their names (t/10 runs each group in a process of its own, all at
     * the same time). */
    static const struct { const char *name; void (*run)(void); } groups[] = {
        { "arguments", test_arguments }, { "one_scanner", test_one_scanner },
        { "serving", test_serving },     { "queue", test_queue },
        { "deadlines", test_deadlines }, { "full", test_full },
        { "many", test_many },           { "output", test_output },
        { "in_flight", test_in_flight },
    };
    if (argc == 3 && strcmp(argv[2], "--groups") == 0) {
        for (size_t i = 0; i < sizeof groups / sizeof groups[0]; i++)
            printf("%s\n", groups[i].name);
        return 0;
    }
    const char *only = argc == 4 && strcmp(argv[2], "--only") == 0 ? argv[3] : NULL;
    int ran = 0;
    for (size_t i = 0; i < sizeof groups / sizeof groups[0]; i++) {
        if (only) {
            size_t len = strlen(groups[i].name);
            const char *at = strstr(only, groups[i].name);
            while (at && !((at == only || at[-1] == ',') && (at[len] == ',' || at[len] == '\0')))
                at = strstr(at + 1, groups[i].name);
            if (!at)
                continue;
        }
        groups[i].run();
        ran++;
    }
    if (only && !ran) {
        fprintf(stderr, "--only %s: no such group\n", only);
        return 2;
    }
    close(g_listen);
    return done_testing();
}
