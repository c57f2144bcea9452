/* What custody of a parked connection would cost, per connection: the
 * worker passes a copy of the socket to the manager once (SCM_RIGHTS), the
 * manager watches it for hang-ups only (EPOLLRDHUP), and when the worker
 * closes the connection it shuts it down first, so that the FIN leaves
 * although the manager still holds a copy; the manager then sees the
 * hang-up and closes its copy. Timed against the same connection's life
 * without custody (accept, close). docs/DESIGN.md, "Custody of parked connections".
 *
 *   cc -O2 -o /tmp/custody-cost bench/src/custody-cost.c && /tmp/custody-cost 20000
 */
#define _GNU_SOURCE
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static void pass_fd(int chan, int fd)
{
    char byte = 0, ctl[CMSG_SPACE(sizeof(int))];
    struct iovec v = { &byte, 1 };
    struct msghdr m = { .msg_iov = &v, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof ctl };
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof fd);
    if (sendmsg(chan, &m, 0) != 1)
        perror("sendmsg"), exit(1);
}

static int take_fd(int chan)
{
    char byte, ctl[CMSG_SPACE(sizeof(int))];
    struct iovec v = { &byte, 1 };
    struct msghdr m = { .msg_iov = &v, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof ctl };
    if (recvmsg(chan, &m, MSG_CMSG_CLOEXEC) != 1)
        perror("recvmsg"), exit(1);
    int fd;
    memcpy(&fd, CMSG_DATA(CMSG_FIRSTHDR(&m)), sizeof fd);
    return fd;
}

/* One connection's life: connect, accept, (custody: pass a copy, the
 * manager adds it), close by the server (custody: shutdown first; the
 * manager sees the hang-up, closes its copy), the client sees EOF. */
static double run(int n, int custody)
{
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t len = sizeof a;
    int l = socket(AF_INET, SOCK_STREAM, 0), chan[2];
    if (bind(l, (struct sockaddr *)&a, sizeof a) || listen(l, 128) || getsockname(l, (struct sockaddr *)&a, &len)
        || socketpair(AF_UNIX, SOCK_SEQPACKET, 0, chan))
        perror("setup"), exit(1);
    int ep = epoll_create1(0);
    double t0 = now(), custody_time = 0;
    for (int i = 0; i < n; i++) {
        int c = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(c, (struct sockaddr *)&a, sizeof a))
            perror("connect"), exit(1);
        int s = accept4(l, NULL, NULL, SOCK_NONBLOCK);
        double t1 = now();
        if (custody) {
            pass_fd(chan[0], s);                  /* worker: first park */
            int copy = take_fd(chan[1]);          /* manager */
            struct epoll_event ev = { .events = EPOLLRDHUP, .data.fd = copy };
            epoll_ctl(ep, EPOLL_CTL_ADD, copy, &ev);
            shutdown(s, SHUT_RDWR);               /* worker: the FIN leaves now */
            close(s);
            struct epoll_event got;
            if (epoll_wait(ep, &got, 1, 1000) != 1)   /* manager: the hang-up */
                fprintf(stderr, "no hang-up seen\n"), exit(1);
            close(got.data.fd);                   /* (close removes it from the set) */
        } else {
            close(s);
        }
        custody_time += now() - t1;
        char b;
        if (read(c, &b, 1) != 0)
            fprintf(stderr, "the client did not see EOF\n"), exit(1);
        close(c);
    }
    (void)t0;
    close(l);
    close(chan[0]);
    close(chan[1]);
    close(ep);
    return custody_time / n;
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 20000;
    for (int round = 0; round < 3; round++) {
        double plain = run(n, 0), kept = run(n, 1);
        printf("round %d: the server's close alone %.2f us; with custody %.2f us: +%.2f us a connection\n",
               round + 1, plain * 1e6, kept * 1e6, (kept - plain) * 1e6);
    }
    return 0;
}
