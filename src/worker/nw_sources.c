/* A worker's listeners and serve queue (see nw_sources.h). */
#include "nw_sources.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <unistd.h>

#include "nw_frame.h"
#include "nw_log.h"

void nw_sources_init(nw_sources *s, const nw_sources_ops *ops, void *ctx, int epfd)
{
    memset(s, 0, sizeof *s);
    s->ops = *ops;
    s->ctx = ctx;
    s->epfd = epfd;
    s->serve_queue = -1;
    s->serve_queue_ready = 1;
    s->spare = -1;
}

int nw_sources_open_serve_queue(nw_sources *s, int fd, uint64_t event)
{
    struct epoll_event ev = { .events = EPOLLIN | EPOLLEXCLUSIVE, .data.u64 = event };
    s->serve_queue = fcntl(fd, F_DUPFD_CLOEXEC, 3);
    s->frame_data = malloc(NW_FRAME_MAX_DATA);
    if (s->serve_queue < 0 || !s->frame_data)
        return -1;
    s->spare = fcntl(s->serve_queue, F_DUPFD_CLOEXEC, 3);
    s->serve_event = event;
    return epoll_ctl(s->epfd, EPOLL_CTL_ADD, s->serve_queue, &ev);
}

void nw_sources_count_in(nw_sources *s, nw_score_slot *slot, nw_score_counts *counts,
                         volatile int64_t *serve_queued)
{
    s->slot = slot;
    s->counts = counts;
    s->serve_queued = serve_queued;
}

/* Listener i in the worker's epoll (op ADD) or out of it (DEL):
 * EPOLLEXCLUSIVE, as every worker watches it. */
static int watch_listener(nw_sources *s, int i, int op)
{
    if (s->listener[i].fd < 0)
        return 0;       /* the manager's */
    struct epoll_event ev = { .events = EPOLLIN | EPOLLEXCLUSIVE, .data.u64 = (uint64_t)i };
    return epoll_ctl(s->epfd, op, s->listener[i].fd, &ev);
}

int nw_sources_listen(nw_sources *s, int fd, int is_tcp)
{
    if (s->count >= NW_MAX_LISTENERS) {
        errno = EMFILE;
        return -1;
    }
    int i = s->count;
    s->listener[i].fd = fd;
    s->listener[i].is_tcp = fd >= 0 && is_tcp;
    if (fd < 0) {       /* the manager's: a place for its connections' index */
        s->relayed |= (uint64_t)1 << i;
        s->count++;
        return 0;
    }
    nw_io_set_nonblocking(fd);
    if (watch_listener(s, i, EPOLL_CTL_ADD) < 0)
        return -1;
    s->listener_ready |= (uint64_t)1 << i;     /* not tried yet */
    s->count++;
    return 0;
}

int nw_sources_watch_listeners(nw_sources *s, int watched)
{
    for (int i = 0; i < s->count; i++) {
        if (watched && watch_listener(s, i, EPOLL_CTL_ADD) < 0 && errno != EEXIST)
            return -1;
        if (!watched && watch_listener(s, i, EPOLL_CTL_DEL) < 0 && errno != ENOENT)
            return -1;
    }
    if (!watched)
        s->listener_ready = 0;
    return 0;
}

void nw_sources_all_ready(nw_sources *s)
{
    s->listener_ready = (s->count >= 64 ? ~(uint64_t)0 : ((uint64_t)1 << s->count) - 1) & ~s->relayed;
}

int nw_sources_proxy_from(nw_sources *s, const char *cidr)
{
    nw_proxy_cidr one;
    if (nw_proxy_cidr_parse(cidr, &one) < 0)
        return -1;
    nw_proxy_cidr *p = realloc(s->proxy_from, (s->proxy_from_n + 1) * sizeof *p);
    if (!p)
        return -1;
    p[s->proxy_from_n++] = one;
    s->proxy_from = p;
    return 0;
}

/* Whether --proxy-from lets this peer send a PROXY header; one it does
 * not is counted as refused. */
static int proxy_allowed(nw_sources *s, const struct sockaddr_storage *peer, socklen_t plen)
{
    if (!s->proxy_from_n
        || nw_proxy_cidr_match(s->proxy_from, s->proxy_from_n, (const struct sockaddr *)peer))
        return 1;
    nw_scoreboard_proxy_rejected(s->slot, NW_PROXY_REJECT_NOT_ALLOWED,
                                 (const struct sockaddr *)peer, plen, nw_now_ms());
    return 0;
}

/* ---- the listeners ------------------------------------------------- */

static unsigned long long open_file_limit(void)
{
    struct rlimit rl;
    return getrlimit(RLIMIT_NOFILE, &rl) < 0 ? 0 : (unsigned long long)rl.rlim_cur;
}

/* accept4 refused a client for want of a descriptor: counted, and said
 * in the log (the first time in NW_LOG_LIMIT_MS, then a count). The
 * client stays in the listen queue for a later try. */
