/* A worker's parked connections: ones it just served whose next request has
 * not arrived yet. They wait in the worker's own epoll set for a short
 * while, so the worker serves whatever is ready meanwhile instead of paying
 * a hand-off to the manager per request; the ones still quiet when their
 * time is up go to the manager. See "Parking" in docs/DESIGN.md.
 *
 * The set knows fds and deadlines; what a connection is stays with the
 * caller (an opaque item pointer). Deadlines are handed out in the order
 * connections are parked, so the oldest is always at the head of a list. */
#ifndef NW_PARK_H
#define NW_PARK_H

#include <stdint.h>
#include "nw_io.h"
#include "nw_limits.h"

typedef struct {
    int epfd;                           /* the worker's epoll set (not owned) */
    uint32_t event_base;                /* epoll data for slot i: event_base + i */
    int count;                          /* slots in use */
    int ready_count;                    /* of those, readable */
    int cursor;                         /* where the next search for a ready one starts */
    int head, tail;                     /* in use, oldest first; -1 when empty */
    int nfree;
    void *item[NW_MAX_PARKED];          /* NULL: slot free */
    int fd[NW_MAX_PARKED];
    nw_msec until[NW_MAX_PARKED];
    int next[NW_MAX_PARKED], prev[NW_MAX_PARKED];
    int free_slot[NW_MAX_PARKED];
    unsigned char ready[NW_MAX_PARKED]; /* 1: readable (its next request is arriving) */
} nw_park;

void nw_park_init(nw_park *p, int epfd, uint32_t event_base);

/* Park fd (with the caller's item) until the deadline. The fd is watched
 * one-shot: *registered says whether it is in the epoll set already (from
 * an earlier park; re-arming it is then one epoll_ctl) and is set to 1.
 * Returns 0, or -1 when the set is full or epoll refuses the fd. */
int nw_park_add(nw_park *p, int fd, void *item, nw_msec until, int *registered);

/* Note an epoll event. Returns 1 when it was a parked connection's. */
int nw_park_event(nw_park *p, uint32_t data);

/* Take a readable connection out of the set (round robin over the slots).
 * Its one-shot watch has fired, so it stays registered but silent.
 * Returns its item, or NULL when none is readable. */
void *nw_park_take_ready(nw_park *p);

/* Take the oldest connection whose deadline has passed and that is not
 * readable, or any connection at all with everything. Its fd leaves the
 * epoll set (the caller forgets that it was registered). NULL when none. */
void *nw_park_take_expired(nw_park *p, nw_msec now, int everything);

/* The nearest deadline of a connection that is not readable, or 0. */
nw_msec nw_park_nearest(const nw_park *p);

/* The fd parked in slot i (for shutdown), or -1. */
int nw_park_fd(const nw_park *p, int i);

#endif
