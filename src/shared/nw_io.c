#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "nw_io.h"
#include "nw_limits.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/filter.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/un.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#ifndef SO_COOKIE
#define SO_COOKIE 57     /* (older headers than the kernel) */
#endif

static nw_msec ms_on(clockid_t clock)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (nw_msec)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

nw_msec nw_now_ms(void)
{
    return ms_on(CLOCK_MONOTONIC);
}

uint64_t nw_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

nw_msec nw_coarse_ms(void)
{
    return ms_on(CLOCK_MONOTONIC_COARSE);
}

nw_msec nw_coarse_tick_ms(void)
{
    struct timespec res;
    if (clock_getres(CLOCK_MONOTONIC_COARSE, &res) < 0)
        return 10;      /* (the coarsest tick Linux has: HZ=100) */
    nw_msec ms = (nw_msec)res.tv_sec * 1000 + (res.tv_nsec + 999999) / 1000000;
    return ms > 0 ? ms : 1;
}

nw_msec nw_coarse_lag_ms(void)
{
    return 2 * nw_coarse_tick_ms() + 1;
}

int64_t nw_wall_clock_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

nw_msec nw_deadline_at(nw_msec now, double seconds)
{
    return now + (nw_msec)(seconds * 1000.0 + 0.5);
}

nw_msec nw_deadline_in(double seconds)
{
    return nw_deadline_at(nw_now_ms(), seconds);
}

int nw_io_wait(int fd, short events, nw_msec deadline)
{
    struct pollfd p = { .fd = fd, .events = events };
    nw_msec left = deadline - nw_now_ms();
    if (left <= 0)
        return NW_IO_TIMEOUT;
    if (left > 0x7fffffff)
        left = 0x7fffffff;
    int n = poll(&p, 1, (int)left);
    if (n > 0)
        return NW_IO_OK;
    if (n == 0)
        return NW_IO_TIMEOUT;
    return errno == EINTR ? NW_IO_INTERRUPTED : NW_IO_CLOSED;
}

int nw_io_accept_queue(int fd)
{
    struct tcp_info ti;
    socklen_t len = sizeof ti;
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0 || ti.tcpi_state != TCP_LISTEN)
        return -1;
    return (int)ti.tcpi_unacked;    /* on a listener: its accept queue */
}

int nw_io_stamp_arrivals(int fd)
{
    int on = 1;
    return setsockopt(fd, SOL_SOCKET, SO_TIMESTAMPNS, &on, sizeof on);
}

/* read(2), or recvmsg(2) with the receive time when arrived_ns is given. */
static ssize_t read_stamped(int fd, char *buf, size_t len, int64_t *arrived_ns)
{
    if (!arrived_ns)
        return read(fd, buf, len);
    return nw_io_recv_stamped(fd, buf, len, 0, arrived_ns);
}

ssize_t nw_io_recv_stamped(int fd, char *buf, size_t len, int flags, int64_t *arrived_ns)
{
    union {
        char space[CMSG_SPACE(sizeof(struct timespec))];
        struct cmsghdr align;
    } control;
    struct iovec iov = { .iov_base = buf, .iov_len = len };
    struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1,
                          .msg_control = control.space, .msg_controllen = sizeof control.space };
    ssize_t n = recvmsg(fd, &msg, flags);
    if (n <= 0 || msg.msg_controllen == 0)
        return n;
    for (struct cmsghdr *h = CMSG_FIRSTHDR(&msg); h; h = CMSG_NXTHDR(&msg, h)) {
        if (h->cmsg_level == SOL_SOCKET && h->cmsg_type == SCM_TIMESTAMPNS) {
            struct timespec ts;
            memcpy(&ts, CMSG_DATA(h), sizeof ts);
            *arrived_ns = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
        }
    }
    return n;
}

ssize_t nw_io_read(int fd, char *buf, size_t len, nw_msec deadline, int64_t *arrived_ns)
{
    for (;;) {
        ssize_t n = read_stamped(fd, buf, len, arrived_ns);
        if (n > 0)
            return n;
        if (n == 0)
            return NW_IO_CLOSED;
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return NW_IO_CLOSED;
        int w = nw_io_wait(fd, POLLIN, deadline);
        if (w != NW_IO_OK)
            return w;
    }
}

ssize_t nw_io_read_brief(int fd, char *buf, size_t len, double wait_s, int64_t *arrived_ns)
{
    for (int tries = 0; tries < 2; tries++) {
        ssize_t n = read_stamped(fd, buf, len, arrived_ns);
        if (n > 0)
            return n;
        if (n == 0)
            return NW_IO_CLOSED;
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            return NW_IO_CLOSED;
        if (tries == 1 || wait_s <= 0)
            break;
        struct pollfd p = { .fd = fd, .events = POLLIN };
        struct timespec ts = { (time_t)wait_s, (long)((wait_s - (time_t)wait_s) * 1e9) };
        int r = ppoll(&p, 1, &ts, NULL);
        if (r < 0)
            return errno == EINTR ? NW_IO_INTERRUPTED : NW_IO_CLOSED;
        if (r == 0)
            break;
    }
    return NW_IO_TIMEOUT;
}

