/* See nw_custody.h. */
#include "nw_custody.h"

#include <stdlib.h>

#define NW_CUSTODY_FIRST_CAP 64

static size_t home(const nw_custody_index *x, uint64_t cookie)
{
    /* cookies count up: a multiplicative hash spreads neighbours apart */
    return (size_t)((cookie * 0x9e3779b97f4a7c15ull) >> 17) & (x->cap - 1);
}

int nw_custody_find(const nw_custody_index *x, uint64_t cookie)
{
    if (!x->cap || !cookie)
        return -1;
    for (size_t i = home(x, cookie);; i = (i + 1) & (x->cap - 1)) {
        if (x->cookie[i] == cookie)
            return x->fd[i];
        if (x->cookie[i] == 0)
            return -1;
    }
}

static void put(nw_custody_index *x, uint64_t cookie, int fd)
{
    size_t i = home(x, cookie);
    while (x->cookie[i])
        i = (i + 1) & (x->cap - 1);
    x->cookie[i] = cookie;
    x->fd[i] = fd;
    x->count++;
}

/* Twice the room, everything placed again. */
static int grow(nw_custody_index *x)
{
    nw_custody_index bigger = { 0 };
    bigger.cap = x->cap ? x->cap * 2 : NW_CUSTODY_FIRST_CAP;
    bigger.cookie = calloc(bigger.cap, sizeof *bigger.cookie);
    bigger.fd = calloc(bigger.cap, sizeof *bigger.fd);
    if (!bigger.cookie || !bigger.fd) {
        free(bigger.cookie);
        free(bigger.fd);
        return -1;
    }
    for (size_t i = 0; i < x->cap; i++)
        if (x->cookie[i])
            put(&bigger, x->cookie[i], x->fd[i]);
    nw_custody_free(x);
    *x = bigger;
    return 0;
}

int nw_custody_add(nw_custody_index *x, uint64_t cookie, int fd)
{
    if (!cookie)
        return -1;
    if ((x->count + 1) * 2 > x->cap && grow(x) < 0)   /* at most half full */
        return -1;
    put(x, cookie, fd);
    return 0;
}

int nw_custody_remove(nw_custody_index *x, uint64_t cookie)
{
    if (!x->cap || !cookie)
        return -1;
    size_t mask = x->cap - 1, i = home(x, cookie);
    while (x->cookie[i] != cookie) {
        if (x->cookie[i] == 0)
            return -1;
        i = (i + 1) & mask;
    }
    int fd = x->fd[i];
    x->cookie[i] = 0;
    x->count--;
    /* Move back every entry after the hole that may no longer be found
     * past it: one whose home is not cyclically in (hole, j]. */
    for (size_t hole = i, j = (i + 1) & mask; x->cookie[j]; j = (j + 1) & mask) {
        size_t h = home(x, x->cookie[j]);
        int stays = hole < j ? (h > hole && h <= j) : (h > hole || h <= j);
        if (stays)
            continue;
        x->cookie[hole] = x->cookie[j];
        x->fd[hole] = x->fd[j];
        x->cookie[j] = 0;
        hole = j;
    }
    return fd;
}

void nw_custody_free(nw_custody_index *x)
{
    free(x->cookie);
    free(x->fd);
    x->cookie = NULL;
    x->fd = NULL;
    x->cap = x->count = 0;
}
