/* See nw_mgr_table.h. */
#include "nw_mgr_table.h"
#include "nw_frame.h"
#include "nw_scoreboard.h"

#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#define HEAD_MIN 1024   /* first allocation for a partial head */

/* DESIGN.md promises at most 64 bytes per idle connection record. */
typedef char slot_fits[sizeof(nw_mgr_slot) <= 64 ? 1 : -1];

void nw_mgr_table_init(nw_mgr_table *t, int ep, size_t max_conns,
                       volatile int64_t *offload_bytes)
{
    memset(t, 0, sizeof *t);
    for (int k = 0; k < NW_MGR_KINDS; k++)
        t->list[k].first = t->list[k].last = NW_MGR_NONE;
    t->ep = ep;
    t->max_conns = max_conns;
    t->offload_bytes = offload_bytes;
}

int nw_mgr_table_reserve(nw_mgr_table *t, int fd)
{
    if (fd < 0)
        return -1;
    if ((size_t)fd < t->nslots)
        return 0;
    size_t n = t->nslots ? t->nslots : 64;
    while (n <= (size_t)fd)
        n *= 2;
    nw_mgr_slot *p = realloc(t->slots, n * sizeof *p);
    if (!p)
        return -1;
    memset(p + t->nslots, 0, (n - t->nslots) * sizeof *p);
    t->slots = p;
    t->nslots = n;
    return 0;
}

nw_mgr_slot *nw_mgr_table_fresh(nw_mgr_table *t, int fd)
{
    nw_mgr_slot *s = &t->slots[fd];
    memset(s, 0, sizeof *s);
    return s;
}

static void clear(nw_mgr_slot *s)
{
    free(s->head);
    memset(s, 0, sizeof *s);
}

/* ------------------------------------------------------------ epoll */

int nw_mgr_table_watch(nw_mgr_table *t, int fd, uint32_t events)
{
    struct epoll_event ev = { .events = events, .data.fd = fd };
    return epoll_ctl(t->ep, EPOLL_CTL_ADD, fd, &ev);
}

void nw_mgr_table_unwatch(nw_mgr_table *t, int fd)
{
    epoll_ctl(t->ep, EPOLL_CTL_DEL, fd, NULL);
}

int nw_mgr_table_rewatch(nw_mgr_table *t, int fd, uint32_t events)
{
    struct epoll_event ev = { .events = events, .data.fd = fd };
    return epoll_ctl(t->ep, EPOLL_CTL_MOD, fd, &ev);
}

/* ------------------------------------------------------------ lists */

static int listed(int kind)
{
    return kind >= NW_MGR_IDLE && kind <= NW_MGR_CLOSING;
}

/* Insert in deadline order. A list's timeout is constant, so nearly every
 * insert is an append; only a HANDOFF carrying less time left walks back. */
static void list_insert(nw_mgr_table *t, nw_mgr_list *l, int fd)
{
    nw_mgr_slot *s = &t->slots[fd];
    int32_t after = l->last;
    while (after != NW_MGR_NONE && t->slots[after].deadline > s->deadline)
        after = t->slots[after].prev;
    s->prev = after;
    s->next = after == NW_MGR_NONE ? l->first : t->slots[after].next;
    if (s->next == NW_MGR_NONE)
        l->last = fd;
    else
        t->slots[s->next].prev = fd;
    if (after == NW_MGR_NONE)
        l->first = fd;
    else
        t->slots[after].next = fd;
    l->len++;
}

static void list_remove(nw_mgr_table *t, nw_mgr_list *l, int fd)
{
    nw_mgr_slot *s = &t->slots[fd];
    if (s->prev == NW_MGR_NONE)
        l->first = s->next;
    else
        t->slots[s->prev].next = s->next;
    if (s->next == NW_MGR_NONE)
        l->last = s->prev;
    else
        t->slots[s->next].prev = s->prev;
    s->prev = s->next = NW_MGR_NONE;
    l->len--;
}

void nw_mgr_table_enlist(nw_mgr_table *t, int fd, int kind, nw_msec deadline)
{
    t->slots[fd].kind = (uint8_t)kind;
    t->slots[fd].deadline = deadline;
    list_insert(t, &t->list[kind], fd);
}

void nw_mgr_table_delist(nw_mgr_table *t, int fd)
{
    nw_mgr_slot *s = &t->slots[fd];
    if (listed(s->kind))
        list_remove(t, &t->list[s->kind], fd);
    s->kind = NW_MGR_FREE;
}

