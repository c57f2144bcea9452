/* See nw_mgr_accept.h. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE     /* accept4 */
#endif
#include "nw_mgr_accept.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>

void nw_mgr_accept_init(nw_mgr_accept *a, nw_mgr_table *t, const nw_mgr_clock *clock,
                        nw_mgr_heads *heads, const nw_scoreboard *board, int ep,
                        const int *listeners, int nlisteners, int proxy_protocol)
{
    memset(a, 0, sizeof *a);
    a->table = t;
    a->clock = clock;
    a->heads = heads;
    a->board = board;
    a->ep = ep;
    memcpy(a->listeners, listeners, sizeof a->listeners);
    a->nlisteners = nlisteners;
    a->proxy_protocol = proxy_protocol;
}

void nw_mgr_accept_leave(nw_mgr_accept *a, uint64_t mask)
{
    a->left = mask;
}

static void take_listeners(nw_mgr_accept *a, int on)
{
    struct epoll_event ev = { .events = EPOLLIN };
    for (int i = 0; i < a->nlisteners; i++) {
        if (a->left & ((uint64_t)1 << i))
            continue;
        ev.data.fd = a->listeners[i];
        epoll_ctl(a->ep, on ? EPOLL_CTL_ADD : EPOLL_CTL_DEL, a->listeners[i], &ev);
    }
    a->taking = on;
}

/* Whether new clients wait in a TCP listener's accept queue (a unix
 * listener's queue is not known: no). */
static int clients_wait(const nw_mgr_accept *a)
{
    for (int i = 0; i < a->nlisteners; i++) {
        struct tcp_info ti;
        socklen_t tl = sizeof ti;
        if (!(a->left & ((uint64_t)1 << i))
            && getsockopt(a->listeners[i], IPPROTO_TCP, TCP_INFO, &ti, &tl) == 0
            && ti.tcpi_unacked > 0)
            return 1;
    }
    return 0;
}

/* The manager takes new clients itself while every accepting worker is
 * stuck (NW_POOL_STUCK_MS), and while a standby worker sits idle beside
 * accepting ones whose requests block and new clients wait in a listen
 * queue: what it takes goes to the serve queue, the standby worker
 * serves it, measures its requests blocking and accepts from then on (a
 * client per connection never reaches a standby worker otherwise).
 * (Not while a drain delay, where the board says stopping already: the
 * standby workers still need what the look gives them.) */
int nw_mgr_accept_look(nw_mgr_accept *a, int stopping)
{
    if (!a->board || !a->nlisteners)
        return 0;
    if (stopping) {
        if (a->taking)
            take_listeners(a, 0);
        return 0;
    }
    nw_msec now = nw_mgr_now(a->clock);
    if (now < a->next_look)
        return 0;
    int busy = 0;
    int stuck = nw_scoreboard_pool_stuck(a->board, nw_now_us(),
                                         (uint64_t)NW_POOL_STUCK_MS * 1000, 1, &busy)
                || (nw_scoreboard_standby_unused(a->board) && clients_wait(a));
    a->next_look = now + (busy || stuck ? NW_POOL_LOOK_MS : NW_POOL_LOOK_IDLE_MS);
    if (stuck == a->taking)
        return 0;
    take_listeners(a, stuck);
    return stuck;
}

static int listener_index(const nw_mgr_accept *a, int fd)
{
    for (int i = 0; i < a->nlisteners; i++)
        if (a->listeners[i] == fd)
            return i;
    return -1;
}

/* The listeners stay readable (level-triggered): out of epoll until the
 * next look at the pool, or the loop would spin on them. */
static void pause_taking(nw_mgr_accept *a)
{
    take_listeners(a, 0);
    a->next_look = nw_mgr_now(a->clock) + NW_POOL_LOOK_IDLE_MS;
}

/* Full (--max-connections) with nothing idle to close: a new client waits
 * in the listen queue, as it would for a worker, rather than be accepted
 * only to be closed with its request unread. */
static int no_room(const nw_mgr_accept *a)
{
    return nw_mgr_table_full(a->table, 0)
           && nw_mgr_table_first(a->table, NW_MGR_IDLE) == NW_MGR_NONE;
}

static void take_from(nw_mgr_accept *a, int i)
{
    for (int n = 0; a->taking && n < NW_MANAGER_ACCEPT_BATCH; n++) {
        if (no_room(a)) {
            pause_taking(a);
            return;
        }
        int fd = accept4(a->listeners[i], NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED)
                return;
            if (errno == EMFILE || errno == ENFILE)
                nw_log_limited(&a->fd_limit_said, nw_mgr_now(a->clock), "warn",
                               "the manager cannot take a connection: %s (the workers will)",
                               strerror(errno));
            pause_taking(a);
            return;
        }
        a->accepted++;
        nw_mgr_heads_accepted(a->heads, fd, i, a->proxy_protocol);
    }
}

int nw_mgr_accept_event(nw_mgr_accept *a, int fd)
{
    int i = a->taking ? listener_index(a, fd) : -1;
    if (i < 0)
        return 0;
    take_from(a, i);
    return 1;
}

int nw_mgr_accept_taking(const nw_mgr_accept *a)
{
    return a->taking;
}

nw_msec nw_mgr_accept_next(const nw_mgr_accept *a, nw_msec next)
{
    return a->board && a->nlisteners && a->next_look < next ? a->next_look : next;
}

/* ------------------------------------------------------------ status numbers */

/* One listening socket's address, accept queue and its limit. */
static void one_listener(int fd, nw_status_listener *l)
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
void nw_mgr_accept_numbers(const nw_mgr_accept *a, nw_status_manager *sm)
{
    sm->accepting = a->taking;
    sm->nlisteners = 0;
    for (int i = 0; i < a->nlisteners; i++) {
        nw_status_listener l;
        one_listener(a->listeners[i], &l);
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

void nw_mgr_accept_count(const nw_mgr_accept *a, nw_manager_stats *st)
{
    st->accepted += a->accepted;
}

void nw_mgr_accept_close(nw_mgr_accept *a)
{
    nw_log_limited_unlist(&a->fd_limit_said);
}
