/* The connection manager's event loop. See nw_manager.h for the contract,
 * docs/DESIGN.md and docs/PROTOCOL.md for why it exists and what it says.
 *
 * Choices worth knowing:
 *  - epoll is level-triggered everywhere. A client connection gets one read
 *    (at most NW_READ_CHUNK bytes) per wake-up and a channel at most
 *    NW_MANAGER_FRAMES_PER_WAKE frames, and level triggering brings us back
 *    for the rest; so one fast client or one chatty worker cannot starve the
 *    others, and nothing is lost if we stop early.
 *  - Every fd we hold has a record in one slab indexed by fd: connections,
 *    and worker channels too (so an epoll event needs no other lookup).
 *    List links are fds, not pointers, because the slab moves when it grows.
 *  - An fd is always taken out of epoll (EPOLL_CTL_DEL) before it is closed:
 *    the master still holds a copy of every worker channel, and a worker may
 *    not yet have closed its copy of a handed-off client, and epoll forgets
 *    an fd only when the last copy closes.
 *  - Events are acted on by trying the operation (recv with MSG_DONTWAIT),
 *    never by trusting the event flags alone, so a stale event for an fd
 *    number reused within one epoll_wait batch costs one EAGAIN.
 *  - Blank lines before a request line (RFC 9112 2.2) are dropped while no
 *    head has begun, and do not count as its first byte: a client sending
 *    CRLF now and then cannot keep an idle connection alive.
 *  - Signals come through a signalfd, so there is no handler and no race
 *    with epoll_wait. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "nw_manager.h"
#include "nw_mgr_clock.h"
#include "nw_mgr_handover.h"
#include "nw_mgr_heads.h"
#include "nw_mgr_offload.h"
#include "nw_mgr_shed.h"
#include "nw_mgr_table.h"
#include "nw_custody.h"
#include "nw_frame.h"
#include "nw_http.h"
#include "nw_io.h"
#include "nw_limits.h"
#include "nw_proxy.h"
#include "nw_log.h"
#include "nw_response.h"
#include "nw_scoreboard.h"
#include "nw_status.h"
#include "nw_status_server.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/un.h>
#include <time.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>


#define NW_MANAGER_EVENTS           256
#define NW_MANAGER_STATS_MS         1000

typedef struct {
    int     ep, control, sigfd;
    int     handoff_queue;  /* HANDOFF frames from every worker */
    nw_mgr_table table;     /* every fd's record, and the client connections' lists */
    nw_mgr_handover handover;       /* to the workers through the serve queue */
    nw_mgr_shed shed;               /* --max-queue-wait */
    nw_mgr_heads heads;             /* idle connections and heads arriving */
    nw_mgr_offload offload;         /* responses written for the workers */
    nw_score_header *shared;         /* the board's words the manager writes, or NULL: */
    volatile int64_t *offload_bytes; /* ...its count (--max-offload-total), or NULL */
    volatile int64_t *serve_queued;  /* ...SERVE frames on the serve queue, or NULL */
    volatile int64_t *handoff_queued; /* ...HANDOFF frames on the handoff queue, or NULL */
    nw_manager_stats st;    /* the running totals; gauges filled in when sent */
    nw_mgr_clock clock;
    nw_msec next_stats, stats_ms;
    nw_msec stop_serve_ms;  /* a stop signal: serve this long (NW_STOP_SERVE_MS) */
    char   *frame_data;     /* NW_FRAME_MAX_DATA bytes for incoming frames */
    int     stop;
    nw_msec serve_until;    /* a stop signal came: serve until then, then close (0: none) */
    int     bad_frame_logged;
    /* the operator layer (DESIGN.md) */
    const nw_scoreboard *board;     /* read-only; NULL when the master gave none */
    nw_status_server status;        /* --status-listen and its clients */
    int     listeners[NW_MAX_LISTENERS];
    int     nlisteners;
    int     accepting;              /* the listeners are in epoll: the pool is stuck */
    nw_msec next_look;              /* when to look at the pool again */
    nw_log_limit fd_limit_said;     /* "cannot take a connection" lines */
    int     proxy_protocol;         /* --proxy-protocol: what it takes begins with a header */
    const char *error_log;          /* --error-log (USR1 reopens it), or NULL */
    /* custody (DESIGN.md): copies of the workers' parked connections */
    nw_custody_index custody;       /* cookie -> our copy's fd */
    int    *worker_fds;             /* the pidfds watched (NW_MGR_WORKER records) */
    size_t  nworkers, workers_cap;
    uint64_t custody_taken;         /* taken over from a worker that died, total */
    uint64_t custody_lost;          /* closed because the worker died serving them, total */
    nw_log_limit custody_said;      /* "a worker ended holding ..." lines */
} nw_manager;

/* ------------------------------------------------------------ custody */

/* A copy of a worker's parked connection (DESIGN.md, "Custody of parked
 * connections"): held, watched for its hang-up only, never read, until
 * the worker closes the connection (its shutdown hangs ours up), hands it
 * here, lends it to the app, or ends. */

static void nw_manager_bad_frame(nw_manager *m, const char *from);
static int nw_manager_handoff_queue_readable(nw_manager *m);

