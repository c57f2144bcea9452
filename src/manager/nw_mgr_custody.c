/* See nw_mgr_custody.h. */
#include "nw_mgr_custody.h"
#include "nw_proxy.h"

#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/syscall.h>
#include <unistd.h>

void nw_mgr_custody_init(nw_mgr_custody *c, nw_mgr_table *t, const nw_mgr_clock *clock,
                         nw_mgr_heads *heads, const nw_scoreboard *board)
{
    memset(c, 0, sizeof *c);
    c->table = t;
    c->clock = clock;
    c->heads = heads;
    c->board = board;
}

void nw_mgr_custody_hung_up(nw_mgr_custody *c, int fd)
{
    nw_custody_remove(&c->index, nw_mgr_table_slot(c->table, fd)->cookie);
    nw_mgr_table_drop(c->table, fd);    /* (out of epoll, closed) */
}

/* The pidfd watching pid, opened on its first custody frame (-1: none). */
static int worker_fd(nw_mgr_custody *c, int pid)
{
    for (size_t i = 0; i < c->nworkers; i++)
        if ((int)nw_mgr_table_slot(c->table, c->worker_fds[i])->requests == pid)
            return c->worker_fds[i];
    if (c->nworkers == c->workers_cap) {
        size_t cap = c->workers_cap ? 2 * c->workers_cap : 16;
        int *p = realloc(c->worker_fds, cap * sizeof *p);
        if (!p)
            return -1;
        c->worker_fds = p;
        c->workers_cap = cap;
    }
    int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (pidfd < 0)
        return -1;      /* reaped already, or no pidfds: no custody */
    if (nw_mgr_table_reserve(c->table, pidfd) < 0
        || nw_mgr_table_watch(c->table, pidfd, EPOLLIN) < 0) {
        close(pidfd);
        return -1;
    }
    c->worker_fds[c->nworkers++] = pidfd;
    nw_mgr_slot *s = nw_mgr_table_fresh(c->table, pidfd);
    s->kind = NW_MGR_WORKER;
    s->requests = (uint32_t)pid;
    return pidfd;
}

/* A socket held already changes owner (a leaving worker's connection,
 * adopted by another): the copy that came is one too many. */
static void change_owner(nw_mgr_custody *c, int held, const nw_frame *f,
                         const nw_frame_custody *rec, int fd)
{
    close(fd);
    if (rec->pid <= 0 || worker_fd(c, rec->pid) < 0) {
        nw_mgr_custody_hung_up(c, held);    /* its new owner cannot be watched */
        return;
    }
    nw_mgr_table_slot(c->table, held)->owner = rec->pid;
    nw_mgr_table_slot(c->table, held)->requests = f->requests;
}

/* A new copy: held, unless the manager is full or cannot watch its worker
 * (it ends with its worker then, as without custody). */
static void hold(nw_mgr_custody *c, const nw_frame *f, const nw_frame_custody *rec, int fd,
                 const char *proxy, size_t proxy_len)
{
    if (nw_mgr_table_full(c->table, c->index.count) || rec->pid <= 0
        || worker_fd(c, rec->pid) < 0 || nw_mgr_table_reserve(c->table, fd) < 0) {
        close(fd);
        return;
    }
    nw_mgr_slot *s = nw_mgr_table_fresh(c->table, fd);
    if (((f->flags & NW_FRAME_F_PROXY) && nw_mgr_table_keep(s, proxy, proxy_len) < 0)
        || nw_custody_add(&c->index, rec->cookie, fd) < 0) {
        nw_mgr_table_forget(c->table, fd);
        return;
    }
    if (nw_mgr_table_watch(c->table, fd, EPOLLRDHUP) < 0) {
        nw_custody_remove(&c->index, rec->cookie);
        nw_mgr_table_forget(c->table, fd);
        return;
    }
    s->kind = NW_MGR_CUSTODY;
    s->cookie = rec->cookie;
    s->owner = rec->pid;
    s->requests = f->requests;
    s->listener = f->listener;
    s->flags = (f->flags & NW_FRAME_F_PROXY) ? NW_MGR_F_PROXY : 0;
}

int nw_mgr_custody_frame(nw_mgr_custody *c, const nw_frame *f, int fd, const char *data)
{
    nw_frame_custody rec;
    if (f->data_len < sizeof rec || (fd < 0) != ((f->flags & NW_FRAME_F_RELEASE) != 0)) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    memcpy(&rec, data, sizeof rec);
    int held = nw_custody_find(&c->index, rec.cookie);
    if (f->flags & NW_FRAME_F_RELEASE) {
        if (held >= 0)
            nw_mgr_custody_hung_up(c, held);
    } else if (held >= 0) {
        change_owner(c, held, f, &rec, fd);
    } else {
        hold(c, f, &rec, fd, data + sizeof rec, f->data_len - sizeof rec);
    }
    return 0;
}

