/* See nw_mgr_heads.h. */
#include "nw_mgr_heads.h"
#include "nw_http.h"
#include "nw_proxy.h"

#include <errno.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#define ARRIVAL_BELIEF_MS 3600000   /* an older receive time: the clock was set meanwhile */

void nw_mgr_heads_init(nw_mgr_heads *h, nw_mgr_table *t, const nw_mgr_clock *clock,
                       nw_mgr_handover *handover, nw_mgr_heads_unsent unsent,
                       const nw_mgr_head_limits *lim)
{
    memset(h, 0, sizeof *h);
    h->table = t;
    h->clock = clock;
    h->handover = handover;
    h->unsent = unsent;
    h->lim = *lim;
}

/* ------------------------------------------------------------ the rules */

/* Empty lines before the request line, dropped as the worker drops them
 * (nw_http_empty_lines, the one rule): CRLF or LF each, not a bare CR,
 * which stays in the head and makes a worker answer 400. */
size_t nw_mgr_heads_blank_prefix(const char *p, size_t len)
{
    int bad;
    return nw_http_empty_lines(p, len, &bad);
}

/* The length of the complete PROXY header in front of a connection's
 * bytes (0: none, or not complete). */
static size_t proxy_len(const nw_mgr_slot *s, const char *p, size_t len)
{
    nw_proxy_info info;
    size_t used = 0;
    if (!(s->flags & NW_MGR_F_PROXY) || nw_proxy_parse(p, len, &info, &used) != NW_PROXY_DONE)
        return 0;
    return used;
}

/* Whether a connection's bytes hold (part of) a request, not only a PROXY
 * header or nothing. */
static int asked(const nw_mgr_slot *s, const char *p, size_t len)
{
    return len > proxy_len(s, p, len);
}

/* The worker answers 431 or 414 (the manager writes nothing but 408), and
 * a head that could not fit in one more frame cannot wait for more. */
int nw_mgr_heads_complete(nw_mgr_heads *h, nw_mgr_slot *s, const char *p, size_t len,
                          size_t old)
{
    if (s->flags & NW_MGR_F_PROXY) {
        /* the head begins after the PROXY header: a worker parses both */
        nw_proxy_info info;
        size_t used = 0;
        int r = nw_proxy_parse(p, len, &info, &used);
        if (r == NW_PROXY_MORE)
            return len >= NW_FRAME_MAX_DATA;
        if (r == NW_PROXY_BAD)
            return 1;           /* a worker closes it */
        p += used;
        len -= used;
        old = old > used ? old - used : 0;
    }
    if (!(s->flags & NW_MGR_F_LINE_SEEN) && memchr(p + old, '\n', len - old))
        s->flags |= NW_MGR_F_LINE_SEEN;
    /* the buffered bytes start at the request line (empty lines before it
     * are not kept), and the first old of them were searched before */
    nw_head_scan scan = { 0, old };
    if ((s->flags & NW_MGR_F_LINE_SEEN) && nw_http_head_end(p, len, &scan))
        return 1;
    if (len > h->lim.max_header || len >= NW_FRAME_MAX_DATA)
        return 1;
    if (!nw_http_line_can_start(p, len))
        return 1;           /* not HTTP: a worker answers 400 at once */
    return !(s->flags & NW_MGR_F_LINE_SEEN) && len > h->lim.max_line;
}

/* ------------------------------------------------------------ handing over */

/* When the head just completed became ready, on the manager's clock: when
 * the kernel received the bytes just read (TCP, SO_TIMESTAMPNS: a request
 * that waited parked in a busy worker before it was handed here keeps
 * that wait), else now. */
static uint32_t ready_ms(const nw_mgr_heads *h)
{
    nw_msec now = nw_mgr_now(h->clock);
    if (h->arrived_ns) {
        int64_t ago_ms = (nw_wall_clock_ns() - h->arrived_ns) / 1000000;
        if (ago_ms > 0 && ago_ms < ARRIVAL_BELIEF_MS)
            return (uint32_t)(now - ago_ms);
    }
    return (uint32_t)now;
}