static void nw_manager_custody_drop(nw_manager *m, int fd)
{
    nw_custody_remove(&m->custody, nw_mgr_table_slot(&m->table, fd)->cookie);
    nw_mgr_table_drop(&m->table, fd);    /* (out of epoll, closed) */
}

/* The pidfd watching pid, opened on its first custody frame (-1: none). */
static int nw_manager_worker_fd(nw_manager *m, int pid)
{
    for (size_t i = 0; i < m->nworkers; i++)
        if ((int)nw_mgr_table_slot(&m->table, m->worker_fds[i])->requests == pid)
            return m->worker_fds[i];
    if (m->nworkers == m->workers_cap) {
        size_t cap = m->workers_cap ? 2 * m->workers_cap : 16;
        int *p = realloc(m->worker_fds, cap * sizeof *p);
        if (!p)
            return -1;
        m->worker_fds = p;
        m->workers_cap = cap;
    }
    int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (pidfd < 0)
        return -1;      /* reaped already, or no pidfds: no custody */
    struct epoll_event ev = { .events = EPOLLIN, .data.fd = pidfd };
    if (nw_mgr_table_reserve(&m->table, pidfd) < 0 || epoll_ctl(m->ep, EPOLL_CTL_ADD, pidfd, &ev) < 0) {
        close(pidfd);
        return -1;
    }
    m->worker_fds[m->nworkers++] = pidfd;
    nw_mgr_table_fresh(&m->table, pidfd);
    nw_mgr_table_slot(&m->table, pidfd)->kind = NW_MGR_WORKER;
    nw_mgr_table_slot(&m->table, pidfd)->requests = (uint32_t)pid;
    return pidfd;
}

/* CUSTODY: hold the copy (or, with RELEASE, let ours go). A socket held
 * already changes owner (a leaving worker's connection, adopted by
 * another): the copy that came is one too many. */
static void nw_manager_custody_frame(nw_manager *m, const nw_frame *f, int fd, const char *data)
{
    nw_frame_custody rec;
    if (f->data_len < sizeof rec || (fd < 0) != ((f->flags & NW_FRAME_F_RELEASE) != 0)) {
        if (fd >= 0)
            close(fd);
        nw_manager_bad_frame(m, "a worker");
        return;
    }
    memcpy(&rec, data, sizeof rec);
    int held = nw_custody_find(&m->custody, rec.cookie);
    if (f->flags & NW_FRAME_F_RELEASE) {
        if (held >= 0)
            nw_manager_custody_drop(m, held);
        return;
    }
    if (held >= 0) {
        close(fd);
        if (rec.pid <= 0 || nw_manager_worker_fd(m, rec.pid) < 0) {
            nw_manager_custody_drop(m, held);   /* its new owner cannot be watched */
            return;
        }
        nw_mgr_table_slot(&m->table, held)->owner = rec.pid;
        nw_mgr_table_slot(&m->table, held)->requests = f->requests;
        return;
    }
    int full = nw_mgr_table_full(&m->table, m->custody.count);
    struct epoll_event ev = { .events = EPOLLRDHUP, .data.fd = fd };
    if (full || rec.pid <= 0 || nw_manager_worker_fd(m, rec.pid) < 0
        || nw_mgr_table_reserve(&m->table, fd) < 0) {
        close(fd);      /* not held: it ends with its worker, as without custody */
        return;
    }
    nw_mgr_slot *s = nw_mgr_table_slot(&m->table, fd);
    memset(s, 0, sizeof *s);
    size_t extra = f->data_len - sizeof rec;
    if (((f->flags & NW_FRAME_F_PROXY) && nw_mgr_table_keep(s, data + sizeof rec, extra) < 0)
        || nw_custody_add(&m->custody, rec.cookie, fd) < 0) {
        nw_mgr_table_forget(&m->table, fd);
        return;
    }
    if (epoll_ctl(m->ep, EPOLL_CTL_ADD, fd, &ev) < 0) {
        nw_custody_remove(&m->custody, rec.cookie);
        nw_mgr_table_forget(&m->table, fd);
        return;
    }
    s->kind = NW_MGR_CUSTODY;
    s->cookie = rec.cookie;
    s->owner = rec.pid;
    s->requests = f->requests;
    s->listener = f->listener;
    s->flags = (f->flags & NW_FRAME_F_PROXY) ? NW_MGR_F_PROXY : 0;
}

/* A connection a worker handed here: if we held a copy of it, that copy
 * is not needed any more (this one is the connection now). */
static void nw_manager_custody_handed(nw_manager *m, int fd)
{
    if (m->custody.count == 0)
        return;
    int held = nw_custody_find(&m->custody, nw_io_socket_cookie(fd));
    if (held >= 0)
        nw_manager_custody_drop(m, held);
}

/* A worker we hold copies for died, or left some other way. If it left
 * with its parked connections given away or closed (a retirement, a
 * stop: parked_released), or is not known any more, our copies go.
 * Otherwise (a KILL, an exit from the app) they are taken over as idle
 * connections, as if handed off, with a fresh keep-alive deadline;
 * except the one it was working on, whose request is lost: closed, as
 * its death alone would have done. */
