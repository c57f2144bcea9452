/* See nw_mgr_offload.h. */
#include "nw_mgr_offload.h"
#include "nw_mgr_heads.h"
#include "nw_scoreboard.h"

#include <errno.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

void nw_mgr_offload_init(nw_mgr_offload *o, nw_mgr_table *t, const nw_mgr_clock *clock,
                         nw_mgr_handover *handover, struct nw_mgr_heads *heads,
                         nw_msec write_ms, volatile int64_t *offload_bytes)
{
    memset(o, 0, sizeof *o);
    o->table = t;
    o->clock = clock;
    o->handover = handover;
    o->heads = heads;
    o->write_ms = write_ms;
    o->offload_bytes = offload_bytes;
}

static nw_msec write_deadline(const nw_mgr_offload *o)
{
    return nw_mgr_now(o->clock) + o->write_ms;
}

/* A connection whose response has left us (or the worker) but not the
 * socket: bytes the kernel has not sent yet, a slow reader's. It is not
 * idle while they wait there: it waits as a writing one does, woken once
 * the socket has sent everything (nw_io_writable_when_sent), and its
 * keep-alive time starts then. */
int nw_mgr_offload_wait_sent(nw_mgr_offload *o, int fd)
{
    nw_mgr_slot *s = nw_mgr_table_slot(o->table, fd);
    uint64_t unsent = nw_io_unsent(fd);
    if (!unsent || nw_io_writable_when_sent(fd, 1) < 0)
        return 0;
    if (nw_mgr_table_rewatch(o->table, fd, EPOLLOUT) < 0) {
        nw_io_writable_when_sent(fd, 0);
        return 0;
    }
    s->out_left = unsent;
    s->flags |= NW_MGR_F_OUT_KEEP | NW_MGR_F_UNSENT;
    nw_mgr_table_enlist(o->table, fd, NW_MGR_WRITING, write_deadline(o));
    return 1;
}

/* Without keep-alive: half-closed and drained briefly (a FIN, not a reset
 * that could destroy the response's last bytes in flight). */
static void half_close(nw_mgr_offload *o, int fd)
{
    if (nw_mgr_table_rewatch(o->table, fd, EPOLLIN) < 0) {
        nw_mgr_table_unwatch(o->table, fd);
        /* (its response is written: no 503) */
        nw_mgr_handover_refuse(o->handover, fd, NW_REFUSED_MEMORY, 0, errno);
        return;
    }
    shutdown(fd, SHUT_WR);
    nw_mgr_table_enlist(o->table, fd, NW_MGR_CLOSING,
                        nw_mgr_now(o->clock) + NW_MANAGER_LINGER_MS);
}

/* The response is written: the connection waits for its next request as
 * any handed-off one does (served at once if it is already here; once the
 * socket has sent the response, when it has not yet), or is half-closed.
 * It stays in epoll, watched for input now, unless it goes to a worker. */
static void written(nw_mgr_offload *o, int fd)
{
    nw_mgr_slot *s = nw_mgr_table_slot(o->table, fd);
    int keep = s->flags & NW_MGR_F_OUT_KEEP;
    nw_mgr_table_delist(o->table, fd);
    nw_mgr_table_rest_done(o->table, s);
    s->flags &= (uint8_t)~(NW_MGR_F_OUT_KEEP | NW_MGR_F_UNSENT);
    if (!keep) {
        half_close(o, fd);
    } else if (s->head_len > 0 && nw_mgr_heads_complete(o->heads, s, s->head, s->head_len, 0)) {
        nw_mgr_table_unwatch(o->table, fd);
        nw_mgr_heads_hand_over(o->heads, fd, s->head, s->head_len);  /* pipelined: serve now */
    } else if (!nw_mgr_offload_wait_sent(o, fd)) {
        nw_mgr_heads_wait_request(o->heads, fd);
    }
}

/* A connection waiting for the socket to send its response: sent yet?
 * Woken (the socket polls writable only once everything is sent, or on an
 * error or hang-up) or at its deadline: what the kernel sent since we last
 * looked moves the deadline on by --timeout, as a write does; a wake or a
 * deadline without any progress drops it. */
static void sent_yet(nw_mgr_offload *o, int fd)
{
    nw_mgr_slot *s = nw_mgr_table_slot(o->table, fd);
    uint64_t unsent = nw_io_unsent(fd);
    if (unsent == 0) {
        nw_io_writable_when_sent(fd, 0);
        written(o, fd);
    } else if (unsent < s->out_left) {
        s->out_left = unsent;
        nw_mgr_table_defer(o->table, fd, write_deadline(o));
    } else {
        nw_mgr_table_drop(o->table, fd);
    }
}

/* Send what the client takes now of the rest. Each write that sends
 * something moves the deadline on by --timeout. */