void nw_mgr_heads_hand_over(nw_mgr_heads *h, int fd, const char *data, size_t len)
{
    nw_mgr_table_slot(h->table, fd)->ready_ms = ready_ms(h);
    nw_mgr_handover_queue_up(h->handover, fd, data, len);
}

/* ------------------------------------------------------------ taking */

/* Deadline of a handed-off connection: what the worker says is left,
 * never more than our own timeout. The worker's number counts from the
 * first byte of the head only when HEAD_STARTED says so; bytes without
 * that flag start the read timeout now. */
static nw_msec handoff_deadline(const nw_mgr_heads *h, const nw_frame *f, int reading)
{
    nw_msec limit = reading ? h->lim.read_ms : h->lim.keepalive_ms;
    int given_applies = (f->flags & NW_FRAME_F_HEAD_STARTED) || !reading;
    if (given_applies && f->deadline_ms >= 0 && f->deadline_ms < limit)
        limit = f->deadline_ms;
    return nw_mgr_now(h->clock) + limit;
}

/* The rate counts from the head's first byte, which the worker saw
 * (ready_ms, the same clock mod 2^32); from now for bytes it had not
 * looked at. Counted from the hand-off, a head handed off 0.5 s after it
 * began got 0.5 s more than --read-timeout once its next byte came. */
static nw_msec head_started(const nw_mgr_heads *h, const nw_frame *f)
{
    nw_msec now = nw_mgr_now(h->clock);
    if (f->flags & NW_FRAME_F_HEAD_STARTED) {
        uint32_t ago = (uint32_t)now - f->ready_ms;
        double most = h->lim.read_timeout_max > h->lim.read_timeout
                      ? h->lim.read_timeout_max : h->lim.read_timeout;
        if (ago <= (uint32_t)(most * 1000.0))
            return now - (nw_msec)ago;
    }
    return now;
}

void nw_mgr_heads_take(nw_mgr_heads *h, int fd, const nw_frame *f, const char *data)
{
    nw_mgr_slot *s = nw_mgr_handover_adopt(h->handover, fd, f);
    if (!s)
        return;
    size_t skip = s->flags & NW_MGR_F_PROXY ? 0 : nw_mgr_heads_blank_prefix(data, f->data_len);
    size_t len = f->data_len - skip;
    data += skip;
    if (len > 0 && nw_mgr_heads_complete(h, s, data, len, 0)) {
        nw_mgr_heads_hand_over(h, fd, data, len);   /* pipelined: serve at once */
        return;
    }
    if (!nw_mgr_table_make_room(h->table)) {
        nw_mgr_handover_refuse(h->handover, fd, NW_REFUSED_FULL, asked(s, data, len), 0);
        return;
    }
    if (len > 0 && nw_mgr_table_keep(s, data, len) < 0) {
        nw_mgr_handover_refuse(h->handover, fd, NW_REFUSED_MEMORY, asked(s, data, len), 0);
        return;
    }
    if (nw_mgr_table_watch(h->table, fd, EPOLLIN) < 0) {
        /* (no memory for epoll's record, or not something epoll can watch) */
        nw_mgr_handover_refuse(h->handover, fd, NW_REFUSED_MEMORY, asked(s, data, len), errno);
        return;
    }
    /* (a PROXY header alone is not the start of a head: the connection is idle) */
    int reading = asked(s, data, len) || (f->flags & NW_FRAME_F_HEAD_STARTED);
    s->head_started = head_started(h, f);
    nw_mgr_table_enlist(h->table, fd, reading ? NW_MGR_READING : NW_MGR_IDLE,
                        handoff_deadline(h, f, reading));
}

