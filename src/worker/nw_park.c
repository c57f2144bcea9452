/* A worker's parked connections (see nw_park.h). Every operation is O(1)
 * except finding a readable slot, which is one memchr over the ready flags.
 *
 * Watches are edge-triggered and left in place while a connection is being
 * served. An event's data names a slot and that slot's generation: one for
 * a generation the slot has moved past is stale and dropped; one for a
 * free slot whose connection is away being served is kept as pending, and
 * the connection finds it when it comes back to the slot. */
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
    for (int i = 0; i < NW_MAX_PARKED; i++) {
        p->free_slot[i] = NW_MAX_PARKED - 1 - i;
        p->free_pos[NW_MAX_PARKED - 1 - i] = i;
    }
    p->nfree = NW_MAX_PARKED;
}

void nw_park_publish(nw_park *p, volatile uint32_t *to)
{
    p->published = to;
    if (to)
        *to = (uint32_t)p->count;
}

/* Take free slot i off the free stack (swap with the top). */
static void claim_slot(nw_park *p, int i)
{
    if (i >= p->used_slots)
        p->used_slots = i + 1;
    int pos = p->free_pos[i], top = p->free_slot[p->nfree - 1];
    p->free_slot[pos] = top;
    p->free_pos[top] = pos;
    p->nfree--;
}

/* Register fd for slot i under a new generation: ADD, or MOD when it is
 * registered already (under its old slot). Returns 0 or -1. */
static int watch_slot(nw_park *p, int i, int fd, int registered)
{
    p->gen[i]++;
    p->pending[i] = 0;
    p->hangup[i] = 0;
    struct epoll_event ev = { .events = EPOLLIN | EPOLLRDHUP | EPOLLET,
                              .data.u64 = (uint64_t)p->gen[i] << 32 | (p->event_base + (uint32_t)i) };
    int op = registered ? EPOLL_CTL_MOD : EPOLL_CTL_ADD;
    if (epoll_ctl(p->epfd, op, fd, &ev) == 0)
        return 0;
    /* The caller's idea of the registration can be stale (a dup of the
     * socket kept the file registered): try the other way once. */
    int other = op == EPOLL_CTL_ADD ? EPOLL_CTL_MOD : EPOLL_CTL_ADD;
    if (!(errno == EEXIST || errno == ENOENT) || epoll_ctl(p->epfd, other, fd, &ev) < 0)
        return -1;
    return 0;
}

int nw_park_add(nw_park *p, int fd, void *item, nw_msec until, int drained, nw_park_watch *w)
{
    if (p->nfree == 0 || !item)
        return -1;
    int i = w->slot;
    int own = w->registered && i >= 0 && i < NW_MAX_PARKED && !p->item[i] && p->gen[i] == w->gen;
    if (own && drained) {
        /* Back in its slot, watched all along: what arrived while it was
         * away is pending. */
        p->ready[i] = p->pending[i];
    } else {
        if (!own)
            i = p->free_slot[p->nfree - 1];
        if (watch_slot(p, i, fd, w->registered) < 0)
            return -1;
        w->registered = 1;
        w->slot = i;
        w->gen = p->gen[i];
        p->ready[i] = 0;
    }
    p->pending[i] = 0;
    claim_slot(p, i);
    p->item[i] = item;
    p->fd[i] = fd;
    p->until[i] = until;
    if (p->ready[i])
        p->ready_count++;
    p->next[i] = -1;
    p->prev[i] = p->tail;
    if (p->tail >= 0)
        p->next[p->tail] = i;
    else
        p->head = i;
    p->tail = i;
    p->count++;
    if (p->published)
        *p->published = (uint32_t)p->count;
    return 0;
}

int nw_park_event(nw_park *p, uint64_t data, uint32_t events)
{
    uint32_t low = (uint32_t)data, gen = (uint32_t)(data >> 32);
    if (low < p->event_base || low >= p->event_base + NW_MAX_PARKED)
        return 0;
    int i = (int)(low - p->event_base);
    if (gen != p->gen[i])
        return 1;                   /* a connection that has moved on */
    if (events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR))
        p->hangup[i] = 1;
    if (!p->item[i])
        p->pending[i] = 1;          /* away being served: for when it is back */
    else if (!p->ready[i]) {
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
    if (unwatch) {
        epoll_ctl(p->epfd, EPOLL_CTL_DEL, p->fd[i], NULL);
        p->gen[i]++;                /* nothing may come back to this slot */
    }
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
    p->pending[i] = 0;
    p->hangup[i] = 0;
    p->item[i] = NULL;
    memset(p->warm[i], 0, sizeof p->warm[i]);
    p->fd[i] = -1;
    p->free_pos[i] = p->nfree;
    p->free_slot[p->nfree++] = i;
    p->count--;
    if (p->published)
        *p->published = (uint32_t)p->count;
    return item;
}

/* The first ready slot at or after from (wrapping), or -1. */
static int ready_from(const nw_park *p, int from)
{
    int end = p->used_slots;
    if (from >= end)
        from = 0;
    const unsigned char *r = memchr(p->ready + from, 1, (size_t)(end - from));
    if (!r)
        r = memchr(p->ready, 1, (size_t)from);
    return r ? (int)(r - p->ready) : -1;
}

void *nw_park_take_ready(nw_park *p, int *hangup)
{
    *hangup = 0;
    if (p->ready_count == 0)
        return NULL;
    /* only as far as a slot was ever used: the free ones are taken from
     * the bottom, so a worker with a few connections scans a few bytes */
    int i = ready_from(p, p->cursor);
    if (i < 0)
        return NULL;
    p->cursor = i + 1;
    *hangup = p->hangup[i];
    return take_slot(p, i, 0);
}

void *nw_park_peek_ready(const nw_park *p, const void *const **warm)
{
    *warm = NULL;
    int i = p->ready_count ? ready_from(p, p->cursor) : -1;
    if (i < 0)
        return NULL;
    *warm = p->warm[i];
    return p->item[i];
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
