/* See nw_mgr_handover.h. */
#include "nw_mgr_handover.h"
#include "nw_response.h"
#include "nw_scoreboard.h"

#include <errno.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#define RETRY_MS    10  /* a hand-off refused for a while (too many descriptors in flight,
                         * no kernel memory): tried again this soon at the latest */
#define DRAIN_READS 4   /* reads before a 408 or 503, so close() sends FIN, not RST */

static const char *const refused_names[NW_REFUSED_REASONS] = {
    "the serve queue refused it", "the manager holds --max-connections, none of them idle",
    "out of memory" };

void nw_mgr_handover_init(nw_mgr_handover *h, nw_mgr_table *t, const nw_mgr_clock *clock,
                          int ep, int serve_queue, volatile int64_t *serve_queued)
{
    memset(h, 0, sizeof *h);
    h->table = t;
    h->clock = clock;
    h->ep = ep;
    h->serve_queue = serve_queue;
    h->serve_queued = serve_queued;
    /* Room for the largest SERVE frame even where the default socket
     * buffer is small (the kernel caps this at net.core.wmem_max). */
    int sndbuf = 0, want = NW_FRAME_MAX_DATA + 4096;
    socklen_t optlen = sizeof sndbuf;
    if (getsockopt(serve_queue, SOL_SOCKET, SO_SNDBUF, &sndbuf, &optlen) == 0 && sndbuf < 2 * want)
        setsockopt(serve_queue, SOL_SOCKET, SO_SNDBUF, &want, sizeof want);
}

/* ------------------------------------------------------------ answers */

/* Unread input is drained first, because closing a socket with unread
 * input sends RST, which can destroy the response in flight. 408 and 503
 * are nw_head_error's, as a worker's (Date: RFC 9110 6.6.1). */
void nw_mgr_answer(int fd, int status)
{
    nw_buf b = { 0 };
    if (nw_head_error(&b, status) == 0) {
        char sink[NW_READ_CHUNK];
        for (int i = 0; i < DRAIN_READS; i++)
            if (recv(fd, sink, sizeof sink, MSG_DONTWAIT) <= 0)
                break;
        (void)!send(fd, b.data, b.len, MSG_DONTWAIT | MSG_NOSIGNAL);
    }
    nw_buf_free(&b);
}

/* An idle connection gets a plain close, as at the end of a keep-alive
 * timeout: nothing was asked. */
void nw_mgr_handover_refuse(nw_mgr_handover *h, int fd, int reason, int asked, int err)
{
    if (asked)
        nw_mgr_answer(fd, 503);
    if (nw_mgr_table_has(h->table, fd))
        nw_mgr_table_forget(h->table, fd);   /* (its record, its rest, and the socket) */
    else
        close(fd);
    h->refused[reason]++;
    nw_log_limited(&h->refused_said[reason], nw_mgr_now(h->clock), "error",
                   "closed a connection%s: %s%s%s", asked ? " with 503" : "",
                   refused_names[reason], err ? ": " : "", err ? strerror(err) : "");
}

nw_mgr_slot *nw_mgr_handover_adopt(nw_mgr_handover *h, int fd, const nw_frame *f)
{
    if (nw_mgr_table_reserve(h->table, fd) < 0) {
        /* (a 503 only where bytes of a request came: not after a response
         * begun, OUTPUT, nor to a PROXY header that may be all there is) */
        nw_mgr_handover_refuse(h, fd, NW_REFUSED_MEMORY,
                               f->data_len > 0
                               && !(f->flags & (NW_FRAME_F_OUTPUT | NW_FRAME_F_PROXY)), 0);
        return NULL;
    }
    nw_mgr_slot *s = nw_mgr_table_fresh(h->table, fd);
    s->requests = f->requests;
    s->listener = f->listener;
    if (f->flags & NW_FRAME_F_PROXY)
        s->flags = NW_MGR_F_PROXY;
    return s;
}