static void nw_manager_worker_ended(nw_manager *m, int pidfd)
{
    int pid = (int)nw_mgr_table_slot(&m->table, pidfd)->requests;
    uint64_t serving = 0;
    int released = 1;
    size_t taken = 0, lost = 0;
    /* what it sent before it ended is in the handoff queue, before
     * anything we do now: hand-offs of connections we hold copies of */
    for (int i = 0; i < NW_MANAGER_FRAMES_PER_WAKE && nw_manager_handoff_queue_readable(m); i++)
        continue;
    if (!m->board || !nw_scoreboard_worker_end(m->board, pid, &serving, &released))
        released = 1;
    for (size_t i = 0; i < m->table.nslots; i++) {
        nw_mgr_slot *s = nw_mgr_table_slot(&m->table, i);
        int fd = (int)i;
        if (s->kind != NW_MGR_CUSTODY || s->owner != pid)
            continue;
        if (released || s->cookie == serving) {
            lost += !released;
            nw_manager_custody_drop(m, fd);
            continue;
        }
        /* its PROXY header (rebuilt by the worker) goes in front, as in a HANDOFF */
        char proxy[NW_PROXY_V2_ROOM];
        size_t plen = s->head_len <= sizeof proxy ? s->head_len : 0;
        if (plen)
            memcpy(proxy, s->head, plen);
        nw_frame f;
        nw_frame_init(&f, NW_FRAME_HANDOFF);
        f.listener = s->listener;
        f.requests = s->requests;
        f.deadline_ms = -1;
        f.flags = (s->flags & NW_MGR_F_PROXY) ? NW_FRAME_F_PROXY : 0;
        f.data_len = (uint32_t)plen;
        nw_custody_remove(&m->custody, s->cookie);
        nw_mgr_table_detach(&m->table, fd);
        nw_mgr_table_release(&m->table, fd);
        nw_mgr_heads_take(&m->heads, fd, &f, proxy);
        taken++;
    }
    for (size_t i = 0; i < m->nworkers; i++)
        if (m->worker_fds[i] == pidfd)
            m->worker_fds[i] = m->worker_fds[--m->nworkers];
    nw_mgr_table_detach(&m->table, pidfd);
    nw_mgr_table_forget(&m->table, pidfd);
    m->custody_taken += taken;
    m->custody_lost += lost;
    if (taken || lost)
        nw_log_limited(&m->custody_said, m->clock.now, "warn",
                       "worker %d ended without giving up its connections: took over %zu, "
                       "closed %zu (its request in flight)", pid, taken, lost);
}

/* ------------------------------------------------------------ channels */

/* nw_frame_recv has closed any fd that came with it. A receive that ran
 * out of fds (RLIMIT_NOFILE) looks the same: the kernel truncates it. */
static void nw_manager_bad_frame(nw_manager *m, const char *from)
{
    if (m->bad_frame_logged)
        return;
    m->bad_frame_logged = 1;
    nw_log("error", "dropped a malformed or truncated frame "
            "from %s (%s); further ones are dropped silently\n", from, strerror(errno));
}

static void nw_manager_close_fds(int *fds)
{
    for (int i = 0; i < NW_FRAME_MAX_FDS; i++)
        if (fds[i] >= 0)
            close(fds[i]);
}

static void nw_manager_handoff_frame(nw_manager *m, const nw_frame *f, int *fds)
{
    if (f->type == NW_FRAME_HANDOFF)
        nw_scoreboard_queued_add(m->handoff_queued, -1);   /* (its sender counted it) */
    if (f->type == NW_FRAME_CUSTODY && fds[1] < 0) {
        nw_manager_custody_frame(m, f, fds[0], m->frame_data);
        return;
    }
    if (f->type == NW_FRAME_HANDOFF && fds[0] >= 0)
        nw_manager_custody_handed(m, fds[0]);
    if (f->type == NW_FRAME_HANDOFF && (f->flags & NW_FRAME_F_OUTPUT)) {
        if (nw_mgr_offload_take(&m->offload, fds, f, m->frame_data) == 0) {
            m->st.received++;
            return;
        }
        nw_manager_bad_frame(m, "a worker");
    } else if (f->type == NW_FRAME_HANDOFF && fds[0] >= 0 && fds[1] < 0) {
        m->st.received++;
        nw_mgr_heads_take(&m->heads, fds[0], f, m->frame_data);
        return;
    }
    nw_manager_close_fds(fds);   /* fds a frame should not carry */
}

/* Returns 1 when it stopped with frames perhaps still waiting. */
static int nw_manager_handoff_queue_readable(nw_manager *m)
{
    for (int i = 0; i < NW_MANAGER_FRAMES_PER_WAKE; i++) {
        nw_frame f;
        int fds[NW_FRAME_MAX_FDS];
        int r = nw_frame_recv_fds(m->handoff_queue, &f, m->frame_data, NW_FRAME_MAX_DATA, fds);
        if (r > 0) {
            nw_manager_handoff_frame(m, &f, fds);
            continue;
        }
        if (r < 0 && errno == EBADMSG) {
            nw_manager_bad_frame(m, "a worker");
            continue;
        }
        return 0; /* EAGAIN; end of stream cannot happen while the master holds the other end */
    }
    return 1;
}

