/* The connection manager's index of the connections it holds in custody
 * (DESIGN.md, "Custody of parked connections"): a socket's cookie
 * (SO_COOKIE, unique for the life of the kernel) to the manager's
 * descriptor for its copy. Open addressing with linear probing, deleted
 * entries shifted back so that a search never walks past a hole. */
#ifndef NW_CUSTODY_H
#define NW_CUSTODY_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint64_t *cookie;       /* 0: an empty place */
    int      *fd;
    size_t    cap;          /* a power of two, or 0 before the first add */
    size_t    count;
} nw_custody_index;

/* The descriptor held for cookie, or -1. */
int nw_custody_find(const nw_custody_index *x, uint64_t cookie);

/* Record cookie -> fd (cookie nonzero, not there yet). 0, or -1 (no memory). */
int nw_custody_add(nw_custody_index *x, uint64_t cookie, int fd);

/* Forget cookie. Returns its descriptor, or -1 when it was not there. */
int nw_custody_remove(nw_custody_index *x, uint64_t cookie);

void nw_custody_free(nw_custody_index *x);

#endif
