/* Socket I/O with deadlines: waiting, reading into a connection buffer,
 * writing iovec lists, sendfile, accept. Deadlines are absolute monotonic
 * times in milliseconds, computed once by the caller and never re-armed. */
#ifndef NW_IO_H
#define NW_IO_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

/* Results shared by the I/O calls (non-negative values are byte counts). */
#define NW_IO_OK           0
#define NW_IO_CLOSED      (-11)  /* peer closed, or a hard socket error */
#define NW_IO_TIMEOUT     (-12)  /* the deadline passed */
#define NW_IO_INTERRUPTED (-13)  /* a signal arrived; the caller decides */
#define NW_IO_AGAIN       (-14)  /* nothing yet, the wait is over, the deadline not reached */
#define NW_IO_UNSUPPORTED (-15)  /* sendfile(2) cannot be used for this pair */

typedef int64_t nw_msec;

nw_msec nw_now_ms(void);
/* The same clock in microseconds. */
uint64_t nw_now_us(void);
/* The same clock as of the kernel's last timekeeping update
 * (CLOCK_MONOTONIC_COARSE): never ahead of nw_now_ms, up to
 * nw_coarse_lag_ms behind, at a fifth of the cost of a precise reading.
 * For a stamp that only a threshold of tens of milliseconds reads. */
nw_msec nw_coarse_ms(void);
nw_msec nw_coarse_tick_ms(void);    /* its resolution, rounded up (at least 1) */
/* How far behind it may be: two ticks and a millisecond of rounding. The
 * update comes with a tick, which a virtual CPU may take a tick late
 * (measured: up to 8 ms behind with a 4 ms tick, a third of the time more
 * than one tick and a millisecond). */
nw_msec nw_coarse_lag_ms(void);

/* CLOCK_REALTIME in nanoseconds: the clock of the kernel's receive times. */
int64_t nw_wall_clock_ns(void);

/* The deadline of a request head that began at started and has brought
 * bytes so far: one second per min_rate bytes from started, never less
 * than base seconds nor more than max. A head arriving at min_rate bytes
 * a second or faster keeps going; a slower one has base seconds. The
 * worker and the manager both use it. */
nw_msec nw_head_deadline(nw_msec started, size_t bytes, double base, double max,
                         double min_rate);
nw_msec nw_deadline_in(double seconds);     /* now + seconds */
nw_msec nw_deadline_at(nw_msec now, double seconds);    /* the same, from a reading taken */

/* Wait until fd is ready for events (POLLIN/POLLOUT) or deadline.
 * Returns NW_IO_OK, NW_IO_TIMEOUT or NW_IO_INTERRUPTED. */
int nw_io_wait(int fd, short events, nw_msec deadline);

/* One read into buf, waiting up to deadline. Returns bytes (> 0),
 * NW_IO_CLOSED, NW_IO_TIMEOUT or NW_IO_INTERRUPTED. With arrived_ns, the
 * read is a recvmsg(2) that also asks for the kernel's receive time of the
 * last bytes read (SO_TIMESTAMPNS, see nw_io_stamp_arrivals): stored there
 * in CLOCK_REALTIME nanoseconds when the kernel gave one, else left alone. */
ssize_t nw_io_read(int fd, char *buf, size_t len, nw_msec deadline, int64_t *arrived_ns);

/* A read that waits at most wait_s (sub-millisecond precision, no deadline):
 * bytes, NW_IO_CLOSED, NW_IO_TIMEOUT or NW_IO_INTERRUPTED. arrived_ns as
 * for nw_io_read. */
ssize_t nw_io_read_brief(int fd, char *buf, size_t len, double wait_s, int64_t *arrived_ns);

/* recv(2) with flags that also stores the kernel's receive time of the
 * last bytes read in arrived_ns (CLOCK_REALTIME ns) when it gave one. */
ssize_t nw_io_recv_stamped(int fd, char *buf, size_t len, int flags, int64_t *arrived_ns);

/* Connections waiting in a TCP listener's accept queue (TCP_INFO), or -1
 * (not a TCP listener, or an error). */
int nw_io_accept_queue(int fd);

/* Ask the kernel to stamp what arrives on a TCP listener's connections with
 * its receive time (SO_TIMESTAMPNS; accepted sockets inherit it), so that
 * the wait of a request in the listen queue or parked in a busy worker can
 * be measured. A unix socket gives no such time. Returns 0 or -1. */
