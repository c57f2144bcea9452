/* A worker's parked connections (see nw_park.h). Every operation is O(1)
 * except finding a readable slot, which is one memchr over the ready flags. */
#include "nw_park.h"

#include <errno.h>
#include <string.h>
#include <sys/epoll.h>

void nw_park_init(nw_park *p, int epfd, uint32_t event_base)
{
    memset(p, 0, sizeof *p);
    p->epfd = epfd;
    p->event_base = event_base;
    p->head = p->tail = -1;
    for (int i = 0; i < NW_MAX_PARKED; i++)
        p->free_slot[i] = NW_MAX_PARKED - 1 - i;
    p->nfree = NW_MAX_PARKED;
}

int nw_park_add(nw_park *p, int fd, void *item, nw_msec until, int *registered)
{
    if (p->nfree == 0 || !item)
        return -1;
    int i = p->free_slot[p->nfree - 1];
    struct epoll_event ev = { .events = EPOLLIN | EPOLLRDHUP | EPOLLONESHOT,
                              .data.u32 = p->event_base + (uint32_t)i };
    int op = *registered ? EPOLL_CTL_MOD : EPOLL_CTL_ADD;
    if (epoll_ctl(p->epfd, op, fd, &ev) < 0) {
        /* The caller's idea of the registration can be stale (a dup of the
         * socket kept the file registered): try the other way once. */
        int other = op == EPOLL_CTL_ADD ? EPOLL_CTL_MOD : EPOLL_CTL_ADD;
        if (!(errno == EEXIST || errno == ENOENT) || epoll_ctl(p->epfd, other, fd, &ev) < 0)
            return -1;
    }
    *registered = 1;
    p->nfree--;
    p->item[i] = item;
    p->fd[i] = fd;
    p->until[i] = until;
    p->ready[i] = 0;
    p->next[i] = -1;
    p->prev[i] = p->tail;
    if (p->tail >= 0)
        p->next[p->tail] = i;
    else
        p->head = i;
    p->tail = i;
    p->count++;
    return 0;
}

int nw_park_event(nw_park *p, uint32_t data)
{
    if (data < p->event_base || data >= p->event_base + NW_MAX_PARKED)
        return 0;
    int i = (int)(data - p->event_base);
    if (p->item[i] && !p->ready[i]) {
        p->ready[i] = 1;
        p->ready_count++;
    }
    return 1;
}

/* Take slot i out: out of the list, back on the free stack; out of epoll
 * too with unwatch. */
static void *take_slot(nw_park *p, int i, int unwatch)
{
    void *item = p->item[i];
    if (unwatch)
        epoll_ctl(p->epfd, EPOLL_CTL_DEL, p->fd[i], NULL);
    if (p->prev[i] >= 0)
        p->next[p->prev[i]] = p->next[i];
    else
        p->head = p->next[i];
    if (p->next[i] >= 0)
        p->prev[p->next[i]] = p->prev[i];
    else
        p->tail = p->prev[i];
    if (p->ready[i])
        p->ready_count--;
    p->ready[i] = 0;
    p->item[i] = NULL;
    p->fd[i] = -1;
    p->free_slot[p->nfree++] = i;
    p->count--;
    return item;
}

void *nw_park_take_ready(nw_park *p)
{
    if (p->ready_count == 0)
        return NULL;
    const unsigned char *r = memchr(p->ready + p->cursor, 1, NW_MAX_PARKED - p->cursor);
    if (!r)
        r = memchr(p->ready, 1, p->cursor);
    if (!r)
        return NULL;
    int i = (int)(r - p->ready);
    p->cursor = (i + 1) % NW_MAX_PARKED;
    return take_slot(p, i, 0);
}

void *nw_park_take_expired(nw_park *p, nw_msec now, int everything)
{
    for (int i = p->head; i >= 0; i = p->next[i]) {
        if (everything)
            return take_slot(p, i, 1);
        if (p->until[i] > now)
            return NULL;     /* the list is in deadline order */
        if (!p->ready[i])
            return take_slot(p, i, 1);
    }
    return NULL;
}

nw_msec nw_park_nearest(const nw_park *p)
{
    for (int i = p->head; i >= 0; i = p->next[i])
        if (!p->ready[i])
            return p->until[i];
    return 0;
}

int nw_park_fd(const nw_park *p, int i)
{
    return (i >= 0 && i < NW_MAX_PARKED && p->item[i]) ? p->fd[i] : -1;
}