void nw_mgr_offload_writable(nw_mgr_offload *o, int fd)
{
    nw_mgr_slot *s = nw_mgr_table_slot(o->table, fd);
    if (s->flags & NW_MGR_F_UNSENT) {
        sent_yet(o, fd);
        return;
    }
    off_t off = (off_t)s->out_off;
    size_t left = (size_t)s->out_left;
    int r = nw_io_sendfile_now(fd, s->out_fd, &off, &left);
    uint64_t sent = s->out_left - left;
    if (sent && (s->flags & NW_MGR_F_OUT_COUNTED) && o->offload_bytes)
        nw_scoreboard_offload_release(o->offload_bytes, sent);
    s->out_off = (int64_t)off;
    s->out_left = left;
    if (r == NW_IO_OK)
        written(o, fd);
    else if (r != NW_IO_AGAIN)
        nw_mgr_table_drop(o->table, fd);    /* the client went (or the rest broke) */
    else if (sent && s->kind == NW_MGR_WRITING)
        nw_mgr_table_defer(o->table, fd, write_deadline(o));
}

/* A frame with OUTPUT must hold what it says: two fds, the output
 * record, and counted bytes that are none or all of the rest. */
static int frame_ok(const nw_frame *f, const int *fds, const char *data)
{
    nw_frame_output out;
    if (fds[0] < 0 || fds[1] < 0 || f->data_len < sizeof out)
        return 0;
    memcpy(&out, data, sizeof out);
    return out.counted == 0 || out.counted == out.length;
}

/* fd's record takes the rest (the rest fd, where it goes on, its length). */
static void take_rest(nw_mgr_slot *s, int rest_fd, const nw_frame_output *out)
{
    s->out_fd = rest_fd;
    s->out_off = (int64_t)out->offset;
    s->out_left = out->length;
    if (out->counted)
        s->flags |= NW_MGR_F_OUT_COUNTED;
    if (out->keep_alive)
        s->flags |= NW_MGR_F_OUT_KEEP;
}

int nw_mgr_offload_take(nw_mgr_offload *o, const int *fds, const nw_frame *f, const char *data)
{
    if (!frame_ok(f, fds, data))
        return -1;
    nw_frame_output out;
    int fd = fds[0];
    memcpy(&out, data, sizeof out);
    o->offloaded++;
    nw_mgr_slot *s = nw_mgr_handover_adopt(o->handover, fd, f);
    if (!s) {
        if (out.counted && o->offload_bytes)
            nw_scoreboard_offload_release(o->offload_bytes, out.counted);
        close(fds[1]);
        return 0;
    }
    take_rest(s, fds[1], &out);
    data += sizeof out;
    size_t len = f->data_len - sizeof out;
    size_t skip = s->flags & NW_MGR_F_PROXY ? 0 : nw_mgr_heads_blank_prefix(data, len);
    /* (a response is begun: no 503 can follow it) */
    if (len - skip > 0 && nw_mgr_table_keep(s, data + skip, len - skip) < 0) {
        nw_mgr_handover_refuse(o->handover, fd, NW_REFUSED_MEMORY, 0, 0);
        return 0;
    }
    if (nw_mgr_table_watch(o->table, fd, EPOLLOUT) < 0) {
        nw_mgr_handover_refuse(o->handover, fd, NW_REFUSED_MEMORY, 0, errno);
        return 0;
    }
    nw_mgr_table_enlist(o->table, fd, NW_MGR_WRITING, write_deadline(o));
    nw_mgr_offload_writable(o, fd);     /* the client may have read meanwhile */
    return 0;
}

/* What the client still sends is dropped; its end (or an error) closes ours. */
void nw_mgr_offload_closing_readable(nw_mgr_offload *o, int fd)
{
    char sink[NW_READ_CHUNK];
    ssize_t n = recv(fd, sink, sizeof sink, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return;
    if (n <= 0)
        nw_mgr_table_drop(o->table, fd);
}

void nw_mgr_offload_expire(nw_mgr_offload *o)
{
    nw_msec now = nw_mgr_now(o->clock);
    int fd;
    while ((fd = nw_mgr_table_due(o->table, NW_MGR_WRITING, now)) != NW_MGR_NONE) {
        nw_mgr_slot *s = nw_mgr_table_slot(o->table, fd);
        if ((s->flags & NW_MGR_F_UNSENT) && nw_io_unsent(fd) < s->out_left) {
            sent_yet(o, fd);     /* the client reads on: not a timeout */
            continue;
        }
        nw_mgr_table_drop(o->table, fd);   /* read nothing for --timeout */
        o->closed_timeout++;
    }
    while ((fd = nw_mgr_table_due(o->table, NW_MGR_CLOSING, now)) != NW_MGR_NONE)
        nw_mgr_table_drop(o->table, fd);
}

nw_msec nw_mgr_offload_next(const nw_mgr_offload *o, nw_msec next)
{
    next = nw_mgr_table_earliest(o->table, NW_MGR_WRITING, next);
    return nw_mgr_table_earliest(o->table, NW_MGR_CLOSING, next);
}

void nw_mgr_offload_count(const nw_mgr_offload *o, nw_manager_stats *st)
{
    st->offloaded += o->offloaded;
    st->closed_timeout += o->closed_timeout;
}