int nw_io_stamp_arrivals(int fd);

/* Write all of iov[0..iovcnt) (the array is modified), in batches of at most
 * NW_IOV_BATCH, each wait bounded by now + timeout_s. Returns NW_IO_OK,
 * NW_IO_CLOSED or NW_IO_TIMEOUT. Signals do not interrupt a write. */
int nw_io_writev_all(int fd, struct iovec *iov, int iovcnt, double timeout_s);

/* Write what the socket takes now of iov[0..*iovcnt), without waiting:
 * *iov and *iovcnt are advanced past what was written. Returns NW_IO_OK
 * (all written), NW_IO_AGAIN (the socket is full; the rest is left) or
 * NW_IO_CLOSED. */
int nw_io_writev_now(int fd, struct iovec **iov, int *iovcnt);

/* sendfile(2) what the socket takes now of *len bytes from *offset (both
 * advanced). NW_IO_OK, NW_IO_AGAIN or NW_IO_CLOSED; NW_IO_UNSUPPORTED when
 * sendfile cannot be used for the pair (nothing was sent). */
int nw_io_sendfile_now(int sock_fd, int file_fd, off_t *offset, size_t *len);

/* Send len bytes of file_fd from offset. Falls back to pread+write when
 * sendfile(2) is not supported for the pair. Same results as writev_all. */
int nw_io_sendfile_all(int sock_fd, int file_fd, off_t offset, size_t len,
                       double timeout_s);

struct sockaddr;
/* Accept one connection from a non-blocking listener: SOCK_NONBLOCK and
 * SOCK_CLOEXEC set (TCP_NODELAY comes from the listener). The peer address goes to peer
 * (*peer_len in: its size, out: the address length). Returns the fd, or -1
 * with errno (EAGAIN when the queue is empty). */
int nw_io_accept(int listen_fd, int is_tcp, struct sockaddr *peer,
                 unsigned *peer_len);

/* Set O_NONBLOCK on fd. Returns 0 or -1. */
int nw_io_set_nonblocking(int fd);

/* Bytes written to a TCP socket that the kernel has not sent yet: a
 * response that has left the server's own buffers but not the socket's
 * (a slow reader's). 0: none, or not a TCP socket. */
uint64_t nw_io_unsent(int fd);

/* The socket's cookie (SO_COOKIE, unique for the life of the kernel; the
 * same for every copy of the descriptor): 0 when there is none, not a
 * socket or an old kernel. A worker names the connections it gives the
 * manager in custody by it, and the manager finds its copies by it. */
uint64_t nw_io_socket_cookie(int fd);

/* on: the socket polls writable only once the kernel has sent everything
 * written to it (TCP_NOTSENT_LOWAT 1); off: as usual again. 0, or -1 (not
 * TCP). */
int nw_io_writable_when_sent(int fd, int on);

/* A process's resident set size in bytes, from /proc/PID/statm (pid 0:
 * this process); 0 when it cannot be read. */
uint64_t nw_rss_bytes(int pid);

/* "host:port" ([v6]:port) or a unix path for a socket address, in out
 * (always NUL-terminated; "?" when the family is unknown). */
struct sockaddr;
void nw_format_address(const struct sockaddr *sa, unsigned len, char *out, size_t cap);

/* Make a listener refuse new connections while the ones already in its
 * queue can still be accepted, so that closing it resets nothing the
 * kernel had accepted. TCP: a socket filter drops every bare SYN (the
 * peer's kernel sends it again, and meets a refusal once the listener is
 * closed); handshakes under way still complete. Where the kernel refuses
 * the filter to an unprivileged process, the accept queue's length
 * becomes 0 instead: SYNs are dropped while a connection is queued, so
 * at most one completes at a time (returns 1 then). A unix socket is
 * shut for reading: a connect() fails at once with ECONNREFUSED, and the
 * listener reads as always ready from then on (nw_io_listener_shut).
 * Returns 0, 1 (TCP, the queue shortened), or -1 with errno. */
int nw_io_refuse_new_connections(int fd);

/* Whether a unix-socket listener was shut by nw_io_refuse_new_connections
 * (in any process that shares it): nothing new can come, and epoll will
 * report it ready for good. */
int nw_io_listener_shut(int fd);

#endif
