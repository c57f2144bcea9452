/* The connection manager's records (DESIGN.md, "The connection manager"):
 * one per descriptor it holds, in a slab indexed by fd, so that an epoll
 * event needs no other lookup: client connections, the copies of the
 * workers' parked connections (custody) and the workers' pidfds. Client
 * connections are also on one deadline-ordered list per state. List links
 * are fds, not pointers, because the slab moves when it grows.
 *
 * An fd is always taken out of epoll (EPOLL_CTL_DEL) before it is closed:
 * the master still holds a copy of every worker channel, and a worker may
 * not yet have closed its copy of a handed-off client, and epoll forgets an
 * fd only when the last copy closes. */
#ifndef NW_MGR_TABLE_H
#define NW_MGR_TABLE_H

#include <stddef.h>
#include <stdint.h>
#include "nw_io.h"

/* What an fd's record is: where it is and who owns the next move. */
enum {
    NW_MGR_FREE = 0,    /* no record (or a connection being passed on) */
    NW_MGR_IDLE,        /* client, no head yet: epoll + idle list */
    NW_MGR_READING,     /* client, part of a head: epoll + reading list */
    NW_MGR_QUEUED,      /* client, head complete, the serve queue full: queue, no epoll */
    NW_MGR_WRITING,     /* client, the rest of a response to write: epoll (out) + writing list */
    NW_MGR_CLOSING,     /* client, written and half-closed: epoll + closing list, drained */
    NW_MGR_CUSTODY,     /* a copy of a connection a worker holds: epoll (hang-up only), the
                         * custody index; never read (DESIGN.md, "Custody") */
    NW_MGR_WORKER,      /* a pidfd of a worker that has connections in custody: epoll */
    NW_MGR_KINDS
};

#define NW_MGR_F_LINE_SEEN   1u  /* connection: an LF arrived, so the request line ended */
#define NW_MGR_F_PROXY       2u  /* connection: its bytes begin with a PROXY header */
#define NW_MGR_F_OUT_KEEP    4u  /* writing: the connection stays open after the response */
#define NW_MGR_F_OUT_COUNTED 8u  /* writing: its rest counts against --max-offload-total */
#define NW_MGR_F_DRAINED    16u  /* connection: its last read was short (SERVE says so) */
#define NW_MGR_F_UNSENT     32u  /* writing: the response has left us but not the socket;
                                  * out_left: what the kernel had not sent, last we looked */

#define NW_MGR_NONE (-1)

/* 64 bytes on LP64. */
typedef struct {
    char    *head;          /* bytes of a head read so far (writing: read past the
                             * last request); NULL while none */
    nw_msec  deadline;      /* absolute; lists are ordered by it */
    union {
        nw_msec head_started;   /* reading: the head's first byte came then */
        int64_t out_off;        /* writing: where the rest goes on in out_fd */
        uint64_t cookie;        /* custody: the socket's SO_COOKIE */
    };
    int32_t  prev, next;    /* list links (fds) */
    uint32_t head_len, head_cap;
    uint32_t requests;      /* connection: requests served; worker: its pid */
    union {
        uint32_t ready_ms;  /* its head was complete then (SERVE's ready_ms) */
        int32_t  owner;     /* custody: the pid of the worker that holds it */
    };
    uint16_t listener;
    uint8_t  kind;
    uint8_t  flags;
    int32_t  out_fd;        /* writing: the rest of the response (a file or a memfd);
                             * 0: none (fd 0 is the manager's stdin, never a rest) */
    uint64_t out_left;      /* writing: bytes of it still to send */
} nw_mgr_slot;

typedef struct {
    int32_t first, last;
    size_t  len;
} nw_mgr_list;

typedef struct {
    nw_mgr_slot *slots;
    size_t  nslots;
    nw_mgr_list list[NW_MGR_KINDS];     /* the client kinds' lists (IDLE .. CLOSING) */
    int     ep;
    size_t  max_conns;                  /* --max-connections; 0: no limit */
    size_t  outside;                    /* connections another part holds that count
                                         * against it (the TLS part's) */
    volatile int64_t *offload_bytes;    /* the board's --max-offload-total count, or NULL */
    uint64_t closed_full;               /* idle ones closed to make room, total */
} nw_mgr_table;