/* Drop the first n written bytes from the iovec list. */
static int iov_advance(struct iovec **iov, int *iovcnt, size_t n)
{
    while (*iovcnt > 0 && n >= (*iov)->iov_len) {
        n -= (*iov)->iov_len;
        (*iov)++;
        (*iovcnt)--;
    }
    if (*iovcnt > 0) {
        (*iov)->iov_base = (char *)(*iov)->iov_base + n;
        (*iov)->iov_len -= n;
    }
    return *iovcnt;
}

static int wait_writable(int fd, double timeout_s)
{
    nw_msec deadline = nw_deadline_in(timeout_s);
    for (;;) {
        int w = nw_io_wait(fd, POLLOUT, deadline);
        if (w != NW_IO_INTERRUPTED)
            return w;
    }
}

static void iov_skip_empty(struct iovec **iov, int *iovcnt)
{
    while (*iovcnt > 0 && (*iov)->iov_len == 0) {
        (*iov)++;
        (*iovcnt)--;
    }
}

int nw_io_writev_now(int fd, struct iovec **iov, int *iovcnt)
{
    iov_skip_empty(iov, iovcnt);
    while (*iovcnt > 0) {
        int batch = *iovcnt < NW_IOV_BATCH ? *iovcnt : NW_IOV_BATCH;
        ssize_t n = writev(fd, *iov, batch);
        if (n >= 0) {
            iov_advance(iov, iovcnt, (size_t)n);
            iov_skip_empty(iov, iovcnt);
            continue;
        }
        if (errno == EINTR)
            continue;
        return errno == EAGAIN || errno == EWOULDBLOCK ? NW_IO_AGAIN : NW_IO_CLOSED;
    }
    return NW_IO_OK;
}

int nw_io_writev_all(int fd, struct iovec *iov, int iovcnt, double timeout_s)
{
    for (;;) {
        int r = nw_io_writev_now(fd, &iov, &iovcnt);
        if (r != NW_IO_AGAIN)
            return r;
        int w = wait_writable(fd, timeout_s);
        if (w != NW_IO_OK)
            return w;
    }
}

static int copy_file_fallback(int sock_fd, int file_fd, off_t offset,
                              size_t len, double timeout_s)
{
    char buf[NW_READ_CHUNK * 4];
    while (len > 0) {
        size_t want = len < sizeof buf ? len : sizeof buf;
        ssize_t got = pread(file_fd, buf, want, offset);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            return NW_IO_CLOSED;   /* the file shrank or broke: the body is short */
        struct iovec iov = { buf, (size_t)got };
        int r = nw_io_writev_all(sock_fd, &iov, 1, timeout_s);
        if (r != NW_IO_OK)
            return r;
        offset += got;
        len -= (size_t)got;
    }
    return NW_IO_OK;
}

int nw_io_sendfile_now(int sock_fd, int file_fd, off_t *offset, size_t *len)
{
    while (*len > 0) {
        ssize_t n = sendfile(sock_fd, file_fd, offset, *len);
        if (n > 0) {
            *len -= (size_t)n;
            continue;
        }
        if (n == 0)
            return NW_IO_CLOSED;   /* file shorter than promised */
        if (errno == EINTR)
            continue;
        if (errno == EINVAL || errno == ENOSYS)
            return NW_IO_UNSUPPORTED;
        return errno == EAGAIN || errno == EWOULDBLOCK ? NW_IO_AGAIN : NW_IO_CLOSED;
    }
    return NW_IO_OK;
}

int nw_io_sendfile_all(int sock_fd, int file_fd, off_t offset, size_t len,
                       double timeout_s)
{
    for (;;) {
        int r = nw_io_sendfile_now(sock_fd, file_fd, &offset, &len);
        if (r == NW_IO_UNSUPPORTED)
            return copy_file_fallback(sock_fd, file_fd, offset, len, timeout_s);
        if (r != NW_IO_AGAIN)
            return r;
        int w = wait_writable(sock_fd, timeout_s);
        if (w != NW_IO_OK)
            return w;
    }
}