void nw_mgr_heads_accepted(nw_mgr_heads *h, int fd, int listener, int proxy)
{
    if (nw_mgr_table_reserve(h->table, fd) < 0) {
        nw_mgr_handover_refuse(h->handover, fd, NW_REFUSED_MEMORY, 1, 0);
        return;
    }
    nw_mgr_slot *s = nw_mgr_table_fresh(h->table, fd);
    s->listener = (uint16_t)listener;
    if (proxy)
        s->flags = NW_MGR_F_PROXY;
    if (!nw_mgr_table_make_room(h->table)) {
        nw_mgr_handover_refuse(h->handover, fd, NW_REFUSED_FULL, 1, 0);
        return;
    }
    if (nw_mgr_table_watch(h->table, fd, EPOLLIN) < 0) {
        nw_mgr_handover_refuse(h->handover, fd, NW_REFUSED_MEMORY, 1, errno);
        return;
    }
    nw_msec now = nw_mgr_now(h->clock);
    s->head_started = now;
    nw_mgr_table_enlist(h->table, fd, NW_MGR_IDLE, now + h->lim.read_ms);
    nw_mgr_heads_readable(h, fd);
}

void nw_mgr_heads_wait_request(nw_mgr_heads *h, int fd)
{
    nw_mgr_slot *s = nw_mgr_table_slot(h->table, fd);
    if (nw_mgr_table_rewatch(h->table, fd, EPOLLIN) < 0) {
        nw_mgr_table_unwatch(h->table, fd);
        /* (its response is written: no 503) */
        nw_mgr_handover_refuse(h->handover, fd, NW_REFUSED_MEMORY, 0, errno);
        return;
    }
    nw_msec now = nw_mgr_now(h->clock);
    int reading = asked(s, s->head, s->head_len);
    s->head_started = now;
    nw_mgr_table_enlist(h->table, fd, reading ? NW_MGR_READING : NW_MGR_IDLE,
                        now + (reading ? h->lim.read_ms : h->lim.keepalive_ms));
}

/* ------------------------------------------------------------ reading */

/* An idle connection's head has begun: the read timeout runs from its
 * first byte (n of them so far). */
static void begin_reading(nw_mgr_heads *h, int fd, nw_mgr_slot *s, size_t n)
{
    nw_msec now = nw_mgr_now(h->clock);
    nw_mgr_table_delist(h->table, fd);
    s->head_started = now;
    nw_mgr_table_enlist(h->table, fd, NW_MGR_READING,
                        nw_head_deadline(now, n, h->lim.read_timeout, h->lim.read_timeout_max,
                                         h->lim.min_head_rate));
}

static void refuse_reading(nw_mgr_heads *h, int fd)
{
    nw_mgr_table_detach(h->table, fd);
    nw_mgr_handover_refuse(h->handover, fd, NW_REFUSED_MEMORY, 1, 0);
}

/* Bytes on a connection with nothing buffered: the head may begin here. */
static void first_bytes(nw_mgr_heads *h, int fd, const char *p, size_t n)
{
    nw_mgr_slot *s = nw_mgr_table_slot(h->table, fd);
    size_t skip = s->flags & NW_MGR_F_PROXY ? 0 : nw_mgr_heads_blank_prefix(p, n);
    p += skip;
    n -= skip;
    if (n == 0)
        return;
    if (s->kind == NW_MGR_IDLE)
        begin_reading(h, fd, s, n);
    if (nw_mgr_heads_complete(h, s, p, n, 0)) {
        nw_mgr_table_detach(h->table, fd);
        nw_mgr_heads_hand_over(h, fd, p, n);
    } else if (nw_mgr_table_keep(s, p, n) < 0) {
        refuse_reading(h, fd);
    }
}

/* A lone CR kept, and now its LF: an empty line, dropped; the head had
 * begun (its read timeout stands, as in a worker). 1: nothing is left. */
