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

/* What the caller keeps per connection about its registration in the set:
 * whether its fd is in the epoll set, and the slot and generation that the
 * registration's event data names. Zero it for a connection new to the
 * worker; nw_park_add fills it in. */
typedef struct {
    int registered;
    int slot;
    uint32_t gen;
} nw_park_watch;

/* Pointers a slot keeps besides its item (nw_park_peek_ready). */
#define NW_PARK_WARM 3

typedef struct {
    int epfd;                           /* the worker's epoll set (not owned) */
    uint32_t event_base;                /* epoll data for slot i: event_base + i, gen[i] above */
    int count;                          /* slots in use */
    volatile uint32_t *published;       /* count is copied here (a scoreboard slot's), or NULL */
    int ready_count;                    /* of those, readable */
    int cursor;                         /* where the next search for a ready one starts */
    int used_slots;                     /* 1 + the highest slot ever used */
    int head, tail;                     /* in use, oldest first; -1 when empty */
    int nfree;
    void *item[NW_MAX_PARKED];          /* NULL: slot free */
    int fd[NW_MAX_PARKED];
    nw_msec until[NW_MAX_PARKED];
    int next[NW_MAX_PARKED], prev[NW_MAX_PARKED];
    int free_slot[NW_MAX_PARKED];       /* a stack of the free slots */
    int free_pos[NW_MAX_PARKED];        /* where a free slot is in that stack */
    uint32_t gen[NW_MAX_PARKED];        /* bumped when a slot gets a new registration */
    unsigned char ready[NW_MAX_PARKED]; /* 1: readable (its next request is arriving) */
    const void *warm[NW_MAX_PARKED][NW_PARK_WARM]; /* the caller's: more of an item's
                                         * memory, which nw_park_peek_ready names */
    unsigned char pending[NW_MAX_PARKED]; /* free slot: its last connection got an event */
    unsigned char hangup[NW_MAX_PARKED];  /* the peer's FIN (or an error) was among the
                                           * events since the connection was taken */
} nw_park;

void nw_park_init(nw_park *p, int epfd, uint32_t event_base);

/* Park fd (with the caller's item) until the deadline. The fd is watched
 * edge-triggered and stays registered when it is taken back to be served.
 * A connection that comes back to the slot it left (the common case: a
 * worker parks only the connection it has just served, and the free slots
 * are a stack) costs no system call at all, provided the caller's last
 * read left the socket empty (drained): then every byte since has raised
 * an event, and one that arrived while the connection was away is
 * remembered for it (pending). Otherwise, or in another slot, it costs one
 * epoll_ctl (ADD, or MOD, which also reports data already there). *w is
 * the caller's record of the registration and is updated. Returns 0, or
 * -1 when the set is full or epoll refuses the fd. */
int nw_park_add(nw_park *p, int fd, void *item, nw_msec until, int drained, nw_park_watch *w);

/* Note an epoll event (its 64-bit data and its event bits). Returns 1
 * when it was for a parked connection's slot, current or stale. */
int nw_park_event(nw_park *p, uint64_t data, uint32_t events);

/* Take a readable connection out of the set (round robin over the slots).
 * It stays registered: its slot is free but keeps its generation, so the
 * connection can come back to it. *hangup is set to whether the peer's FIN
 * (or an error) was reported: a FIN that came with the last bytes raised
 * no edge of its own, so the caller must not count that connection as
 * drained after reading them. Returns its item, or NULL. */
void *nw_park_take_ready(nw_park *p, int *hangup);

/* The item nw_park_take_ready would take next, without taking it (NULL
 * when none is ready), and its NW_PARK_WARM warm pointers (*warm NULL
 * when none is ready; the slot's own, cleared when it is taken): for
 * asking for their memory early. */
void *nw_park_peek_ready(const nw_park *p, const void *const **warm);

/* Take the oldest connection whose deadline has passed and that is not
 * readable, or any connection at all with everything. Its fd leaves the
 * epoll set (the caller sets its watch's registered to 0). NULL when none. */
void *nw_park_take_expired(nw_park *p, nw_msec now, int everything);

/* The nearest deadline of a connection that is not readable, or 0. */
nw_msec nw_park_nearest(const nw_park *p);

/* Copy the number of parked connections to *to from now on (a scoreboard
 * slot's, for narwhal_connections{state="parked"}); NULL: nowhere. */
void nw_park_publish(nw_park *p, volatile uint32_t *to);

#endif
