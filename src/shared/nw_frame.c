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
    return nw_frame_send_fds(sock, f, prefix, prefix_len, data, &fd, fd >= 0);
}

int nw_frame_send_fds(int sock, const nw_frame *f, const void *prefix, size_t prefix_len,
                      const void *data, const int *fds, int nfds)
{
    union { char buf[CMSG_SPACE(sizeof(int) * NW_ADOPT_BATCH)]; struct cmsghdr align; } ctl;
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
    if (nfds < 0 || nfds > NW_ADOPT_BATCH) {
        errno = EINVAL;
        return -1;
    }
    if (nfds > 0) {
        memset(&ctl, 0, sizeof ctl);
        msg.msg_control = ctl.buf;
        msg.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
        struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
        memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)nfds);
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

/* Take every fd in the control data; keep the first max, close the others.
 * Returns how many were kept. */
static int collect_fds(struct msghdr *msg, int *fds, int max)
{
    int kept = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(msg); c; c = CMSG_NXTHDR(msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < n; i++) {
            int fd;
            memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
            if (kept < max)
                fds[kept++] = fd;
            else
                close(fd);
        }
    }
    return kept;
}

static void close_fds(int *fds, int n)
{
    for (int i = 0; i < n; i++) {
        if (fds[i] >= 0)
            close(fds[i]);
        fds[i] = -1;
    }
}

int nw_frame_recv(int sock, nw_frame *f, void *data, size_t cap, int *fd_out)
{
    int fds[NW_FRAME_MAX_FDS];
    int r = nw_frame_recv_fds(sock, f, data, cap, fds);
    if (r > 0 && fds[1] >= 0) {   /* a frame for a reader of one: the extra one goes */
        close(fds[1]);
        fds[1] = -1;
    }
    *fd_out = fds[0];
    return r;
}

int nw_frame_recv_fds(int sock, nw_frame *f, void *data, size_t cap, int *fds)
{
    int n;
    return nw_frame_recv_many(sock, f, data, cap, fds, NW_FRAME_MAX_FDS, &n);
}

int nw_frame_recv_many(int sock, nw_frame *f, void *data, size_t cap, int *fds, int max, int *nfds)
{
    /* room for a whole ADOPT batch whatever the reader keeps: a frame's
     * descriptors beyond the room would be closed by the kernel unseen */
    union { char buf[CMSG_SPACE(sizeof(int) * NW_ADOPT_BATCH)]; struct cmsghdr align; } ctl;
    struct iovec iov[2] = { { f, sizeof *f }, { data, cap } };
    struct msghdr msg = { .msg_iov = iov, .msg_iovlen = 2,
                          .msg_control = ctl.buf, .msg_controllen = sizeof ctl.buf };
    ssize_t n;
    if (max > NW_ADOPT_BATCH)
        max = NW_ADOPT_BATCH;
    *nfds = 0;
    for (int i = 0; i < max; i++)
        fds[i] = -1;
    do {
        n = recvmsg(sock, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    } while (n < 0 && errno == EINTR);
    if (n < 0)
        return -1;
    *nfds = collect_fds(&msg, fds, max);
    if (n == 0) {
        /* end of stream, or an empty datagram: any fd that came with it
         * was installed in this process and must not leak (found by
         * fuzz/fuzz_frame.c) */
        close_fds(fds, max);
        *nfds = 0;
        return 0;
    }
    if ((msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) || (size_t)n < sizeof *f
        || f->magic != NW_FRAME_MAGIC || f->data_len > cap
        || (size_t)n != sizeof *f + f->data_len
        || f->type < NW_FRAME_HANDOFF || f->type > NW_FRAME_LAST
        || (f->type > NW_FRAME_SERVE && f->type < NW_FRAME_STATS)) {
        close_fds(fds, max);
        *nfds = 0;
        errno = EBADMSG;
        return -1;
    }
    return 1;
}