static void fd_limit_reached(nw_sources *s, int idx)
{
    static nw_log_limit fd_log;
    int e = errno;
    if (s->counts)
        s->counts->fd_limit++;
    nw_log_limited(&fd_log, nw_now_ms(), "error",
                   "cannot accept a connection on listener %d: %s (open-file limit %llu); "
                   "it waits in the listen queue", idx, strerror(e), open_file_limit());
}

/* The serve queue's frames bring a descriptor each, and a frame taken
 * without room for it would lose its connection (the kernel drops the
 * descriptor: MSG_CTRUNC). So the sources keep one descriptor spare,
 * closed just before a frame is taken and made again after: a frame is
 * taken only when the spare could be made, and otherwise waits on the
 * queue for this worker or another, counted and said as a refused
 * accept is. Meanwhile the queue is out of this worker's epoll set for
 * NW_FD_ROOM_RETRY_MS (it is level-triggered: it would wake the worker
 * again at once, 1.9 million times in 2 s). */
static int room_for_one(nw_sources *s)
{
    static nw_log_limit fd_log;
    if (s->spare < 0 && (s->spare = fcntl(s->serve_queue, F_DUPFD_CLOEXEC, 3)) < 0) {
        int e = errno;
        nw_msec now = nw_now_ms();
        if (s->counts)
            s->counts->fd_limit++;
        nw_log_limited(&fd_log, now, "error",
                       "cannot take a connection from the manager: %s (open-file limit %llu); "
                       "it waits in the serve queue", strerror(e), open_file_limit());
        if (!s->serve_paused_until)
            epoll_ctl(s->epfd, EPOLL_CTL_DEL, s->serve_queue, NULL);
        s->serve_paused_until = now + NW_FD_ROOM_RETRY_MS;
        return 0;
    }
    close(s->spare);
    s->spare = -1;
    return 1;
}

/* Whether a frame waits (1), none does (-1), or the queue has ended (0),
 * asked without taking it: the spare is closed and made again only for a
 * frame (an empty look costs the one call it did before). */
