/* The scoreboard: one slot per worker in memory shared by the master and
 * every process it forks, mapped by the master before the first fork.
 * A worker writes its own slot (a few stores per request, no system
 * call); the master reads it, also after the worker has died, to know
 * whether it had served anything and what it was serving. See "The
 * scoreboard" in docs/DESIGN.md. */
#ifndef NW_SCOREBOARD_H
#define NW_SCOREBOARD_H

#include <stddef.h>
#include <stdint.h>
#include "nw_io.h"

#define NW_SCOREBOARD_SLOTS   1024  /* workers alive at once, all generations */
#define NW_SCOREBOARD_REQUEST 160   /* bytes of "METHOD target" kept */

enum nw_worker_state {
    NW_WORKER_FREE = 0,     /* no worker in this slot */
    NW_WORKER_STARTING,     /* forked, loading or setting up */
    NW_WORKER_IDLE,         /* between requests */
    NW_WORKER_BUSY,         /* running a request */
};

typedef struct {
    volatile int32_t pid;
    volatile int32_t state;             /* enum nw_worker_state */
    volatile uint64_t started;          /* requests begun, ever */
    volatile uint64_t served;           /* requests finished */
    volatile nw_msec since;             /* the current request began (monotonic ms) */
    volatile uint32_t request_len;
    char request[NW_SCOREBOARD_REQUEST]; /* "METHOD target" of the current or last request */
} nw_score_slot;

typedef struct {
    uint32_t nslots;
    nw_score_slot slot[];
} nw_scoreboard;

/* Map a zeroed board of nslots shared with every child forked after it.
 * NULL with errno on failure. */
nw_scoreboard *nw_scoreboard_create(uint32_t nslots);
void nw_scoreboard_destroy(nw_scoreboard *b);

/* The slot of worker pid, about to start. */
void nw_scoreboard_claim(nw_score_slot *s, int pid);

/* A request begins and ends (the worker, on its own slot). */
void nw_scoreboard_request_begin(nw_score_slot *s, const char *method, size_t method_len,
                                 const char *target, size_t target_len, nw_msec now);
void nw_scoreboard_request_end(nw_score_slot *s);

#endif
