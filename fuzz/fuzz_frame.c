/* libFuzzer harness for src/shared/nw_frame.c: nw_frame_recv and
 * nw_frame_recv_fds on arbitrary datagrams carrying arbitrary numbers of
 * descriptors.
 *
 * Input: byte 0 says how many descriptors go with the datagram (low three
 * bits: 0..7, each a new descriptor), whether the receiver's data
 * buffer is short (bit 3: 16 bytes instead of NW_FRAME_MAX_DATA) and
 * which receiver reads it (bit 4: nw_frame_recv_fds, keeping up to
 * NW_FRAME_MAX_FDS descriptors, as the manager reads the handoff queue); the
 * rest is the datagram, sent as one message on a SOCK_SEQPACKET pair, as
 * the workers and the manager send frames. Checked with abort():
 *   - nothing leaks: after the call (and closing what it returned) the
 *     process has exactly the descriptors it had before;
 *   - a frame it accepts (1) has the magic, a known type, data_len within
 *     the buffer and equal to what was sent after the header, and one of
 *     the descriptors sent when any were (open, close-on-exec), none
 *     otherwise;
 *   - a frame it refuses (-1) says EBADMSG and returns no descriptor.
 *
 * Build and run: make -f fuzz.mk run-frame (fuzz/README.md).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "nw_frame.h"

#define FZ_CHECK(cond) do { if (!(cond)) abort(); } while (0)
#define FZ_MAX_FDS   7
#define FZ_SHORT_CAP 16

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int fz_open_fds(void)
{
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    FZ_CHECK(d != NULL);
    while (readdir(d))
        n++;
    closedir(d);
    return n;
}

/* An accepted frame passes on one of the descriptors sent, if any were:
 * open, close-on-exec (a worker's exec must not inherit a client), and
 * the /dev/null fz_send opened, not some other descriptor. */
static int fz_fd_is_sent_one(int fd, int nfds)
{
    struct stat got, devnull;
    if (nfds == 0)
        return fd == -1;
    if (fd < 0 || !(fcntl(fd, F_GETFD) & FD_CLOEXEC))
        return 0;
    return fstat(fd, &got) == 0 && stat("/dev/null", &devnull) == 0
           && got.st_rdev == devnull.st_rdev && S_ISCHR(got.st_mode);
}

/* Send bytes with nfds descriptors (new ones) as one datagram. */
static int fz_send(int sock, const uint8_t *bytes, size_t len, int nfds)
{
    union { char buf[CMSG_SPACE(sizeof(int) * FZ_MAX_FDS)]; struct cmsghdr align; } ctl;
    struct iovec iov = { (void *)bytes, len };
    struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
    int fds[FZ_MAX_FDS];
    for (int i = 0; i < nfds; i++)
        FZ_CHECK((fds[i] = open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0);
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
    ssize_t n = sendmsg(sock, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
    for (int i = 0; i < nfds; i++)
        close(fds[i]);              /* the datagram holds its own references */
    return n == (ssize_t)len ? 0 : -1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int pair[2] = { -1, -1 };
    static char buf[NW_FRAME_MAX_DATA];
    if (size < 1 || size > 1 + 65536)
        return 0;
    if (pair[0] < 0)
        FZ_CHECK(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) == 0);
    int nfds = data[0] & 7;
    size_t cap = (data[0] & 8) ? FZ_SHORT_CAP : sizeof buf;
    const uint8_t *bytes = data + 1;
    size_t len = size - 1;

    int before = fz_open_fds();
    if (fz_send(pair[1], bytes, len, nfds) < 0)
        return 0;                   /* too big for the socket: not a frame anyone sends */
    nw_frame f;
    int fd = -2, fds[NW_FRAME_MAX_FDS];
    errno = 0;
    int many = (data[0] & 16) != 0;
    int r = many ? nw_frame_recv_fds(pair[0], &f, buf, cap, fds)
                 : nw_frame_recv(pair[0], &f, buf, cap, &fd);
    if (many) {
        /* the first descriptor answers as the one-fd reader's does; the
         * second is one of those sent too, or -1 when fewer came */
        fd = fds[0];
        if (r == 1)
            FZ_CHECK(nfds < 2 ? fds[1] == -1 : fz_fd_is_sent_one(fds[1], nfds));
        else
            FZ_CHECK(fds[1] == -1);
        if (fds[1] >= 0)
            close(fds[1]);
    }
    if (len == 0) {
        /* an empty datagram reads as end of stream */
        FZ_CHECK(r == 0 || (r == -1 && fd == -1));
    } else if (r == 1) {
        FZ_CHECK(f.magic == NW_FRAME_MAGIC);
        FZ_CHECK(f.type == NW_FRAME_HANDOFF || f.type == NW_FRAME_SERVE || f.type == NW_FRAME_STATS
                 || f.type == NW_FRAME_ADOPT);
        FZ_CHECK(f.data_len <= cap && sizeof f + f.data_len == len);
        FZ_CHECK(fz_fd_is_sent_one(fd, nfds));
        FZ_CHECK(memcmp(&f, bytes, sizeof f) == 0 && memcmp(buf, bytes + sizeof f, f.data_len) == 0);
    } else {
        FZ_CHECK(r == -1 && errno == EBADMSG && fd == -1);
    }
    if (fd >= 0)
        close(fd);
    FZ_CHECK(fz_open_fds() == before);
    return 0;
}
