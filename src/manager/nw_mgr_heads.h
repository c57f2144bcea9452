/* The connection manager's idle connections and the request heads
 * arriving on them (DESIGN.md, "The connection manager"): connections a
 * worker handed over (HANDOFF) or the manager took from a listener, read
 * a chunk per wake-up until the head is complete, then handed to the
 * workers (nw_mgr_handover); closed at the end of their keep-alive time,
 * or with 408 at the end of their read time.
 *
 * Blank lines before a request line (RFC 9112 2.2) are dropped while no
 * head has begun, and do not count as its first byte: a client sending
 * CRLF now and then cannot keep an idle connection alive. */
#ifndef NW_MGR_HEADS_H
#define NW_MGR_HEADS_H

#include "nw_frame.h"
#include "nw_mgr_clock.h"
#include "nw_mgr_handover.h"
#include "nw_mgr_table.h"

/* Asked of each idle connection at its keep-alive deadline: 1 when a
 * response is still in its socket (the part that writes responses then
 * holds it as a writing one), 0 when it is idle and may close. */
typedef struct {
    int (*still_sending)(void *arg, int fd);
    void *arg;
} nw_mgr_heads_unsent;

typedef struct {
    nw_msec keepalive_ms;       /* an idle connection is kept this long */
    nw_msec read_ms;            /* a head has this long from its first byte... */
    double  read_timeout, read_timeout_max, min_head_rate; /* ...moved on (nw_head_deadline) */
    size_t  max_header;         /* a longer head goes to a worker (431) */
    size_t  max_line;           /* a longer first line, no LF yet: to a worker (414) */
} nw_mgr_head_limits;

typedef struct nw_mgr_heads {
    nw_mgr_table *table;
    const nw_mgr_clock *clock;
    nw_mgr_handover *handover;
    nw_mgr_heads_unsent unsent;     /* an idle one whose response is still unsent goes there */
    nw_mgr_head_limits lim;
    int64_t  arrived_ns;            /* the kernel's receive time of the bytes being
                                     * read (0: none) */
    uint64_t closed_peer;           /* closed by the client while idle, total */
    uint64_t closed_timeout;        /* closed by keep-alive or read timeout, total */
} nw_mgr_heads;

void nw_mgr_heads_init(nw_mgr_heads *h, nw_mgr_table *t, const nw_mgr_clock *clock,
                       nw_mgr_handover *handover, nw_mgr_heads_unsent unsent,
                       const nw_mgr_head_limits *lim);

/* HANDOFF: a connection with whatever the worker read past its last
 * request (data, f->data_len bytes): served at once when that is a whole
 * head, else held idle or reading. */
void nw_mgr_heads_take(nw_mgr_heads *h, int fd, const nw_frame *f, const char *data);
/* A new connection from a listener: held like one a worker handed over,
 * and read at once (its request is usually there: TCP_DEFER_ACCEPT). */
void nw_mgr_heads_accepted(nw_mgr_heads *h, int fd, int listener, int proxy);
/* An idle or reading connection is readable: one read. */
void nw_mgr_heads_readable(nw_mgr_heads *h, int fd);

/* Should the bytes buffered so far go to a worker? Yes when the head is
 * complete, and also when it is already over a limit. old: how many of
 * them were looked at before. */
int nw_mgr_heads_complete(nw_mgr_heads *h, nw_mgr_slot *s, const char *p, size_t len,
                          size_t old);
/* fd (detached) has a head to serve, which became ready now (or when the
 * kernel received the bytes just read). */
void nw_mgr_heads_hand_over(nw_mgr_heads *h, int fd, const char *data, size_t len);
/* A kept-alive connection with nothing to write waits for its next
 * request, its keep-alive time from now (fd in epoll, on no list). */
void nw_mgr_heads_wait_request(nw_mgr_heads *h, int fd);
/* The length of the empty lines in front of a request line. */
size_t nw_mgr_heads_blank_prefix(const char *p, size_t len);

/* Close what is past its keep-alive or read time. */
void nw_mgr_heads_expire(nw_mgr_heads *h);
/* next, or the earliest deadline of an idle or reading one. */
nw_msec nw_mgr_heads_next(const nw_mgr_heads *h, nw_msec next);
void nw_mgr_heads_count(const nw_mgr_heads *h, nw_manager_stats *st);

#endif
