/* The status pages: what the manager answers on --status-listen, rendered
 * from the scoreboard (the workers' slots, the master's header) and the
 * manager's own counts. Pure functions of their inputs, except that a
 * worker's resident size and CPU time are read from /proc/PID/stat and
 * the host's name from gethostname at render time, and that /status and
 * /status.json keep a sample of the counts for the next render's rates
 * (nw_status_rates). See "The operator layer" in docs/DESIGN.md. */
#ifndef NW_STATUS_H
#define NW_STATUS_H

#include <stddef.h>
#include <stdint.h>
#include "nw_buf.h"
#include "nw_limits.h"
#include "nw_scoreboard.h"
#include "nw_status_rates.h"

#define NW_STATUS_MAX_LISTENERS NW_MAX_LISTENERS

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
    uint32_t queues;        /* sockets on the address (--listen-queues): both are their sums */
} nw_status_listener;

/* Why the manager closed a connection it could not pass on or keep
 * (narwhal_refused_total{reason}; the workers' own refusals are counted
 * in their slots, handoff_refused). */
enum nw_refused_reason {
    NW_REFUSED_SERVE_QUEUE = 0, /* the kernel would not take it on the serve queue (an error
                                 * other than one to wait out: full, too many in flight) */
    NW_REFUSED_FULL,            /* --max-connections held, and none of them idle to close */
    NW_REFUSED_MEMORY,          /* no memory for its record or its bytes */
    NW_REFUSED_REASONS
};

/* Room for the TLS part's reasons for refusing a connection (more than
 * it has: nw_mgr_tls checks at compile time). */
#define NW_STATUS_TLS_REASONS 16

/* What only the manager knows. */
typedef struct {
    uint64_t held_idle;     /* connections held idle */
    uint64_t held_reading;  /* ... with part of a head */
    uint64_t held_queued;   /* ... with a complete head, waiting for a worker */
    uint64_t held_writing;  /* ... whose response it is finishing (a slow reader) */
    uint64_t held_closing;  /* ... written and half-closed, drained until the client closes */
    nw_score_conns board;   /* what the board says: in workers, parked, on the queues */
    uint64_t refused[NW_REFUSED_REASONS]; /* connections it closed unserved, total */
    int      parked_known;  /* parked_readable is known (custody is on) */
    uint64_t parked_readable; /* parked connections (of which the manager holds copies) whose
                             * client has sent bytes: a request, or its start, waiting for
                             * its worker to be free */
    uint64_t offloaded;     /* responses workers left to the manager to finish, total */
    int64_t  offload_bytes; /* bytes of those responses held in memory now */
    uint64_t handoffs_in;   /* connections workers gave the manager, total */
    uint64_t handoffs_out;  /* connections the manager gave workers, total */
    uint64_t shed;          /* answered 503 by --max-queue-wait, total */
    uint64_t accepted;      /* connections it took from the listeners, total */
    int      accepting;     /* it is taking them now: the pool is stuck */
    uint64_t custody;       /* copies of workers' parked connections it holds now */
    uint64_t custody_taken; /* of those, taken over from a worker that died, total */
    uint64_t custody_lost;  /* closed because the worker died serving them, total */
    int      stopping;      /* the manager itself is stopping */
    int      tls_reasons;   /* the TLS part's reasons (0: no TLS listener) */
    const char *tls_reason[NW_STATUS_TLS_REASONS];  /* ...their names (nw_tls_reason_name) */
    uint64_t tls_refused[NW_STATUS_TLS_REASONS];    /* connections refused by each, total
                             * (narwhal_tls_refused_total{reason}) */
    uint64_t tls_handshakes[2]; /* handshakes done, total: full, resumed */
    uint64_t tls_open[3];   /* TLS connections held now: in their handshake, relaying,
                             * closing */
    uint64_t proxy_rejected[NW_PROXY_REJECTS]; /* TLS connections refused under
                             * --proxy-protocol before their handshake, total (added to the
                             * workers' in narwhal_proxy_rejected_total) */
    int      nlisteners;
    nw_status_listener listener[NW_STATUS_MAX_LISTENERS];
} nw_status_manager;


/* The page a request head asks for ("GET /metrics HTTP/1.1 ..."). *head_only
 * is set for HEAD. */
int nw_status_route(const char *head, size_t len, int *head_only);

/* Append the whole response (status line, headers, body unless head_only)
 * for a page to out. now_us is CLOCK_MONOTONIC, now_unix the wall clock.
 * rates: the samples the manager keeps between renders (NULL: none, every
 * rate is a mean since the start). Returns 0, or -1 when out of memory. */
int nw_status_respond(nw_buf *out, int page, int head_only, const nw_scoreboard *b,
                      const nw_status_manager *m, nw_status_rates *rates, uint64_t now_us,
                      int64_t now_unix);

#endif