static int frame_waits(nw_sources *s)
{
    char b;
    ssize_t n;
    do {
        n = recv(s->serve_queue, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    } while (n < 0 && errno == EINTR);
    return n > 0 ? 1 : n == 0 ? 0 : -1;
}

/* A frame came without its descriptor after all (another thread of the
 * process took the room): its connection is lost, and said. */
static void served_lost(nw_sources *s)
{
    static nw_log_limit lost_log;
    nw_log_limited(&lost_log, nw_now_ms(), "error",
                   "a connection from the manager was lost: no room for its descriptor "
                   "(open-file limit %llu)", open_file_limit());
    nw_scoreboard_queued_add(s->serve_queued, -1);
}

/* One that --proxy-from does not allow to send a PROXY header is closed
 * and the next one taken. */
nw_wconn *nw_sources_accept_on(nw_sources *s, int idx)
{
    nw_worker_listener *l = &s->listener[idx];
    for (;;) {
        struct sockaddr_storage peer;
        unsigned plen = sizeof peer;
        int fd = nw_io_accept(l->fd, l->is_tcp, (struct sockaddr *)&peer, &plen);
        if (fd < 0)
            return NULL;
        if (!proxy_allowed(s, &peer, plen)) {
            close(fd);      /* --proxy-from: not a peer that may send a PROXY header */
            continue;
        }
        return s->ops.conn_new(s->ctx, idx, fd, &peer, plen);
    }
}

void nw_sources_listener_empty(nw_sources *s, int idx)
{
    nw_worker_listener *l = &s->listener[idx];
    s->listener_ready &= ~((uint64_t)1 << idx);
    if (errno == EMFILE || errno == ENFILE)
        fd_limit_reached(s, idx);
    if (!l->is_tcp && nw_io_listener_shut(l->fd))
        epoll_ctl(s->epfd, EPOLL_CTL_DEL, l->fd, NULL);    /* (it would read ready forever) */
}

/* Try each listener that may have a client once, starting after the last
 * one that gave a client. A listener that has none is not tried again
 * until epoll reports it readable: an accept4 that fails costs as much as
 * one that succeeds. */
nw_wconn *nw_sources_accept_ready(nw_sources *s)
{
    if (s->listener_ready && s->ops.defer_accept(s->ctx))
        return NULL;
    for (int i = 0; i < s->count; i++) {
        int idx = (s->next + i) % s->count;
        if (!(s->listener_ready & ((uint64_t)1 << idx)))
            continue;
        nw_wconn *wc = nw_sources_accept_on(s, idx);
        if (wc) {
            s->next = idx + 1;
            s->ops.accepted(s->ctx);
            return wc;
        }
        if (errno == ENOMEM)
            return NULL;    /* (accepted, and closed: no memory for it) */
        nw_sources_listener_empty(s, idx);
    }
    return NULL;
}

/* ---- the serve queue ----------------------------------------------- */

/* A connection the manager serves (SERVE): the bytes it read become the
 * start of our buffer, its request count carries on. */
static nw_wconn *wconn_from_frame(nw_sources *s, const nw_frame *f, int fd)
{
    struct sockaddr_storage peer;
    socklen_t plen = sizeof peer;
    if (f->type != NW_FRAME_SERVE || f->listener >= s->count) {
        close(fd);
        return NULL;
    }
    if (getpeername(fd, (struct sockaddr *)&peer, &plen) < 0)
        plen = 0;   /* (the socket is non-blocking already: that flag travels with it) */
    if ((f->flags & NW_FRAME_F_PROXY) && !proxy_allowed(s, &peer, plen)) {
        close(fd);  /* --proxy-from: one the manager took from a listener itself */
        return NULL;
    }
    nw_wconn *wc = s->ops.conn_new(s->ctx, f->listener, fd, &peer, plen);
    if (!wc)
        return NULL;
    if (nw_buf_append(&wc->c->in, s->frame_data, f->data_len) < 0) {
        wc->c->fd = -1;
        close(fd);
        nw_conn_fd_gone(wc->c);
    }
    wc->c->requests = f->requests;
    wc->c->proxy_pending = (f->flags & NW_FRAME_F_PROXY) != 0;
    wc->c->drained = (f->flags & NW_FRAME_F_DRAINED) != 0;  /* (a close needs no lingering) */
    wc->ready_ms = f->ready_ms;     /* (narwhal_request_queue_seconds) */
    wc->queued = 1;
    return wc;
}

void nw_sources_serve_queue_due(nw_sources *s, nw_msec now)
{
    if (!s->serve_paused_until || now < s->serve_paused_until)
        return;
    struct epoll_event ev = { .events = EPOLLIN | EPOLLEXCLUSIVE, .data.u64 = s->serve_event };
    s->serve_paused_until = 0;
    if (epoll_ctl(s->epfd, EPOLL_CTL_ADD, s->serve_queue, &ev) == 0)
        s->serve_queue_ready = 1;
}

/* Whichever free worker looks first gets it. */
nw_wconn *nw_sources_take_served(nw_sources *s)
{
    while (s->serve_queue >= 0 && s->serve_queue_ready) {
        nw_frame f;
        int fd, r = frame_waits(s);
        if (r > 0 && !room_for_one(s)) {
            s->serve_queue_ready = 0;
            return NULL;
        }
        f.magic = 0;
        int e = 0;
        if (r > 0) {
            r = nw_frame_recv(s->serve_queue, &f, s->frame_data, NW_FRAME_MAX_DATA, &fd);
            e = errno;
            s->spare = fcntl(s->serve_queue, F_DUPFD_CLOEXEC, 3);  /* (-1 at the limit: tried again) */
        }
        if (r == 0) {
            /* end of stream: the master and the manager are gone. Stop
             * watching it, or epoll would report it ready forever. */
            epoll_ctl(s->epfd, EPOLL_CTL_DEL, s->serve_queue, NULL);
            s->serve_queue_ready = 0;
            return NULL;
        }
        if (r < 0) {
            if (e == EBADMSG && f.magic == NW_FRAME_MAGIC && f.type == NW_FRAME_SERVE)
                served_lost(s);
            s->serve_queue_ready = 0;  /* nothing waiting (another worker took it), or a bad frame */
            return NULL;
        }
        nw_wconn *wc = fd >= 0 ? wconn_from_frame(s, &f, fd) : NULL;
        /* Off the queue, and (nw_conn_new) counted in this worker's slot
         * already: the connection is in one of the two counts all along
         * (narwhal_connections), never in neither. */
        nw_scoreboard_queued_add(s->serve_queued, -1);
        if (wc)
            return wc;
    }
    return NULL;
}

void nw_sources_pass_on_waiting(nw_sources *s, int standby)
{
    nw_wconn *wc;
    int waiting = 0;
    for (int i = 0; i < NW_PASS_ON_MAX && s->serve_queue >= 0
                    && ioctl(s->serve_queue, FIONREAD, &waiting) == 0 && waiting > 0; i++) {
        s->serve_queue_ready = 1;
        if (!(wc = nw_sources_take_served(s)))
            break;
        s->ops.let_go(s->ctx, wc);
    }
    if (standby)
        return;
    nw_sources_all_ready(s);
    for (int i = 0; i < NW_PASS_ON_MAX * s->count && (wc = nw_sources_accept_ready(s)); i++)
        s->ops.let_go(s->ctx, wc);
}

void nw_sources_close(nw_sources *s)
{
    if (s->serve_queue >= 0)
        close(s->serve_queue);
    if (s->spare >= 0)
        close(s->spare);
    s->serve_queue = -1;
    s->spare = -1;
    free(s->proxy_from);
    s->proxy_from = NULL;
    s->proxy_from_n = 0;
    free(s->frame_data);
    s->frame_data = NULL;
}
