/* The times a worker waiting in epoll must wake at: each part of the
 * worker that has something to do at a time (its parked connections'
 * expiry, custody's copies, adoption's step back) registers its next one
 * here under its own kind, and the wait (next_conn in nw_worker.c) reads
 * the nearest. A fixed array with a place per kind, scanned for the
 * nearest: there are a handful of kinds. Perl-free; main thread only. */
#ifndef NW_DEADLINES_H
#define NW_DEADLINES_H

#include "nw_io.h"

typedef enum {
    NW_DEADLINE_PARKED,         /* the first parked connection whose time is up */
    NW_DEADLINE_CUSTODY,        /* parked connections' copies due to the manager */
    NW_DEADLINE_ADOPT_ASIDE,    /* back in the adopt queue's wake-ups */
    NW_DEADLINE_FD_ROOM,        /* the serve queue watched again (no room for a descriptor) */
    NW_DEADLINE_KINDS
} nw_deadline_kind;

typedef struct {
    nw_msec at[NW_DEADLINE_KINDS];  /* 0: none of that kind */
} nw_deadlines;

/* None registered. */
void nw_deadlines_init(nw_deadlines *d);

/* Kind's next deadline is at (0: it has none any more). */
static inline void nw_deadlines_set(nw_deadlines *d, nw_deadline_kind kind, nw_msec at)
{
    d->at[kind] = at;
}

/* Kind's deadline has come by now (one is registered, and now >= it). */
static inline int nw_deadlines_passed(const nw_deadlines *d, nw_deadline_kind kind, nw_msec now)
{
    return d->at[kind] && now >= d->at[kind];
}

/* The nearest registered deadline, 0 when there is none. (Inline, as
 * the wait reads it on every request: the loop unrolls.) */
static inline nw_msec nw_deadlines_nearest(const nw_deadlines *d)
{
    nw_msec nearest = 0;
    for (int k = 0; k < NW_DEADLINE_KINDS; k++)
        if (d->at[k] && (!nearest || d->at[k] < nearest))
            nearest = d->at[k];
    return nearest;
}

/* How long a wait that begins at now may last: until the nearest deadline
 * or until, whichever comes first (0 when either has passed). */
static inline int nw_deadlines_wait_ms(const nw_deadlines *d, nw_msec now, nw_msec until)
{
    nw_msec nearest = nw_deadlines_nearest(d);
    nw_msec wake = nearest && nearest < until ? nearest : until;
    return wake > now ? (int)(wake - now) : 0;
}

#endif
