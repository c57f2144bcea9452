#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "nw_frame.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

void nw_frame_init(nw_frame *f, int type)
{
    memset(f, 0, sizeof *f);
    f->magic = NW_FRAME_MAGIC;
    f->type = (uint16_t)type;
    f->deadline_ms = -1;
}

int nw_frame_send(int sock, const nw_frame *f, const void *data, int fd)
{
    return nw_frame_send_prefixed(sock, f, NULL, 0, data, fd);
}

int nw_frame_send_prefixed(int sock, const nw_frame *f, const void *prefix, size_t prefix_len,
                           const void *data, int fd)
{
    union { char buf[CMSG_SPACE(sizeof(int))]; struct cmsghdr align; } ctl;
    struct iovec iov[3] = { { (void *)f, sizeof *f }, { (void *)prefix, prefix_len },
                            { (void *)data, f->data_len - prefix_len } };
    struct msghdr msg = { .msg_iov = iov, .msg_iovlen = 3 };
    if (prefix_len > f->data_len) {
        errno = EINVAL;
        return -1;
    }
    if (f->data_len > NW_FRAME_MAX_DATA) {
        errno = EMSGSIZE;
        return -1;
    }
    if (fd >= 0) {
        memset(&ctl, 0, sizeof ctl);
        msg.msg_control = ctl.buf;
        msg.msg_controllen = sizeof ctl.buf;
        struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(c), &fd, sizeof(int));
    }
    ssize_t n;
    do {
        n = sendmsg(sock, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    } while (n < 0 && errno == EINTR);
    if (n < 0)
        return -1;
    if ((size_t)n != sizeof *f + f->data_len) {   /* SEQPACKET is all or nothing */
        errno = EMSGSIZE;
        return -1;
    }
    return 0;
}

/* Take every fd in the control data; keep the first, close the others. */
static int collect_fds(struct msghdr *msg)
{
    int keep = -1;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(msg); c; c = CMSG_NXTHDR(msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < n; i++) {
            int fd;
            memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
            if (keep < 0)
                keep = fd;
            else
                close(fd);
        }
    }
    return keep;
}

static int bad_frame(int *fd_out)
{
    if (*fd_out >= 0)
        close(*fd_out);
    *fd_out = -1;
    errno = EBADMSG;
    return -1;
}

int nw_frame_recv(int sock, nw_frame *f, void *data, size_t cap, int *fd_out)
{
    union { char buf[CMSG_SPACE(sizeof(int) * 4)]; struct cmsghdr align; } ctl;
    struct iovec iov[2] = { { f, sizeof *f }, { data, cap } };
    struct msghdr msg = { .msg_iov = iov, .msg_iovlen = 2,
                          .msg_control = ctl.buf, .msg_controllen = sizeof ctl.buf };
    ssize_t n;
    *fd_out = -1;
    do {
        n = recvmsg(sock, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    } while (n < 0 && errno == EINTR);
    if (n < 0)
        return -1;
    *fd_out = collect_fds(&msg);
    if (n == 0) {
        /* end of stream, or an empty datagram: any fd that came with it
         * was installed in this process and must not leak (found by
         * fuzz/fuzz_frame.c) */
        if (*fd_out >= 0)
            close(*fd_out);
        *fd_out = -1;
        return 0;
    }
    if ((msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) || (size_t)n < sizeof *f
        || f->magic != NW_FRAME_MAGIC || f->data_len > cap
        || (size_t)n != sizeof *f + f->data_len
        || f->type < NW_FRAME_HANDOFF || f->type > NW_FRAME_LAST
        || (f->type > NW_FRAME_SERVE && f->type < NW_FRAME_STATS))
        return bad_frame(fd_out);
    return 1;
}