void nw_mgr_table_init(nw_mgr_table *t, int ep, size_t max_conns,
                       volatile int64_t *offload_bytes);

/* Room for a record at fd. 0, or -1 (no memory, or fd < 0). */
int nw_mgr_table_reserve(nw_mgr_table *t, int fd);

static inline nw_mgr_slot *nw_mgr_table_slot(const nw_mgr_table *t, int fd)
{
    return &t->slots[fd];
}

/* Whether fd has a record (it may be FREE). */
static inline int nw_mgr_table_has(const nw_mgr_table *t, int fd)
{
    return fd >= 0 && (size_t)fd < t->nslots;
}

/* One past the highest fd that can have a record. */
static inline size_t nw_mgr_table_size(const nw_mgr_table *t)
{
    return t->nslots;
}

/* Connections closed to stay under --max-connections, total. */
static inline uint64_t nw_mgr_table_closed_full(const nw_mgr_table *t)
{
    return t->closed_full;
}

/* A zeroed record for fd (reserved). */
nw_mgr_slot *nw_mgr_table_fresh(nw_mgr_table *t, int fd);

/* fd in epoll for events, or taken out; events changed for one in it. */
int nw_mgr_table_watch(nw_mgr_table *t, int fd, uint32_t events);
void nw_mgr_table_unwatch(nw_mgr_table *t, int fd);
int nw_mgr_table_rewatch(nw_mgr_table *t, int fd, uint32_t events);

/* Put fd on the list of kind (a client kind), in deadline order. */
void nw_mgr_table_enlist(nw_mgr_table *t, int fd, int kind, nw_msec deadline);
/* Off its list, FREE now; still in epoll. */
void nw_mgr_table_delist(nw_mgr_table *t, int fd);
/* The same list, a new deadline. */
void nw_mgr_table_defer(nw_mgr_table *t, int fd, nw_msec deadline);

/* The first on kind's list (NW_MGR_NONE: empty), its length, and the
 * first whose deadline is due by now (NW_MGR_NONE: none). */
int nw_mgr_table_first(const nw_mgr_table *t, int kind);
size_t nw_mgr_table_count(const nw_mgr_table *t, int kind);
int nw_mgr_table_due(const nw_mgr_table *t, int kind, nw_msec now);
/* next, or the earliest deadline on kind's list if that is sooner. */
nw_msec nw_mgr_table_earliest(const nw_mgr_table *t, int kind, nw_msec next);

/* Client connections held (all the client kinds' lists). */
size_t nw_mgr_table_held(const nw_mgr_table *t);
/* Whether held + outside + extra is at --max-connections. */
int nw_mgr_table_full(const nw_mgr_table *t, size_t extra);
/* A connection another part holds (delta 1) or has let go (-1): it counts
 * against --max-connections, and makes room as any other does. */
void nw_mgr_table_hold_outside(nw_mgr_table *t, int delta);
/* Room for one more connection under --max-connections, closing the
 * longest-idle ones if needed. 0: none can be made (nothing is idle). */
int nw_mgr_table_make_room(nw_mgr_table *t);

/* Take a connection out of epoll and off its list; it stays open and keeps
 * its record (head bytes, requests) until nw_mgr_table_forget. */
void nw_mgr_table_detach(nw_mgr_table *t, int fd);
/* Drop a detached fd's record (its rest done with, nw_mgr_table_rest_done);
 * the socket stays open for the caller. */
void nw_mgr_table_release(nw_mgr_table *t, int fd);
/* Close a detached connection and drop its record. */
void nw_mgr_table_forget(nw_mgr_table *t, int fd);
/* Detach and forget. */
void nw_mgr_table_drop(nw_mgr_table *t, int fd);

/* A response's rest is done with (sent, or given up): its descriptor is
 * closed and what it counted against --max-offload-total given back. */
void nw_mgr_table_rest_done(nw_mgr_table *t, nw_mgr_slot *s);

/* Append bytes to the connection's head buffer, which never grows past
 * what one SERVE frame can carry. 0, or -1 (too long, no memory). */
int nw_mgr_table_keep(nw_mgr_slot *s, const char *data, size_t len);

/* Close every fd that has a record, and free the slab. */
void nw_mgr_table_close(nw_mgr_table *t);

#endif