static void nw_manager_control_readable(nw_manager *m)
{
    for (int i = 0; i < NW_MANAGER_FRAMES_PER_WAKE; i++) {
        nw_frame f;
        int fd;
        int r = nw_frame_recv(m->control, &f, m->frame_data, NW_FRAME_MAX_DATA, &fd);
        if (r > 0) {
            if (fd >= 0)
                close(fd);   /* the master sends nothing the manager acts on */
            continue;
        }
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (r < 0 && errno == EBADMSG) {
            nw_manager_bad_frame(m, "the master");
            continue;
        }
        m->stop = 1;   /* end of stream or a broken socket: the master is gone */
        return;
    }
}

/* ------------------------------------------------------------ a stuck pool */

/* DESIGN.md, "When every worker is busy": while every worker has been on
 * its request for NW_POOL_STUCK_MS, new connections are taken here, read,
 * and queued with the time their request arrived, instead of waiting
 * unseen in the listen queue; as soon as a worker is free again, the
 * workers accept them directly, as always. */
static void nw_manager_take_listeners(nw_manager *m, int on)
{
    if (on && m->next_stats > m->clock.now + NW_POOL_LOOK_IDLE_MS)
        m->next_stats = m->clock.now + NW_POOL_LOOK_IDLE_MS;
    struct epoll_event ev = { .events = EPOLLIN };
    for (int i = 0; i < m->nlisteners; i++) {
        ev.data.fd = m->listeners[i];
        epoll_ctl(m->ep, on ? EPOLL_CTL_ADD : EPOLL_CTL_DEL, m->listeners[i], &ev);
    }
    m->accepting = on;
}

static void nw_manager_look_at_pool(nw_manager *m)
{
    if (!m->board || !m->nlisteners)
        return;
    /* A stop: the workers drain the queue. (Not a drain delay, where the
     * board says stopping already: the standby workers still need what
     * the look gives them.) */
    if (m->serve_until) {
        if (m->accepting)
            nw_manager_take_listeners(m, 0);
        return;
    }
    if (m->clock.now < m->next_look)
        return;
    int busy = 0;
    int stuck = nw_scoreboard_pool_stuck(m->board, nw_now_us(),
                                            (uint64_t)NW_POOL_STUCK_MS * 1000, 1, &busy);
    m->next_look = m->clock.now + (busy ? NW_POOL_LOOK_MS : NW_POOL_LOOK_IDLE_MS);
    if (stuck != m->accepting)
        nw_manager_take_listeners(m, stuck);
}

static int nw_manager_listener_index(const nw_manager *m, int fd)
{
    for (int i = 0; i < m->nlisteners; i++)
        if (m->listeners[i] == fd)
            return i;
    return -1;
}

/* The listeners stay readable (level-triggered): out of epoll until the
 * next look at the pool, or the loop would spin on them. */
static void nw_manager_accept_pause(nw_manager *m)
{
    nw_manager_take_listeners(m, 0);
    m->next_look = m->clock.now + NW_POOL_LOOK_IDLE_MS;
}

static void nw_manager_accept(nw_manager *m, int i)
{
    for (int n = 0; m->accepting && n < NW_MANAGER_ACCEPT_BATCH; n++) {
        /* Full (--max-connections) with nothing idle to close: a new
         * client waits in the listen queue, as it would for a worker,
         * rather than be accepted only to be closed with its request unread. */
        if (nw_mgr_table_full(&m->table, 0)
            && nw_mgr_table_first(&m->table, NW_MGR_IDLE) == NW_MGR_NONE) {
            nw_manager_accept_pause(m);
            return;
        }
        int fd = accept4(m->listeners[i], NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED)
                return;
            if (errno == EMFILE || errno == ENFILE)
                nw_log_limited(&m->fd_limit_said, m->clock.now, "warn",
                               "the manager cannot take a connection: %s (the workers will)",
                               strerror(errno));
            nw_manager_accept_pause(m);
            return;
        }
        m->st.accepted++;
        nw_mgr_heads_accepted(&m->heads, fd, i, m->proxy_protocol);
    }
}

/* ------------------------------------------------------------ status numbers */

/* One listening socket's address, accept queue and its limit. */
static void nw_manager_one_listener(int fd, nw_status_listener *l)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    memset(l, 0, sizeof *l);
    l->queues = 1;
    if (getsockname(fd, (struct sockaddr *)&ss, &len) != 0)
        return;
    nw_format_address((struct sockaddr *)&ss, len, l->address, sizeof l->address);
    struct tcp_info ti;
    socklen_t tl = sizeof ti;
    if (ss.ss_family != AF_UNIX && getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &tl) == 0) {
        l->known = 1;
        l->queue = ti.tcpi_unacked;    /* on a listener: its accept queue */
        l->backlog = ti.tcpi_sacked;   /* ... and that queue's limit */
    }
}

/* An address with several sockets (--listen-queues) is one row: their
 * queues and limits summed. */
