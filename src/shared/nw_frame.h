/* Frames between the master, the workers and the connection manager.
 * One frame is one sendmsg on a SOCK_SEQPACKET socket: a fixed header, an
 * optional fd (SCM_RIGHTS) and data_len bytes, so a connection, its state
 * and the bytes already read from it always travel together.
 * See docs/PROTOCOL.md. */
#ifndef NW_FRAME_H
#define NW_FRAME_H

#include <stddef.h>
#include <stdint.h>
#include <netinet/in.h>
#include <sys/types.h>

#define NW_FRAME_MAGIC    0x3146574eu   /* "NWF1" little-endian */
#define NW_FRAME_MAX_DATA (128 * 1024)  /* bytes after the header, at most */
#define NW_FRAME_MAX_FDS  2             /* descriptors one frame carries, at most */
#define NW_ADOPT_BATCH    253           /* connections one ADOPT frame carries, at most: the
                                         * kernel passes that many descriptors in one message
                                         * (SCM_MAX_FD), and a unix socket queues about ten
                                         * messages (net.unix.max_dgram_qlen) */

/* The manager's descriptors, as the master passes them to the program it
 * execs (docs/PROTOCOL.md, "Sockets"). */
#define NW_MANAGER_CONTROL_FD       3   /* control: STATS to the master */
#define NW_MANAGER_HANDOFF_QUEUE_FD 4   /* HANDOFF frames from every worker */
#define NW_MANAGER_SERVE_QUEUE_FD   5   /* SERVE frames for whichever worker is free */
#define NW_MANAGER_SCOREBOARD_FD    6   /* the scoreboard's memfd (read-only) */
#define NW_MANAGER_SERVE_READER_FD  7   /* the workers' end of the serve queue (shedding) */
#define NW_MANAGER_STATUS_FD        8   /* the --status-listen listener */
#define NW_MANAGER_LISTENERS_FD     9   /* the app's listeners from here on (never accepted on) */

enum nw_frame_type {
    NW_FRAME_HANDOFF = 1,   /* worker -> manager (the handoff queue): a connection going idle, fd + unread bytes */
    NW_FRAME_SERVE   = 2,   /* manager -> workers (the serve queue): a connection with a complete head, fd + bytes */
    NW_FRAME_STATS   = 5,   /* manager -> master: data is nw_manager_stats (no fd) */
    NW_FRAME_ADOPT   = 6,   /* worker -> workers (the adopt queue): a leaving worker's parked
                             * connections, up to NW_ADOPT_BATCH fds + one nw_frame_adoptee each */
    NW_FRAME_CUSTODY = 7,   /* worker -> manager (the handoff queue): a copy of a connection the
                             * worker parked, for the manager to hold in case the worker dies
                             * (fd + nw_frame_custody, then a PROXY header); with RELEASE, no
                             * fd: let it go */
};
#define NW_FRAME_LAST NW_FRAME_CUSTODY

#define NW_FRAME_F_HEAD_STARTED 1u  /* deadline_ms is a read deadline: part of a head arrived */
#define NW_FRAME_F_PROXY        2u  /* --proxy-protocol: the data begins with a PROXY header */
#define NW_FRAME_F_OUTPUT       4u  /* HANDOFF: the rest of a response to write first (a second fd,
                                     * and the data begins with an nw_frame_output) */
#define NW_FRAME_F_DRAINED      8u  /* SERVE: the manager's last read of the socket was short: the
                                     * data is all the client had sent (closing it after a
                                     * response needs no lingering) */
#define NW_FRAME_F_RELEASE     16u  /* CUSTODY: the worker lent the socket to the app (psgix.io):
                                     * the manager closes its copy and forgets it */

typedef struct {
    uint32_t magic;
    uint16_t type;
    uint16_t listener;      /* listener index the connection came through */
    uint32_t requests;      /* requests already served on the connection */
    int32_t  deadline_ms;   /* ms left on the connection's deadline; -1: none */
    uint32_t flags;
    uint32_t data_len;      /* bytes following the header */
    uint32_t ready_ms;      /* SERVE: the monotonic clock (ms, mod 2^32) when the head was complete;
                             * HANDOFF with HEAD_STARTED: when the head's first byte came */
} nw_frame;

/* In front of a HANDOFF's data when it has NW_FRAME_F_OUTPUT: what is left
 * of the response, in the frame's second descriptor (a file, or a memfd
 * holding the unsent bytes). */
