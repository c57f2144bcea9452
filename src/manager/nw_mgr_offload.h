/* The connection manager's output offload (DESIGN.md, "Slow readers"):
 * the rest of a response a worker gave it to finish (a HANDOFF with
 * OUTPUT: a file or a memfd), written as the client takes it; a response
 * that has left the worker but not the socket, waited for; and after a
 * response without keep-alive, the half-closed connection drained
 * briefly. A written connection kept alive goes back to nw_mgr_heads. */
#ifndef NW_MGR_OFFLOAD_H
#define NW_MGR_OFFLOAD_H

#include "nw_frame.h"
#include "nw_mgr_clock.h"
#include "nw_mgr_handover.h"
#include "nw_mgr_table.h"

struct nw_mgr_heads;

typedef struct nw_mgr_offload {
    nw_mgr_table *table;
    const nw_mgr_clock *clock;
    nw_mgr_handover *handover;
    struct nw_mgr_heads *heads;         /* where a written connection kept alive goes */
    nw_msec  write_ms;                  /* --timeout: a write making no progress */
    volatile int64_t *offload_bytes;    /* the board's --max-offload-total count, or NULL */
    uint64_t offloaded;                 /* responses taken to finish, total */
    uint64_t closed_timeout;            /* closed after --timeout without progress, total */
} nw_mgr_offload;

void nw_mgr_offload_init(nw_mgr_offload *o, nw_mgr_table *t, const nw_mgr_clock *clock,
                         nw_mgr_handover *handover, struct nw_mgr_heads *heads,
                         nw_msec write_ms, volatile int64_t *offload_bytes);

/* HANDOFF with OUTPUT: a connection (fds[0]), the rest of its response
 * (fds[1]) and, with keep-alive, the bytes read past its request. -1: the
 * frame does not hold what it says (nothing taken, the fds left). */
int nw_mgr_offload_take(nw_mgr_offload *o, const int *fds, const nw_frame *f, const char *data);
/* A writing connection's socket has room (or has sent everything). */
void nw_mgr_offload_writable(nw_mgr_offload *o, int fd);
/* A half-closed connection is readable. */
void nw_mgr_offload_closing_readable(nw_mgr_offload *o, int fd);
/* A kept-alive connection (in epoll, on no list) whose response the
 * kernel has not sent all of yet waits for it as a writing one. 1: it
 * waits; 0: nothing is unsent. */
int nw_mgr_offload_wait_sent(nw_mgr_offload *o, int fd);

/* Drop what made no progress for --timeout, and the half-closed ones
 * drained long enough. */
void nw_mgr_offload_expire(nw_mgr_offload *o);
/* next, or the earliest deadline of a writing or closing one. */
nw_msec nw_mgr_offload_next(const nw_mgr_offload *o, nw_msec next);
void nw_mgr_offload_count(const nw_mgr_offload *o, nw_manager_stats *st);

#endif