static void nw_manager_listener_info(const nw_manager *m, nw_status_manager *sm)
{
    sm->nlisteners = 0;
    for (int i = 0; i < m->nlisteners; i++) {
        nw_status_listener l;
        nw_manager_one_listener(m->listeners[i], &l);
        int j = 0;
        while (j < sm->nlisteners && !(l.address[0] && l.known
                                       && strcmp(sm->listener[j].address, l.address) == 0))
            j++;
        if (j < sm->nlisteners) {
            sm->listener[j].queue += l.queue;
            sm->listener[j].backlog += l.backlog;
            sm->listener[j].queues++;
        } else if (sm->nlisteners < NW_STATUS_MAX_LISTENERS) {
            sm->listener[sm->nlisteners++] = l;
        }
    }
}

/* Requests waiting parked in a busy worker, as far as custody shows them:
 * of the copies the manager holds, the ones whose client has sent bytes
 * (a request, or its start), but not one a worker is on now. A lower
 * bound: a connection is copied 10 ms after its first park. Unknown
 * (parked_known 0) while workers hold parked connections and the manager
 * no copy at all (--no-custody). */
static void nw_manager_parked_readable(const nw_manager *m, nw_status_manager *sm)
{
    sm->parked_known = sm->board.parked == 0 || m->custody.count > 0;
    sm->parked_readable = 0;
    if (!m->custody.count || !m->board)
        return;
    struct pollfd *p = calloc(m->custody.count, sizeof *p);
    if (!p) {
        sm->parked_known = 0;
        return;
    }
    nfds_t n = 0;
    for (size_t fd = 0; fd < m->table.nslots && n < m->custody.count; fd++)
        if (nw_mgr_table_slot(&m->table, fd)->kind == NW_MGR_CUSTODY) {
            p[n].fd = (int)fd;
            p[n++].events = POLLIN;
        }
    if (poll(p, n, 0) > 0) {
        for (nfds_t i = 0; i < n; i++) {
            if ((p[i].revents & (POLLIN | POLLHUP | POLLERR)) != POLLIN)
                continue;   /* (nothing, or a hang-up: no request) */
            uint64_t cookie = nw_mgr_table_slot(&m->table, p[i].fd)->cookie;
            int serving = 0;
            for (uint32_t k = 0; k < m->board->h.nslots && !serving; k++)
                serving = m->board->slot[k].pid && m->board->slot[k].serving_cookie == cookie;
            sm->parked_readable += !serving;
        }
    }
    free(p);
}

/* The running totals of every part; the gauges are left 0. */
static void gather_counts(const nw_manager *m, nw_manager_stats *st)
{
    *st = m->st;
    st->closed_full += m->table.closed_full;
    nw_mgr_handover_count(&m->handover, st);
    nw_mgr_shed_count(&m->shed, st);
    nw_mgr_heads_count(&m->heads, st);
    nw_mgr_offload_count(&m->offload, st);
}

/* The manager's part of a status page (nw_status_numbers_fn). */
static void nw_manager_status_numbers(void *arg, nw_status_manager *sm)
{
    const nw_manager *m = arg;
    nw_manager_stats st;
    gather_counts(m, &st);
    memset(sm, 0, sizeof *sm);
    sm->held_idle = nw_mgr_table_count(&m->table, NW_MGR_IDLE);
    sm->held_reading = nw_mgr_table_count(&m->table, NW_MGR_READING);
    sm->held_queued = nw_mgr_table_count(&m->table, NW_MGR_QUEUED);
    sm->held_writing = nw_mgr_table_count(&m->table, NW_MGR_WRITING);
    sm->held_closing = nw_mgr_table_count(&m->table, NW_MGR_CLOSING);
    if (m->board)
        nw_scoreboard_connections(m->board, &sm->board);
    nw_mgr_handover_refused(&m->handover, sm->refused);
    nw_manager_parked_readable(m, sm);
    sm->offloaded = st.offloaded;
    sm->offload_bytes = m->offload_bytes ? *m->offload_bytes : 0;
    sm->handoffs_in = st.received;
    sm->handoffs_out = st.handed_off;
    sm->shed = st.shed;
    sm->accepted = st.accepted;
    sm->accepting = m->accepting;
    sm->custody = m->custody.count;
    sm->custody_taken = m->custody_taken;
    sm->custody_lost = m->custody_lost;
    sm->stopping = m->serve_until != 0;
    nw_manager_listener_info(m, sm);
}

/* ------------------------------------------------------------ time */

static void nw_manager_expire(nw_manager *m)
{
    nw_mgr_heads_expire(&m->heads);
    nw_mgr_offload_expire(&m->offload);
}

/* Counts to the master once a second (stats_ms). A full control socket
 * drops them: the next ones follow a second later, and the manager must
 * never block. */
static void nw_manager_send_stats(nw_manager *m)
{
    if (m->clock.now < m->next_stats)
        return;
    nw_mgr_handover_flush_said(&m->handover);
    /* (while it takes new connections, the master's elastic pool wants to
     * know soon: accepted is its sign that clients wait) */
    m->next_stats = m->clock.now + (m->accepting && m->stats_ms > NW_POOL_LOOK_IDLE_MS
                              ? NW_POOL_LOOK_IDLE_MS : m->stats_ms);
    nw_manager_stats st;
    gather_counts(m, &st);
    st.idle = nw_mgr_table_held(&m->table);
    st.queued = nw_mgr_table_count(&m->table, NW_MGR_QUEUED);
    st.writing = nw_mgr_table_count(&m->table, NW_MGR_WRITING);
    nw_frame f;
    nw_frame_init(&f, NW_FRAME_STATS);
    f.data_len = sizeof st;
    (void)nw_frame_send(m->control, &f, &st, -1);
}