/* ------------------------------------------------------------ the serve queue */

/* The serve queue's EPOLLOUT in the manager's epoll (on) or not. */
static void epollout(nw_mgr_handover *h, int on)
{
    if (on == h->watched)
        return;
    struct epoll_event ev = { .events = EPOLLOUT | EPOLLET, .data.fd = h->serve_queue };
    if (epoll_ctl(h->ep, on ? EPOLL_CTL_ADD : EPOLL_CTL_DEL, h->serve_queue, &ev) == 0)
        h->watched = on;
}

/* Watch the serve queue while anything is queued, and only then.
 * Edge-triggered: the kernel wakes a unix socket's writers each time the
 * reader takes a frame (it frees the frame's memory), so every take by a
 * worker is an edge. While a refusal is waited out (retry_at) it is not
 * watched: a send the kernel refuses frees its frame too, which wakes the
 * writers at once, and the loop would spin on refusal after refusal (a
 * manager at its limit of descriptors in flight took 260 ms of CPU in
 * 300 ms); the retry comes RETRY_MS later. */
static void watch_queue(nw_mgr_handover *h, int on)
{
    if (!on)
        h->retry_at = 0;
    epollout(h, on && !h->retry_at);
}

static void say_refused_for_a_while(nw_mgr_handover *h, int e)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
        rl.rlim_cur = 0;
    nw_log_limited(&h->waits_said, nw_mgr_now(h->clock), "warn",
                   "the serve queue refused a request: %s%s%llu%s; it waits in the "
                   "manager's queue and is tried again", strerror(e),
                   e == ETOOMANYREFS ? " (this user's descriptors in flight to the workers "
                                       "are over its open-file limit, " : " (",
                   (unsigned long long)rl.rlim_cur,
                   e == ETOOMANYREFS ? ": raise it)" : " the open-file limit)");
}

/* Put fd with its bytes on the serve queue, where the next free worker
 * takes it. 1: sent (the caller closes our copy); 0: not now (queue it):
 * the serve queue is full, or the kernel refuses for a while; -1 with
 * errno: the frame cannot be sent at all (the caller refuses fd).
 *
 * What is waited out: a full queue (EAGAIN), which a worker's next take
 * makes room in; and ETOOMANYREFS, ENOBUFS, ENOMEM, which say nothing of
 * room: Linux refuses to pass a descriptor while the sending user (not
 * root) has more in flight over unix sockets than its open-file limit
 * (every descriptor in the serve and handoff queues counts, all of the
 * user's processes together), and the two others are the kernel short of
 * memory. Those are tried again when a worker takes a frame (the edge
 * watch_queue waits for) or RETRY_MS later, whichever comes first: the
 * refused client waits in the manager's queue as it would for room,
 * instead of being closed unanswered (700 clients behind one stuck
 * worker under a limit of 64: 652 were). */
static int serve(nw_mgr_handover *h, int fd, const char *data, size_t len)
{
    nw_mgr_slot *s = nw_mgr_table_slot(h->table, fd);
    nw_frame f;
    nw_frame_init(&f, NW_FRAME_SERVE);
    f.listener = s->listener;
    f.requests = s->requests;
    f.ready_ms = s->ready_ms;
    if (s->flags & NW_MGR_F_PROXY)
        f.flags = NW_FRAME_F_PROXY;
    if (s->flags & NW_MGR_F_DRAINED)
        f.flags |= NW_FRAME_F_DRAINED;
    f.data_len = (uint32_t)len;
    if (nw_frame_send(h->serve_queue, &f, data, fd) == 0) {
        h->handed_off++;
        nw_scoreboard_queued_add(h->serve_queued, 1);
        return 1;
    }
    int e = errno;
    if (e == ETOOMANYREFS || e == ENOBUFS || e == ENOMEM) {
        if (!h->retry_at)
            h->retry_at = nw_mgr_now(h->clock) + RETRY_MS;
        epollout(h, 0);
        say_refused_for_a_while(h, e);
    } else if (e != EAGAIN && e != EWOULDBLOCK) {
        errno = e;
        return -1;
    }
    h->queue_full++;
    return 0;
}