void nw_mgr_custody_handed(nw_mgr_custody *c, int fd)
{
    if (c->index.count == 0)
        return;
    int held = nw_custody_find(&c->index, nw_io_socket_cookie(fd));
    if (held >= 0)
        nw_mgr_custody_hung_up(c, held);
}

/* A copy of a dead worker's connection becomes an idle connection, as if
 * handed off, with a fresh keep-alive deadline. */
static void take_over(nw_mgr_custody *c, int fd)
{
    nw_mgr_slot *s = nw_mgr_table_slot(c->table, fd);
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
    nw_custody_remove(&c->index, s->cookie);
    nw_mgr_table_detach(c->table, fd);
    nw_mgr_table_release(c->table, fd);
    nw_mgr_heads_take(c->heads, fd, &f, proxy);
}

static void forget_worker(nw_mgr_custody *c, int pidfd)
{
    for (size_t i = 0; i < c->nworkers; i++)
        if (c->worker_fds[i] == pidfd)
            c->worker_fds[i] = c->worker_fds[--c->nworkers];
    nw_mgr_table_detach(c->table, pidfd);
    nw_mgr_table_forget(c->table, pidfd);
}

/* If it left with its parked connections given away or closed (a
 * retirement, a stop: parked_released), or is not known any more, our
 * copies go. Otherwise (a KILL, an exit from the app) they are taken
 * over; except the one it was working on, whose request is lost: closed,
 * as its death alone would have done. */
void nw_mgr_custody_worker_ended(nw_mgr_custody *c, int pidfd)
{
    int pid = (int)nw_mgr_table_slot(c->table, pidfd)->requests;
    uint64_t serving = 0;
    int released = 1;
    size_t taken = 0, lost = 0;
    if (!c->board || !nw_scoreboard_worker_end(c->board, pid, &serving, &released))
        released = 1;
    for (size_t i = 0; i < nw_mgr_table_size(c->table); i++) {
        nw_mgr_slot *s = nw_mgr_table_slot(c->table, (int)i);
        if (s->kind != NW_MGR_CUSTODY || s->owner != pid)
            continue;
        if (released || s->cookie == serving) {
            lost += !released;
            nw_mgr_custody_hung_up(c, (int)i);
        } else {
            take_over(c, (int)i);
            taken++;
        }
    }
    forget_worker(c, pidfd);
    c->taken += taken;
    c->lost += lost;
    if (taken || lost)
        nw_log_limited(&c->said, nw_mgr_now(c->clock), "warn",
                       "worker %d ended without giving up its connections: took over %zu, "
                       "closed %zu (its request in flight)", pid, taken, lost);
}

/* Whether a worker is on the connection with this cookie now. */
static int being_served(const nw_scoreboard *board, uint64_t cookie)
{
    for (uint32_t k = 0; k < board->h.nslots; k++)
        if (board->slot[k].pid && board->slot[k].serving_cookie == cookie)
            return 1;
    return 0;
}

/* Requests waiting parked in a busy worker, as far as custody shows them:
 * of the copies the manager holds, the ones whose client has sent bytes
 * (a request, or its start), but not one a worker is on now. A lower
 * bound: a connection is copied 10 ms after its first park. Unknown
 * (parked_known 0) while workers hold parked connections and the manager
 * no copy at all (--no-custody). */
static void parked_readable(const nw_mgr_custody *c, nw_status_manager *sm)
{
    sm->parked_known = sm->board.parked == 0 || c->index.count > 0;
    sm->parked_readable = 0;
    if (!c->index.count || !c->board)
        return;
    struct pollfd *p = calloc(c->index.count, sizeof *p);
    if (!p) {
        sm->parked_known = 0;
        return;
    }
    nfds_t n = 0;
    for (size_t fd = 0; fd < nw_mgr_table_size(c->table) && n < c->index.count; fd++)
        if (nw_mgr_table_slot(c->table, (int)fd)->kind == NW_MGR_CUSTODY) {
            p[n].fd = (int)fd;
            p[n++].events = POLLIN;
        }
    if (poll(p, n, 0) > 0) {
        for (nfds_t i = 0; i < n; i++) {
            if ((p[i].revents & (POLLIN | POLLHUP | POLLERR)) != POLLIN)
                continue;   /* (nothing, or a hang-up: no request) */
            uint64_t cookie = nw_mgr_table_slot(c->table, p[i].fd)->cookie;
            sm->parked_readable += !being_served(c->board, cookie);
        }
    }
    free(p);
}

void nw_mgr_custody_numbers(const nw_mgr_custody *c, nw_status_manager *sm)
{
    parked_readable(c, sm);
    sm->custody = c->index.count;
    sm->custody_taken = c->taken;
    sm->custody_lost = c->lost;
}

void nw_mgr_custody_close(nw_mgr_custody *c)
{
    nw_custody_free(&c->index);
    free(c->worker_fds);
    c->worker_fds = NULL;
    c->nworkers = c->workers_cap = 0;
    nw_log_limited_unlist(&c->said);
}