int nw_io_accept(int listen_fd, int is_tcp, struct sockaddr *peer,
                 unsigned *peer_len)
{
    int fd;
    do {
        socklen_t len = *peer_len;
        fd = accept4(listen_fd, peer, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        *peer_len = len;
    } while (fd < 0 && errno == EINTR);
    (void)is_tcp;   /* TCP_NODELAY is set on the listener; Linux copies it to accepted sockets */
    return fd;
}

int nw_io_set_nonblocking(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0)
        return -1;
    return fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

uint64_t nw_io_unsent(int fd)
{
    int n = 0;
    if (ioctl(fd, SIOCOUTQNSD, &n) < 0 || n < 0)
        return 0;
    return (uint64_t)n;
}

uint64_t nw_io_socket_cookie(int fd)
{
    uint64_t cookie = 0;
    socklen_t len = sizeof cookie;
    if (getsockopt(fd, SOL_SOCKET, SO_COOKIE, &cookie, &len) < 0 || len != sizeof cookie)
        return 0;
    return cookie;
}

int nw_io_writable_when_sent(int fd, int on)
{
    int lowat = on ? 1 : 0;     /* (0: the system's default, no limit) */
    return setsockopt(fd, IPPROTO_TCP, TCP_NOTSENT_LOWAT, &lowat, sizeof lowat);
}

nw_msec nw_head_deadline(nw_msec started, size_t bytes, double base, double max,
                         double min_rate)
{
    /* min_rate bytes buy one second counted from the head's start, with
     * base as the floor: a head that keeps coming at min_rate or faster
     * stays ahead of its deadline (up to max); a slower one has base and
     * not a moment more. (base + bytes / min_rate gave every trickled
     * byte its share: a head at 100 bytes/s under a 500 bytes/s rate had
     * 25% more than base.) */
    double seconds = min_rate > 0 ? (double)bytes / min_rate : 0;
    if (seconds < base)
        seconds = base;
    if (max <= base)
        seconds = base;
    else if (seconds > max)
        seconds = max;
    return started + (nw_msec)(seconds * 1000.0 + 0.5);
}

void nw_format_address(const struct sockaddr *sa, unsigned len, char *out, size_t cap)
{
    char host[INET6_ADDRSTRLEN];
    if (cap == 0)
        return;
    snprintf(out, cap, "?");
    if (sa->sa_family == AF_INET && len >= sizeof(struct sockaddr_in)) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
        inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
        snprintf(out, cap, "%s:%u", host, ntohs(in->sin_port));
    } else if (sa->sa_family == AF_INET6 && len >= sizeof(struct sockaddr_in6)) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
        inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
        snprintf(out, cap, "[%s]:%u", host, ntohs(in6->sin6_port));
    } else if (sa->sa_family == AF_UNIX) {
        const struct sockaddr_un *un = (const struct sockaddr_un *)sa;
        size_t n = len > offsetof(struct sockaddr_un, sun_path)
                 ? len - offsetof(struct sockaddr_un, sun_path) : 0;
        if (n > sizeof un->sun_path)
            n = sizeof un->sun_path;
        snprintf(out, cap, "%.*s", (int)strnlen(un->sun_path, n), un->sun_path);
    }
}

uint64_t nw_rss_bytes(int pid)
{
    char path[64], text[128];
    if (pid > 0)
        snprintf(path, sizeof path, "/proc/%d/statm", pid);
    else
        snprintf(path, sizeof path, "/proc/self/statm");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, text, sizeof text - 1);
    close(fd);
    if (n <= 0)
        return 0;
    text[n] = 0;
    unsigned long long size, resident;
    if (sscanf(text, "%llu %llu", &size, &resident) != 2)
        return 0;
    return (uint64_t)resident * (uint64_t)sysconf(_SC_PAGESIZE);
}

int nw_io_refuse_new_connections(int fd)
{
    struct sockaddr_storage name;
    socklen_t len = sizeof name;
    if (getsockname(fd, (struct sockaddr *)&name, &len) < 0)
        return -1;
    if (name.ss_family == AF_UNIX)
        return shutdown(fd, SHUT_RD);
    /* A socket filter sees the TCP header at offset 0: byte 13 holds its
     * flags. */
    struct sock_filter code[] = {
        BPF_STMT(BPF_LD | BPF_B | BPF_ABS, 13),
        BPF_STMT(BPF_ALU | BPF_AND | BPF_K, 0x12),         /* SYN and ACK */
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0x02, 0, 1),    /* SYN alone: */
        BPF_STMT(BPF_RET | BPF_K, 0),                       /* dropped */
        BPF_STMT(BPF_RET | BPF_K, 0xffffffffu),             /* the rest passes */
    };
    struct sock_fprog prog = { (unsigned short)(sizeof code / sizeof code[0]), code };
    if (setsockopt(fd, SOL_SOCKET, SO_ATTACH_FILTER, &prog, sizeof prog) == 0)
        return 0;
    /* Some kernels refuse socket filters to unprivileged processes: the
     * accept queue shrinks to nothing instead, so that a SYN is dropped
     * while anything is queued (at most one handshake completes at a
     * time, and the draining workers accept it). */
    return listen(fd, 0) == 0 ? 1 : -1;
}

int nw_io_listener_shut(int fd)
{
    struct pollfd p = { .fd = fd, .events = POLLRDHUP };
    return poll(&p, 1, 0) == 1 && (p.revents & POLLRDHUP);
}