void nw_mgr_handover_queue_up(nw_mgr_handover *h, int fd, const char *data, size_t len)
{
    nw_mgr_slot *s = nw_mgr_table_slot(h->table, fd);
    if (nw_mgr_table_first(h->table, NW_MGR_QUEUED) == NW_MGR_NONE) {  /* never overtake it */
        int r = serve(h, fd, data, len);
        if (r > 0) {
            nw_mgr_table_forget(h->table, fd);
            return;
        }
        if (r < 0) {
            nw_mgr_handover_refuse(h, fd, NW_REFUSED_SERVE_QUEUE, 1, errno);
            return;
        }
    }
    if (!nw_mgr_table_make_room(h->table)) {
        nw_mgr_handover_refuse(h, fd, NW_REFUSED_FULL, 1, 0);
        return;
    }
    if (data != s->head && nw_mgr_table_keep(s, data, len) < 0) {
        nw_mgr_handover_refuse(h, fd, NW_REFUSED_MEMORY, 1, 0);
        return;
    }
    nw_mgr_table_enlist(h->table, fd, NW_MGR_QUEUED, 0);
    watch_queue(h, 1);
}

void nw_mgr_handover_drain(nw_mgr_handover *h)
{
    h->retry_at = 0;
    int fd;
    while ((fd = nw_mgr_table_first(h->table, NW_MGR_QUEUED)) != NW_MGR_NONE) {
        nw_mgr_slot *s = nw_mgr_table_slot(h->table, fd);
        int r = serve(h, fd, s->head, s->head_len);
        if (r == 0)
            return;
        nw_mgr_table_detach(h->table, fd);
        if (r > 0)
            nw_mgr_table_forget(h->table, fd);
        else
            nw_mgr_handover_refuse(h, fd, NW_REFUSED_SERVE_QUEUE, 1, errno);
    }
    watch_queue(h, 0);
}

void nw_mgr_handover_retry(nw_mgr_handover *h)
{
    if (h->retry_at && nw_mgr_now(h->clock) >= h->retry_at
        && nw_mgr_table_first(h->table, NW_MGR_QUEUED) != NW_MGR_NONE)
        nw_mgr_handover_drain(h);
}

void nw_mgr_handover_queue_shrank(nw_mgr_handover *h)
{
    if (nw_mgr_table_first(h->table, NW_MGR_QUEUED) == NW_MGR_NONE)
        watch_queue(h, 0);
}

nw_msec nw_mgr_handover_next(const nw_mgr_handover *h, nw_msec next)
{
    return h->retry_at && h->retry_at < next ? h->retry_at : next;
}

/* ------------------------------------------------------------ counts */

/* (a refusal for --max-connections closed one to stay under it) */
void nw_mgr_handover_count(const nw_mgr_handover *h, nw_manager_stats *st)
{
    st->handed_off += h->handed_off;
    st->serve_queue_full += h->queue_full;
    st->closed_full += h->refused[NW_REFUSED_FULL];
}

void nw_mgr_handover_refused(const nw_mgr_handover *h, uint64_t *refused)
{
    memcpy(refused, h->refused, sizeof h->refused);
}

void nw_mgr_handover_flush_said(nw_mgr_handover *h)
{
    nw_msec now = nw_mgr_now(h->clock);
    for (int i = 0; i < NW_REFUSED_REASONS; i++)
        nw_log_limited_flush(&h->refused_said[i], now, "error", "like it");
    nw_log_limited_flush(&h->waits_said, now, "warn", "like it");
}

void nw_mgr_handover_close(nw_mgr_handover *h)
{
    if (h->serve_queue >= 0)
        close(h->serve_queue);
    h->serve_queue = -1;
}