typedef struct {
    uint64_t offset;        /* where the rest begins in that descriptor */
    uint64_t length;        /* bytes to send from there */
    uint64_t counted;       /* bytes of it counted against --max-offload-total (a memfd) */
    uint32_t keep_alive;    /* 1: the connection serves another request after it; 0: close */
    uint32_t reserved;      /* 0 */
} nw_frame_output;

/* One connection of an ADOPT frame, in the order of its descriptors: what
 * is the connection's own travels with it (docs/PROTOCOL.md, "ADOPT"). */
typedef struct {
    uint16_t listener;      /* listener index the connection came through */
    uint16_t peer_len;      /* bytes of peer used; 0: ask the socket (getpeername) */
    uint32_t requests;      /* requests already served on the connection */
    int32_t  deadline_ms;   /* ms left until its keep-alive deadline */
    uint16_t flags;         /* NW_ADOPT_F_* */
    uint16_t local_len;     /* bytes of local used; 0: none */
    struct sockaddr_in6 peer;   /* the client's IPv4 or IPv6 address (a PROXY header's
                                 * when it gave one) */
    struct sockaddr_in6 local;  /* a PROXY header's destination (with NW_ADOPT_F_PROXY) */
} nw_frame_adoptee;

/* In front of a CUSTODY's data: which socket, and whose. A PROXY v2
 * header may follow (with NW_FRAME_F_PROXY), as in a HANDOFF. */
typedef struct {
    uint64_t cookie;        /* the socket's SO_COOKIE: the manager finds its copy by it */
    int32_t  pid;           /* the worker that holds it: when that process ends, the
                             * manager takes the connection over or closes it */
    uint32_t reserved;      /* 0 */
} nw_frame_custody;

#define NW_ADOPT_F_PROXY_PENDING 1u /* --proxy-protocol: its header has not been read yet */
#define NW_ADOPT_F_PROXY         2u /* its header was read: peer and local are what it said */
#define NW_ADOPT_F_PROXY_LOCAL   4u /* its header was LOCAL (or UNKNOWN): the socket's addresses */

typedef struct {
    uint64_t idle;              /* connections held now */
    uint64_t queued;            /* complete heads waiting for a free worker */
    uint64_t handed_off;        /* SERVE frames sent, total */
    uint64_t received;          /* HANDOFF frames received, total */
    uint64_t closed_timeout;    /* closed by keep-alive or read timeout, total */
    uint64_t closed_full;       /* closed to stay under --max-connections, total */
    uint64_t closed_peer;       /* closed by the client while idle, total */
    uint64_t serve_queue_full;  /* times the serve queue had no room, total */
    uint64_t shed;              /* requests answered 503 by --max-queue-wait, total */
    uint64_t writing;           /* connections whose response the manager is writing now */
    uint64_t offloaded;         /* responses workers gave the manager to finish, total */
    uint64_t accepted;          /* connections it took from the listeners (a stuck pool), total */
} nw_manager_stats;

void nw_frame_init(nw_frame *f, int type);

/* Send one frame; fd < 0 sends none. Returns 0, or -1 with errno
 * (EAGAIN when the socket is full and non-blocking). */
int nw_frame_send(int sock, const nw_frame *f, const void *data, int fd);

/* The same with the data in two pieces, prefix_len bytes of prefix then
 * data (f->data_len counts both): no copy, and safe in a signal handler. */
int nw_frame_send_prefixed(int sock, const nw_frame *f, const void *prefix, size_t prefix_len,
                           const void *data, int fd);

/* The same with up to NW_ADOPT_BATCH descriptors. */
int nw_frame_send_fds(int sock, const nw_frame *f, const void *prefix, size_t prefix_len,
                      const void *data, const int *fds, int nfds);

/* Receive one frame into *f and data (room for cap bytes). *fd_out gets the
 * first passed fd or -1 (any other is closed). Returns 1 for a frame, 0 at end of stream, -1 with errno
 * (EAGAIN: nothing waiting; EBADMSG: malformed or truncated frame, any fd
 * that came with it already closed). */
int nw_frame_recv(int sock, nw_frame *f, void *data, size_t cap, int *fd_out);

/* The same keeping up to NW_FRAME_MAX_FDS descriptors, in order, in fds
 * (the rest of it -1; any beyond closed). */
int nw_frame_recv_fds(int sock, nw_frame *f, void *data, size_t cap, int *fds);

/* The same keeping up to max (at most NW_ADOPT_BATCH) descriptors; *nfds
 * gets how many came. */
int nw_frame_recv_many(int sock, nw_frame *f, void *data, size_t cap, int *fds, int max, int *nfds);

#endif