/* epoll_wait timeout: until the earliest deadline or the next stats. */
static int nw_manager_timeout(const nw_manager *m)
{
    nw_msec next = m->next_stats;
    next = nw_mgr_heads_next(&m->heads, next);
    next = nw_mgr_offload_next(&m->offload, next);
    next = nw_mgr_shed_next(&m->shed, next);
    next = nw_mgr_handover_next(&m->handover, next);
    if (m->board && m->nlisteners && m->next_look < next)
        next = m->next_look;
    if (m->status.active && m->clock.now + 1000 < next)
        next = m->clock.now + 1000;
    if (nw_mgr_clock_stands(&m->clock))
        return -1;      /* its time passes only with an advance, an event */
    nw_msec left = next - nw_now_ms();
    return left <= 0 ? 0 : (int)left;
}

/* ------------------------------------------------------------ the loop */

/* USR1 (after the master reopened --error-log, created the file and gave
 * it to --user): stderr onto the file at the path, so that the manager
 * does not go on writing to the rotated (or deleted) one. A failure is
 * said on the old stderr, and stderr stays where it was. */
static void nw_manager_reopen_error_log(nw_manager *m)
{
    if (!m->error_log)
        return;
    int fd = open(m->error_log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
        nw_log("error", "cannot reopen the error log %s: %s", m->error_log, strerror(errno));
        return;
    }
    if (fd != 2) {
        if (dup2(fd, 2) < 0)
            nw_log("error", "cannot reopen the error log %s: %s", m->error_log, strerror(errno));
        close(fd);
    }
    nw_log("info", "reopened the error log %s", m->error_log);
}

static void nw_manager_event(nw_manager *m, int fd)
{
    if ((m->status.fd >= 0 || m->status.active) && nw_status_server_event(&m->status, fd, m->clock.now))
        return;
    if (fd == m->control) {
        nw_manager_control_readable(m);
    } else if (fd == m->clock.test_fd && fd >= 0) {
        nw_mgr_clock_advance(&m->clock, m->ep);
    } else if (fd == m->sigfd) {
        struct signalfd_siginfo si;
        while (read(m->sigfd, &si, sizeof si) == (ssize_t)sizeof si) {
            if (si.ssi_signo == SIGUSR1)
                nw_manager_reopen_error_log(m);
            else if (!m->serve_until)
                m->serve_until = m->clock.now + m->stop_serve_ms;
        }
    } else if (fd == m->handoff_queue) {
        nw_manager_handoff_queue_readable(m);
    } else if (fd == m->handover.serve_queue) {
        nw_mgr_handover_drain(&m->handover);
    } else if (m->accepting && nw_manager_listener_index(m, fd) >= 0) {
        nw_manager_accept(m, nw_manager_listener_index(m, fd));
    } else if ((size_t)fd < m->table.nslots) {
        int kind = nw_mgr_table_slot(&m->table, fd)->kind;
        if (kind == NW_MGR_IDLE || kind == NW_MGR_READING)
            nw_mgr_heads_readable(&m->heads, fd);
        else if (kind == NW_MGR_WRITING)
            nw_mgr_offload_writable(&m->offload, fd);
        else if (kind == NW_MGR_CLOSING)
            nw_mgr_offload_closing_readable(&m->offload, fd);
        else if (kind == NW_MGR_CUSTODY)
            nw_manager_custody_drop(m, fd);     /* the worker or the client hung up */
        else if (kind == NW_MGR_WORKER)
            nw_manager_worker_ended(m, fd);
        /* anything else: a stale event for an fd closed in this batch */
    }
}

/* One of the manager's own descriptors in epoll, for input. */
static int watch(nw_manager *m, int fd)
{
    struct epoll_event ev = { .events = EPOLLIN, .data.fd = fd };
    return epoll_ctl(m->ep, EPOLL_CTL_ADD, fd, &ev);
}

static nw_msec nw_manager_ms(double seconds)
{
    if (!(seconds > 0))
        return 0;
    if (seconds > 0x7fffffff / 1000.0)
        return 0x7fffffff;
    return (nw_msec)(seconds * 1000.0 + 0.5);
}

/* The scoreboard, read-only, and the words of it the manager writes. */
static void map_board(nw_manager *m, int fd)
{
    if (fd >= 0 && !(m->board = nw_scoreboard_map(fd)))
        nw_log("error", "cannot map the scoreboard: %s", strerror(errno));
    if (m->board && (m->shared = nw_scoreboard_map_shared(fd))) {
        m->offload_bytes = &m->shared->offload_bytes;
        m->serve_queued = &m->shared->serve_queued;
        m->handoff_queued = &m->shared->handoff_queued;
        /* the rests an earlier manager held went with it (DESIGN.md, "Slow
         * readers"); the frames in the queues did not: their counts stay */
        __atomic_store_n(m->offload_bytes, 0, __ATOMIC_RELAXED);
    }
}