void nw_mgr_table_defer(nw_mgr_table *t, int fd, nw_msec deadline)
{
    int kind = t->slots[fd].kind;
    list_remove(t, &t->list[kind], fd);
    nw_mgr_table_enlist(t, fd, kind, deadline);
}

int nw_mgr_table_first(const nw_mgr_table *t, int kind)
{
    return t->list[kind].first;
}

size_t nw_mgr_table_count(const nw_mgr_table *t, int kind)
{
    return t->list[kind].len;
}

int nw_mgr_table_due(const nw_mgr_table *t, int kind, nw_msec now)
{
    int fd = t->list[kind].first;
    return fd != NW_MGR_NONE && t->slots[fd].deadline <= now ? fd : NW_MGR_NONE;
}

nw_msec nw_mgr_table_earliest(const nw_mgr_table *t, int kind, nw_msec next)
{
    int fd = t->list[kind].first;
    return fd != NW_MGR_NONE && t->slots[fd].deadline < next ? t->slots[fd].deadline : next;
}

size_t nw_mgr_table_held(const nw_mgr_table *t)
{
    return t->list[NW_MGR_IDLE].len + t->list[NW_MGR_READING].len + t->list[NW_MGR_QUEUED].len
           + t->list[NW_MGR_WRITING].len + t->list[NW_MGR_CLOSING].len;
}

int nw_mgr_table_full(const nw_mgr_table *t, size_t extra)
{
    return t->max_conns && nw_mgr_table_held(t) + t->outside + extra >= t->max_conns;
}

void nw_mgr_table_hold_outside(nw_mgr_table *t, int delta)
{
    if (delta > 0)
        t->outside++;
    else if (t->outside > 0)
        t->outside--;
}

int nw_mgr_table_make_room(nw_mgr_table *t)
{
    while (nw_mgr_table_full(t, 0)) {
        int fd = t->list[NW_MGR_IDLE].first;
        if (fd == NW_MGR_NONE)
            return 0;
        nw_mgr_table_drop(t, fd);
        t->closed_full++;
    }
    return 1;
}

/* ------------------------------------------------------------ records */

void nw_mgr_table_detach(nw_mgr_table *t, int fd)
{
    nw_mgr_slot *s = &t->slots[fd];
    if (s->kind != NW_MGR_FREE && s->kind != NW_MGR_QUEUED)
        nw_mgr_table_unwatch(t, fd);
    nw_mgr_table_delist(t, fd);
}

void nw_mgr_table_rest_done(nw_mgr_table *t, nw_mgr_slot *s)
{
    if (s->out_fd <= 0)
        return;
    close(s->out_fd);
    if ((s->flags & NW_MGR_F_OUT_COUNTED) && t->offload_bytes && s->out_left)
        nw_scoreboard_offload_release(t->offload_bytes, s->out_left);
    s->out_fd = 0;
    s->out_left = 0;
    s->flags &= (uint8_t)~(NW_MGR_F_OUT_COUNTED | NW_MGR_F_OUT_KEEP);
}

void nw_mgr_table_release(nw_mgr_table *t, int fd)
{
    nw_mgr_table_rest_done(t, &t->slots[fd]);
    clear(&t->slots[fd]);
}

void nw_mgr_table_forget(nw_mgr_table *t, int fd)
{
    nw_mgr_table_release(t, fd);
    close(fd);
}

void nw_mgr_table_drop(nw_mgr_table *t, int fd)
{
    nw_mgr_table_detach(t, fd);
    nw_mgr_table_forget(t, fd);
}

int nw_mgr_table_keep(nw_mgr_slot *s, const char *data, size_t len)
{
    size_t need = s->head_len + len;
    if (need > NW_FRAME_MAX_DATA)
        return -1;
    if (need > s->head_cap) {
        size_t cap = s->head_cap ? s->head_cap : HEAD_MIN;
        while (cap < need)
            cap *= 2;
        if (cap > NW_FRAME_MAX_DATA)
            cap = NW_FRAME_MAX_DATA;
        char *p = realloc(s->head, cap);
        if (!p)
            return -1;
        s->head = p;
        s->head_cap = (uint32_t)cap;
    }
    memcpy(s->head + s->head_len, data, len);
    s->head_len = (uint32_t)need;
    return 0;
}

void nw_mgr_table_close(nw_mgr_table *t)
{
    for (size_t fd = 0; fd < t->nslots; fd++)
        if (t->slots[fd].kind != NW_MGR_FREE)
            nw_mgr_table_forget(t, (int)fd);
    free(t->slots);
    t->slots = NULL;
    t->nslots = 0;
}