static int drop_blank_lines(nw_mgr_slot *s, size_t *old)
{
    size_t skip = nw_mgr_heads_blank_prefix(s->head, s->head_len);
    if (skip > 0) {
        memmove(s->head, s->head + skip, s->head_len - skip);
        s->head_len -= (uint32_t)skip;
        *old = 0;
    }
    return s->head_len == 0;
}

static void more_bytes(nw_mgr_heads *h, int fd, const char *p, size_t n)
{
    nw_mgr_slot *s = nw_mgr_table_slot(h->table, fd);
    size_t old = s->head_len;
    if (s->kind == NW_MGR_IDLE)     /* after a PROXY header: the head begins now */
        begin_reading(h, fd, s, n);
    if (nw_mgr_table_keep(s, p, n) < 0) {
        refuse_reading(h, fd);
        return;
    }
    if (!(s->flags & NW_MGR_F_PROXY) && (s->head[0] == '\r' || s->head[0] == '\n')
        && drop_blank_lines(s, &old))
        return;
    if (nw_mgr_heads_complete(h, s, s->head, s->head_len, old)) {
        nw_mgr_table_detach(h->table, fd);
        nw_mgr_heads_hand_over(h, fd, s->head, s->head_len);
        return;
    }
    /* still arriving: fast enough, and its deadline moves on */
    nw_msec later = nw_head_deadline(s->head_started, s->head_len, h->lim.read_timeout,
                                     h->lim.read_timeout_max, h->lim.min_head_rate);
    if (s->kind == NW_MGR_READING && later > s->deadline)
        nw_mgr_table_defer(h->table, fd, later);
}

void nw_mgr_heads_readable(nw_mgr_heads *h, int fd)
{
    char buf[NW_READ_CHUNK];
    nw_mgr_slot *s = nw_mgr_table_slot(h->table, fd);
    size_t room = NW_FRAME_MAX_DATA - s->head_len;
    if (room > sizeof buf)
        room = sizeof buf;
    h->arrived_ns = 0;
    ssize_t n = nw_io_recv_stamped(fd, buf, room, MSG_DONTWAIT, &h->arrived_ns);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return;
    if (n <= 0) {
        h->closed_peer++;
        nw_mgr_table_drop(h->table, fd);
        return;
    }
    if ((size_t)n < room)
        s->flags |= NW_MGR_F_DRAINED;
    else
        s->flags &= (uint8_t)~NW_MGR_F_DRAINED;
    if (s->head_len == 0)
        first_bytes(h, fd, buf, (size_t)n);
    else
        more_bytes(h, fd, buf, (size_t)n);
    h->arrived_ns = 0;
}

/* ------------------------------------------------------------ time */

void nw_mgr_heads_expire(nw_mgr_heads *h)
{
    nw_msec now = nw_mgr_now(h->clock);
    int fd;
    while ((fd = nw_mgr_table_due(h->table, NW_MGR_IDLE, now)) != NW_MGR_NONE) {
        nw_mgr_table_delist(h->table, fd);
        if (h->unsent.still_sending(h->unsent.arg, fd))
            continue;   /* not idle: a worker's response is still in the socket */
        nw_mgr_table_unwatch(h->table, fd);
        nw_mgr_table_forget(h->table, fd);
        h->closed_timeout++;
    }
    while ((fd = nw_mgr_table_due(h->table, NW_MGR_READING, now)) != NW_MGR_NONE) {
        nw_mgr_table_detach(h->table, fd);
        nw_mgr_answer(fd, 408);
        nw_mgr_table_forget(h->table, fd);
        h->closed_timeout++;
    }
}

nw_msec nw_mgr_heads_next(const nw_mgr_heads *h, nw_msec next)
{
    next = nw_mgr_table_earliest(h->table, NW_MGR_IDLE, next);
    return nw_mgr_table_earliest(h->table, NW_MGR_READING, next);
}

void nw_mgr_heads_count(const nw_mgr_heads *h, nw_manager_stats *st)
{
    st->closed_peer += h->closed_peer;
    st->closed_timeout += h->closed_timeout;
}