/* SIGPIPE ignored; TERM, INT and USR1 blocked, to be read from a signalfd. */
static void take_signals(sigset_t *set)
{
    struct sigaction ign;
    memset(&ign, 0, sizeof ign);
    ign.sa_handler = SIG_IGN;
    sigaction(SIGPIPE, &ign, NULL);
    sigemptyset(set);
    sigaddset(set, SIGTERM);
    sigaddset(set, SIGINT);
    sigaddset(set, SIGUSR1);
    sigprocmask(SIG_BLOCK, set, NULL);
}

static void init_parts(nw_manager *m, const nw_manager_config *cfg, int serve_queue)
{
    nw_mgr_table_init(&m->table, m->ep, cfg->max_connections, m->offload_bytes);
    nw_mgr_handover_init(&m->handover, &m->table, &m->clock, m->ep, serve_queue,
                         m->serve_queued);
    nw_mgr_shed_init(&m->shed, &m->table, &m->clock, &m->handover, cfg->serve_reader_fd,
                     nw_manager_ms(cfg->max_queue_wait), m->frame_data, m->serve_queued);
    nw_mgr_head_limits lim = {
        .keepalive_ms = nw_manager_ms(cfg->keepalive_timeout),
        .read_ms = nw_manager_ms(cfg->read_timeout),
        .read_timeout = cfg->read_timeout,
        .read_timeout_max = cfg->read_timeout_max,
        .min_head_rate = cfg->min_head_rate,
        .max_header = cfg->max_header_bytes,
        .max_line = cfg->max_request_line,
    };
    nw_mgr_heads_init(&m->heads, &m->table, &m->clock, &m->handover, &m->offload, &lim);
    nw_mgr_offload_init(&m->offload, &m->table, &m->clock, &m->handover, &m->heads,
                        nw_manager_ms(cfg->timeout ? cfg->timeout : NW_DEFAULT_TIMEOUT),
                        m->offload_bytes);
}

static int nw_manager_open(nw_manager *m, const nw_manager_config *cfg, int control,
                           int handoff_queue, int serve_queue)
{
    sigset_t set;
    memset(m, 0, sizeof *m);
    m->ep = m->sigfd = -1;
    m->control = control;
    m->handoff_queue = handoff_queue;
    nw_mgr_clock_init(&m->clock, cfg->test_clock_fd);
    m->stats_ms = cfg->stats_ms > 0 ? cfg->stats_ms : NW_MANAGER_STATS_MS;
    m->next_stats = m->clock.now + m->stats_ms;
    m->stop_serve_ms = cfg->stop_serve_ms > 0 ? cfg->stop_serve_ms : NW_STOP_SERVE_MS;
    nw_status_server_init(&m->status, cfg->status_fd);
    m->error_log = cfg->error_log;
    m->nlisteners = cfg->nlisteners;
    m->proxy_protocol = cfg->proxy_protocol;
    memcpy(m->listeners, cfg->listener_fds, sizeof m->listeners);
    map_board(m, cfg->scoreboard_fd);
    take_signals(&set);
    m->frame_data = malloc(NW_FRAME_MAX_DATA);
    m->ep = epoll_create1(EPOLL_CLOEXEC);
    init_parts(m, cfg, serve_queue);    /* (before any return: closing needs them) */
    if (!m->frame_data || m->ep < 0)
        return -1;
    if ((m->sigfd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC)) < 0)
        return -1;
    if (watch(m, m->sigfd) < 0 || watch(m, control) < 0 || watch(m, handoff_queue) < 0
        || (m->clock.test_fd >= 0 && watch(m, m->clock.test_fd) < 0))
        return -1;
    return nw_status_server_start(&m->status, m->ep, m->board, nw_manager_status_numbers, m);
}

/* On stop, held connections get a FIN (shutdown SHUT_WR) rather than a bare
 * close: a request that crosses it then meets end-of-stream, which clients
 * retry, instead of a reset, which they do not. What they send meanwhile is
 * read and dropped until they close or the linger time is up
 * (NW_MANAGER_LINGER_MS, which a written response without keep-alive gets
 * too). */

static int nw_manager_is_client(const nw_mgr_slot *s)
{
    return s->kind == NW_MGR_IDLE || s->kind == NW_MGR_READING
           || s->kind == NW_MGR_QUEUED || s->kind == NW_MGR_WRITING
           || s->kind == NW_MGR_CLOSING;
}

static void nw_manager_linger(nw_manager *m)
{
    size_t n = 0;
    struct pollfd *p = calloc(m->table.nslots ? m->table.nslots : 1, sizeof *p);
    if (!p)
        return;
    for (size_t fd = 0; fd < m->table.nslots; fd++) {
        if (!nw_manager_is_client(nw_mgr_table_slot(&m->table, fd)))
            continue;
        shutdown((int)fd, SHUT_WR);
        p[n].fd = (int)fd;
        p[n++].events = POLLIN;
    }
    /* (real time, a test clock or not: the manager's last wait, bounded) */
    nw_msec deadline = nw_now_ms() + NW_MANAGER_LINGER_MS;
    size_t open_left = n;
    while (open_left > 0) {
        nw_msec left = deadline - nw_now_ms();
        if (left <= 0 || poll(p, n, (int)left) <= 0)
            break;
        for (size_t i = 0; i < n; i++) {
            char sink[4096];
            if (p[i].fd < 0 || !p[i].revents)
                continue;
            if (read(p[i].fd, sink, sizeof sink) > 0)
                continue;
            nw_mgr_table_forget(&m->table, p[i].fd);
            p[i].fd = -1;
            open_left--;
        }
    }
    free(p);
}

