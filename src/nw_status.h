/* The status pages: what the manager answers on --status-listen, rendered
 * from the scoreboard (the workers' slots, the master's header) and the
 * manager's own counts. Pure functions of their inputs, except that a
 * worker's resident size is read from /proc at render time. See "The
 * operator layer" in docs/DESIGN.md. */
#ifndef NW_STATUS_H
#define NW_STATUS_H

#include <stddef.h>
#include <stdint.h>
#include "nw_buf.h"
#include "nw_scoreboard.h"

#define NW_STATUS_MAX_LISTENERS 16

enum nw_status_page {
    NW_STATUS_NOT_FOUND = 0,
    NW_STATUS_METRICS,      /* GET /metrics: Prometheus text format 0.0.4 */
    NW_STATUS_HTML,         /* GET /status */
    NW_STATUS_JSON,         /* GET /status.json */
    NW_STATUS_HEALTH,       /* GET /health: 200, or 503 once a stop has begun */
    NW_STATUS_BAD_METHOD,   /* not GET or HEAD */
};

typedef struct {
    char     address[64];   /* "host:port" or a unix path */
    int      known;         /* queue and backlog could be read (TCP) */
    uint32_t queue;         /* connections waiting to be accepted */
    uint32_t backlog;       /* the queue's limit */
} nw_status_listener;

/* What only the manager knows. */
typedef struct {
    uint64_t held_idle;     /* connections held idle */
    uint64_t held_reading;  /* ... with part of a head */
    uint64_t held_queued;   /* ... with a complete head, waiting for a worker */
    uint64_t held_writing;  /* ... whose response it is finishing (a slow reader) */
    uint64_t offloaded;     /* responses workers left to the manager to finish, total */
    int64_t  offload_bytes; /* bytes of those responses held in memory now */
    uint64_t handoffs_in;   /* connections workers gave the manager, total */
    uint64_t handoffs_out;  /* connections the manager gave workers, total */
    uint64_t shed;          /* answered 503 by --max-queue-wait, total */
    int      stopping;      /* the manager itself is stopping */
    int      nlisteners;
    nw_status_listener listener[NW_STATUS_MAX_LISTENERS];
} nw_status_manager;

/* The page a request head asks for ("GET /metrics HTTP/1.1 ..."). *head_only
 * is set for HEAD. */
int nw_status_route(const char *head, size_t len, int *head_only);

/* Append the whole response (status line, headers, body unless head_only)
 * for a page to out. now_us is CLOCK_MONOTONIC, now_unix the wall clock.
 * Returns 0, or -1 when out of memory. */
int nw_status_respond(nw_buf *out, int page, int head_only, const nw_scoreboard *b,
                      const nw_status_manager *m, uint64_t now_us, int64_t now_unix);

#endif