/* The server stops: before the held connections get their FIN, serve what
 * has arrived on them, so that a request sent just before the stop is
 * answered (by a worker, which is still taking from the serve queue: the
 * master stops the workers after the manager) rather than met by
 * end-of-stream. Hand-offs still in the queue are taken first. One pass,
 * no waiting: a head still incomplete gets the FIN with the rest. */
static void nw_manager_serve_arrived(nw_manager *m)
{
    nw_manager_handoff_queue_readable(m);
    for (size_t fd = 0; fd < m->table.nslots; fd++) {
        int kind = nw_mgr_table_slot(&m->table, fd)->kind;
        if (kind == NW_MGR_IDLE || kind == NW_MGR_READING)
            nw_mgr_heads_readable(&m->heads, (int)fd);
    }
    nw_mgr_handover_drain(&m->handover);
}

/* Close everything: held connections, worker channels, our own fds. */
static void nw_manager_close(nw_manager *m)
{
    nw_mgr_table_close(&m->table);
    nw_custody_free(&m->custody);
    free(m->worker_fds);
    nw_status_server_close(&m->status);
    nw_scoreboard_unmap(m->board);
    nw_scoreboard_unmap_shared(m->shared);
    free(m->frame_data);
    if (m->ep >= 0)
        close(m->ep);
    if (m->sigfd >= 0)
        close(m->sigfd);
    if (m->control >= 0)
        close(m->control);
    if (m->handoff_queue >= 0)
        close(m->handoff_queue);
    nw_mgr_handover_close(&m->handover);
    nw_mgr_shed_close(&m->shed);
}

int nw_manager_run(const nw_manager_config *cfg, int control_fd, int handoff_queue_fd,
                   int serve_queue_fd)
{
    nw_manager m;
    struct epoll_event ev[NW_MANAGER_EVENTS];
    int rc = 0;
    if (nw_manager_open(&m, cfg, control_fd, handoff_queue_fd, serve_queue_fd) < 0) {
        nw_log("error", "cannot start: %s", strerror(errno));
        nw_manager_close(&m);
        return 1;
    }
    /* A stop signal does not end the loop at once: for NW_STOP_SERVE_MS
     * the manager goes on serving (the workers are stopped after it), so
     * busy keep-alive clients get their next request answered, with
     * Connection: close, instead of a FIN that races it. Then, for up to
     * NW_STOP_WRITE_MS more, it finishes the responses it writes for slow
     * readers and puts the requests still in its queue on the serve queue
     * as the workers make room: clients it took while every worker was
     * stuck are served by the workers' drain, as they would have been
     * from the listen queue. */
    while (!m.stop && !(m.serve_until && m.clock.now >= m.serve_until
                        && ((nw_mgr_table_count(&m.table, NW_MGR_WRITING) == 0 && nw_mgr_table_count(&m.table, NW_MGR_QUEUED) == 0)
                            || m.clock.now >= m.serve_until + NW_STOP_WRITE_MS))) {
        int timeout = nw_manager_timeout(&m);
        nw_msec stop_at = m.serve_until && m.clock.now >= m.serve_until
                          ? m.serve_until + NW_STOP_WRITE_MS : m.serve_until;
        if (stop_at && (timeout < 0 || timeout > stop_at - m.clock.now))
            timeout = stop_at > m.clock.now ? (int)(stop_at - m.clock.now) : 0;
        int n = epoll_wait(m.ep, ev, NW_MANAGER_EVENTS, timeout);
        if (n < 0 && errno != EINTR) {
            nw_log("error", "epoll_wait: %s", strerror(errno));
            rc = 1;
            break;
        }
        nw_mgr_clock_tick(&m.clock);
        for (int i = 0; i < n && !m.stop; i++)
            nw_manager_event(&m, ev[i].data.fd);
        nw_mgr_clock_step(&m.clock);
        nw_manager_expire(&m);
        nw_mgr_handover_retry(&m.handover);
        nw_mgr_shed_look(&m.shed);
        nw_manager_look_at_pool(&m);
        nw_status_server_expire(&m.status, m.clock.now);
        nw_manager_send_stats(&m);
        nw_mgr_clock_answer(&m.clock);
        nw_log_limited_flush_all(m.clock.now, 0);
    }
    if (m.serve_until) {
        nw_manager_serve_arrived(&m);
        nw_manager_linger(&m);
    } else if (m.stop) {
        nw_manager_linger(&m);     /* the master is gone: nobody to serve them */
    }
    nw_log_limited_flush_all(m.clock.now, 1);    /* (a stop does not lose the counts) */
    nw_log_limited_unlist(&m.fd_limit_said);
    nw_log_limited_unlist(&m.custody_said);
    nw_manager_close(&m);
    return rc;
}
