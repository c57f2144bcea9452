/* The scoreboard: shared memory the master maps before the first fork
 * (a memfd, so the exec'd manager can map it too). A header the master
 * writes, and one slot per worker written only by that worker: a few
 * stores per request, no system call. The master reads it to supervise
 * (also after a worker died); the manager reads it to answer the status
 * listener. See "The scoreboard and supervision" and "The operator layer"
 * in docs/DESIGN.md. */
#ifndef NW_SCOREBOARD_H
#define NW_SCOREBOARD_H

#include <stddef.h>
#include <stdint.h>
#include <netinet/in.h>
#include "nw_io.h"

#define NW_SCOREBOARD_MAGIC   0x3142534eu  /* "NSB1" */
#define NW_SCOREBOARD_SLOTS   1024  /* workers alive at once, all generations */
#define NW_SCOREBOARD_REQUEST 160   /* bytes of "METHOD target" kept */
#define NW_SCORE_CLASSES      5     /* status classes 1xx .. 5xx */
#define NW_SCORE_BUCKETS      18    /* duration histogram: 17 bounds and +Inf */
#define NW_SCOREBOARD_READ_TRIES 100000 /* a reader's retries while the master folds */
#define NW_CRASH_ROUTES       16    /* routes answered 503 at once for killing workers */

/* The duration and queue-wait histograms' upper bounds, in microseconds
 * (the last bucket is +Inf): from 100 us, so that a fast app's percentiles
 * are resolved. */
static const uint64_t nw_score_bounds_us[NW_SCORE_BUCKETS - 1] = {
    100, 250, 500, 1000, 2500, 5000, 10000, 25000, 50000, 100000,
    250000, 500000, 1000000, 2500000, 5000000, 10000000, 30000000 };

enum nw_worker_state {
    NW_WORKER_FREE = 0,     /* no worker in this slot */
    NW_WORKER_STARTING,     /* forked, loading or setting up */
    NW_WORKER_IDLE,         /* between requests */
    NW_WORKER_BUSY,         /* running a request */
    NW_WORKER_STOPPING,     /* leaving: finishing what it has */
};

/* Why a worker leaves, as it says in its slot before it goes. */
enum nw_exit_reason {
    NW_EXIT_NONE = 0,       /* not said (a crash, a kill, a stop) */
    NW_EXIT_MAX_REQUESTS,   /* --max-reqs-per-child */
    NW_EXIT_MEMORY,         /* --max-worker-rss */
    NW_EXIT_WATCHDOG,       /* --request-timeout */
    NW_EXIT_RETIRED,        /* the master asked (HUP, TTOU) */
    NW_EXIT_STOPPED,        /* it left by its own way out for any other reason (a stop):
                             * a worker that exits 0 with NONE left from elsewhere (an
                             * app's exit), and the master says so */
};

/* Why the master started a worker in place of another (the restarts
 * counter's labels). */
enum nw_restart_reason {
    NW_RESTART_MAX_REQUESTS = 0,
    NW_RESTART_CRASH,
    NW_RESTART_WATCHDOG,
    NW_RESTART_MEMORY,
    NW_RESTART_SIGNAL,
    NW_RESTART_LIFETIME,    /* --max-worker-lifetime */
    NW_RESTART_EXIT,        /* it exited on its own, status 0 (an app's exit) */
    NW_RESTART_REASONS
};

/* Why the elastic pool changed (narwhal_pool_changes_total{reason}). */
enum nw_pool_change {
    NW_POOL_GROW_WAITED = 0,    /* requests waited longer than NW_POOL_GROW_WAIT_MS */
    NW_POOL_GROW_STUCK,         /* every worker was stuck on a request */
    NW_POOL_SHRINK_IDLE,        /* a worker was idle for --worker-idle-timeout */
    NW_POOL_CHANGES
};

/* Why a worker refused a connection under --proxy-protocol
 * (narwhal_proxy_rejected_total{reason}). */
enum nw_proxy_reject {
    NW_PROXY_REJECT_BAD_HEADER = 0,  /* what came first was not a valid PROXY header */
    NW_PROXY_REJECT_NOT_ALLOWED,     /* the peer is outside --proxy-from */
    NW_PROXY_REJECTS
};
#define NW_SCOREBOARD_PEER 64       /* bytes of a peer's "address:port" kept */

/* Counts a worker keeps of the requests it finished. */
typedef struct {
    uint64_t served;                        /* requests finished */
    uint64_t by_class[NW_SCORE_CLASSES];    /* responses by status class */
    uint64_t bucket[NW_SCORE_BUCKETS];      /* durations, per bucket (not cumulative) */
    uint64_t duration_us;                   /* sum of durations */
    uint64_t adopted;                       /* connections taken from a leaving worker (ADOPT) */
    uint64_t proxy_rejected[NW_PROXY_REJECTS]; /* connections refused under --proxy-protocol */
    uint64_t queue_bucket[NW_SCORE_BUCKETS]; /* waits before a worker began a request */
    uint64_t queue_us;                      /* sum of those waits */
    uint64_t spool_failed;                  /* request bodies that could not be spooled (503) */
    uint64_t fd_limit;                      /* accepts refused by the open-file limit */
    uint64_t crash_refused;                 /* requests to a route that kills workers, 503 */
    uint64_t bytes_sent;                    /* response body bytes written (framing included) */
    uint64_t handoff_refused;               /* connections closed because the manager could not
                                             * be given them (narwhal_refused_total{reason=
                                             * "handoff"}): answered 503 when a request waited */
} nw_score_counts;

/* A route ("METHOD path", the query left out) that killed a worker: the
 * master watches it (workers count the requests to it that begin, so the
 * master can tell a route that kills most of its requests from a busy one
 * that killed a few) and, when it kills again and again, has it answered
 * 503 until `until` (--crash-backoff). */
typedef struct {
    volatile uint64_t hash;         /* nw_route_hash; 0: a free entry */
    volatile nw_msec until;         /* answered 503 until then (monotonic ms); 0: watched only */
    volatile uint64_t started;      /* requests to it that began (workers add, atomically) */
} nw_crash_route;

typedef struct {
    volatile int32_t pid;
    volatile int32_t state;             /* enum nw_worker_state */
    volatile int32_t exit_reason;       /* enum nw_exit_reason */
    volatile int32_t generation;        /* the master's generation when forked */
    volatile uint64_t started;          /* requests begun, ever */
    volatile nw_msec born;              /* forked (monotonic ms) */
    volatile uint64_t since_us;         /* the current request began (monotonic us) */
    nw_score_counts counts;
    volatile uint32_t request_len;
    char request[NW_SCOREBOARD_REQUEST]; /* "METHOD target" of the current or last request */
    volatile uint32_t client_len;       /* bytes of client (0: unknown) */
    struct sockaddr_in6 client;         /* its client's address, as the socket (or a PROXY
                                         * header) gave it: copied, not formatted (the
                                         * manager formats it when it renders) */
    volatile uint64_t last_us;          /* the last finished request took (us) */
    volatile uint64_t last_end_us;      /* ... and ended (monotonic us; 0: none yet) */
    /* the last connection this worker refused under --proxy-protocol (the
     * master logs it: nw_scoreboard_proxy_rejected) */
    volatile uint32_t parked;           /* connections parked in this worker now (nw_park) */
    volatile nw_msec proxy_last_ms;     /* when (monotonic ms; 0: never) */
    volatile int32_t proxy_last_reason; /* enum nw_proxy_reject */
    char proxy_last_peer[NW_SCOREBOARD_PEER]; /* its peer, "address:port", NUL-terminated */
    /* custody (DESIGN.md): what the manager needs to know when this worker ends */
    volatile uint64_t serving_cookie;   /* the connection it works on now, when the manager
                                         * holds a copy (its SO_COOKIE; 0: none) */
    volatile uint32_t parked_released;  /* 1: it gave its parked connections away or
                                         * closed them (a copy the manager holds is no
                                         * longer one to take over) */
    volatile int32_t standby;           /* 1: the listeners are not in its epoll: it serves
                                         * what the serve queue brings (DESIGN.md,
                                         * "Accepting workers"); set by the master, and
                                         * by the worker as its requests block or not */
    volatile int32_t blocking;          /* 1: its requests block (DESIGN.md, "Requests that
                                         * block"); set by the worker */
    volatile uint32_t conns;            /* client connections this worker holds open, parked
                                         * ones included (narwhal_connections: in a worker
                                         * and not parked is conns - parked) */
} nw_score_slot;

/* A slot's custody fields, kept when the master folds the slot (the manager
 * may look after that): the last NW_SCOREBOARD_ENDS workers reaped. */
#define NW_SCOREBOARD_ENDS 64
typedef struct {
    volatile int32_t pid;
    volatile uint32_t parked_released;
    volatile uint64_t serving_cookie;
} nw_score_end;

typedef struct {
    uint32_t magic;
    uint32_t nslots;
    int32_t  master_pid;
    volatile int32_t stopping;          /* a graceful stop (or a drain) has begun */
    volatile int32_t ready;             /* every worker of the first generation served: */
                                        /* (with any worker serving: /health says 200) */
    int64_t  started_unix;              /* the master started (seconds since the epoch) */
    volatile uint32_t seq;              /* odd while the master folds a slot into gone */
    volatile int32_t workers_wanted;    /* workers the master keeps running now */
    volatile int32_t workers_min;       /* the elastic pool's bounds (--min-workers, */
    volatile int32_t workers_max;       /* --max-workers); equal: a fixed pool */
    volatile uint64_t pool_changes[NW_POOL_CHANGES]; /* enum nw_pool_change */
    volatile uint64_t restarts[NW_RESTART_REASONS];
    volatile uint64_t manager_restarts; /* connection managers started after the first */
    volatile int32_t crash_routes;      /* entries of crash_route in use (0: none to look at) */
    nw_crash_route crash_route[NW_CRASH_ROUTES];
    nw_score_counts gone;               /* the counts of workers reaped */
    volatile int64_t offload_bytes;     /* bytes of responses in memfds the manager is writing:
                                         * workers raise it, the manager lowers it */
    /* connections on their way between processes (narwhal_connections),
     * next to offload_bytes: the manager maps these words writable */
    volatile int64_t serve_queued;      /* SERVE frames on the serve queue: the manager adds
                                         * each it sends, the workers (and the manager's
                                         * shedding) take off each they take */
    volatile int64_t handoff_queued;    /* connections on their way from a worker: HANDOFF
                                         * frames on the handoff queue (a worker adds each
                                         * before it sends it, the manager takes off each it
                                         * reads) and sockets in ADOPT frames on the adopt
                                         * queue (the sender adds, the adopter takes off) */
    char     version[24];               /* Narwhal's version, NUL-terminated (the master's
                                         * $Narwhal::VERSION: narwhal_build_info) */
    char     perl_version[24];          /* the perl it runs on */
    volatile uint64_t recycling;        /* the recycling turn: the worker recycled now (it
                                         * asked for its replacement and is not reaped
                                         * yet), NW_TURN_PID, and when it took the turn,
                                         * NW_TURN_MS (one word: one compare-and-swap);
                                         * workers take it, the fold frees it; 0: none */
    volatile uint32_t ends_next;        /* where the next nw_score_end goes (mod the ring) */
    nw_score_end ends[NW_SCOREBOARD_ENDS];
} nw_score_header;

typedef struct {
    nw_score_header h;
    nw_score_slot slot[];
} nw_scoreboard;

/* Bytes of a board of nslots. */
size_t nw_scoreboard_bytes(uint32_t nslots);

/* A zeroed board of nslots in a memfd mapped shared, inherited by every
 * child forked after it; *fd_out gets the memfd (close-on-exec) for a
 * program that maps it itself (nw_scoreboard_map). NULL with errno. */
nw_scoreboard *nw_scoreboard_create(uint32_t nslots, int *fd_out);
/* Map the board in fd read-only. NULL with errno (EINVAL: not a board). */
const nw_scoreboard *nw_scoreboard_map(int fd);
/* Unmap a board, created or mapped (NULL: nothing). */
void nw_scoreboard_unmap(const nw_scoreboard *b);

/* The master: the slot of worker pid, about to start; standby: it will
 * not accept (--accepting-workers). */
void nw_scoreboard_claim(nw_score_slot *s, int pid, int generation, int standby, nw_msec now);
/* The master: a reaped worker's counts go into the header's, and its slot
 * is freed, under the sequence counter. */
void nw_scoreboard_fold(nw_scoreboard *b, nw_score_slot *s);

/* What a worker that has ended left for the manager (custody): the
 * connection it was working on (0: none) and whether it had released its
 * parked ones. Looked for in the slots and in the ring of folded ones.
 * Returns 1 when found, 0 when the worker is not known (any more). */
int nw_scoreboard_worker_end(const nw_scoreboard *b, int pid, uint64_t *serving_cookie,
                             int *parked_released);

/* A request begins and ends (the worker, on its own slot). client is its
 * client's address (client_len bytes; NULL or 0: unknown), bytes what
 * the response's body took on the wire. */
struct sockaddr;
void nw_scoreboard_request_begin(nw_score_slot *s, const char *method, size_t method_len,
                                 const char *target, size_t target_len, uint64_t now_us,
                                 const struct sockaddr *client, unsigned client_len);
void nw_scoreboard_request_end(nw_score_slot *s, int status, uint64_t bytes, uint64_t now_us);

/* A request that came through the manager's serve queue began: it had
 * waited wait_us since its head was complete there. */
void nw_scoreboard_queue_wait(nw_score_slot *s, uint64_t wait_us);

/* A request answered with an error before it reached the app (400, 408,
 * 413...): counted by its status, with no duration. */
void nw_scoreboard_count_error(nw_score_slot *s, int status);

/* A worker refused a connection under --proxy-protocol (reason: enum
 * nw_proxy_reject; peer: the socket's peer, may be NULL): counted, and
 * noted as the slot's last refusal for the master's log line. */
void nw_scoreboard_proxy_rejected(nw_score_slot *s, int reason, const struct sockaddr *peer,
                                  unsigned peer_len, nw_msec now);

/* The connections the status pages count in states (narwhal_connections)
 * that the board knows: in the workers and not parked, parked, on the
 * serve queue and on the handoff queue. Read again until two readings
 * agree (a few tries), so that one connection moving between them while
 * they are read is not seen in two places or none. */
typedef struct {
    uint64_t in_workers, parked, serve_queued, handoff_queued;
} nw_score_conns;
void nw_scoreboard_connections(const nw_scoreboard *b, nw_score_conns *out);

/* A counter of connections on their way (serve_queued, handoff_queued)
 * moved by n, atomically (counter may be NULL: nothing). */
static inline void nw_scoreboard_queued_add(volatile int64_t *counter, int64_t n)
{
    if (counter)
        __atomic_add_fetch(counter, n, __ATOMIC_RELAXED);
}

/* --max-offload-total: take n bytes of the offload budget (0), or none
 * when that would pass cap (-1). */
int nw_scoreboard_offload_reserve(volatile int64_t *counter, uint64_t n, uint64_t cap);
/* Give n bytes back. */
void nw_scoreboard_offload_release(volatile int64_t *counter, uint64_t n);
/* The manager's writable words of the board in fd (offload_bytes, which
 * it lowers, serve_queued and handoff_queued): the header's first pages,
 * or NULL with errno; and their unmapping. */
nw_score_header *nw_scoreboard_map_shared(int fd);
void nw_scoreboard_unmap_shared(nw_score_header *h);

/* Whether the pool is stuck, so that new connections would wait unseen in
 * the listen queue: some worker is busy, none is idle or starting, and
 * every busy one has been on its current request for at least min_us.
 * With accepting_only, standby workers are left out: it is the workers
 * that accept that are stuck (the manager's look: standby workers serve
 * only what it queues); and the pool is stuck too when a standby worker
 * is idle and no accepting one can take a client now (none idle, none on
 * a request younger than min_us: starting, leaving, stuck or none at
 * all). *any_busy (may be NULL) says whether any worker looked at is busy
 * or starting (or the pool is stuck). */
/* Whether a standby worker sits idle while the accepting ones could use
 * it: none of them idle, and the requests of one that is busy block
 * (they sleep: DESIGN.md, "Requests that block"). New clients that wait
 * in a listen queue then wait for nothing. */
int nw_scoreboard_standby_unused(const nw_scoreboard *b);

int nw_scoreboard_pool_stuck(const nw_scoreboard *b, uint64_t now_us, uint64_t min_us,
                             int accepting_only, int *any_busy);

/* Whether a worker other than the one in slot self (may be NULL) is idle:
 * one that a connection handed to the manager would wake. */
int nw_scoreboard_other_idle(const nw_scoreboard *b, const nw_score_slot *self);

/* Queue waits recorded so far, by every worker alive or gone: *all of
 * them, and how many of those were longer than over_us (counted by whole
 * buckets: the ones above the bucket over_us falls in). */
void nw_scoreboard_waits(const nw_scoreboard *b, uint64_t over_us, uint64_t *all, uint64_t *over);

/* Whether a worker holding `parked` connections holds no more than the
 * accepting workers serving now do on average (slots of workers starting,
 * idle or busy; not of ones leaving, nor of ones that have let their
 * parked connections go: a crash handler's or an app's exit leave the
 * state as it was; nor standby ones, which hold few and are not where the
 * load should go). The least loaded worker always does. */
int nw_scoreboard_at_most_mean_parked(const nw_scoreboard *b, uint32_t parked);

/* The recycling turn's holder, and the low 32 bits of the monotonic ms it
 * took the turn at. */
#define NW_TURN_PID(v) ((int32_t)(uint32_t)((uint64_t)(v) >> 32))
#define NW_TURN_MS(v)  ((uint32_t)(v))

/* Recycling in turn ("Retirement" in docs/DESIGN.md): workers started
 * together reach their counts together, and a worker asks the master for
 * its replacement only with the turn, the header's `recycling`. Takes it
 * for pid at now (compare-and-swap) when it is free, its holder is no
 * longer on the board, or its holder took it max_ms or more ago (a holder
 * stuck on a request that does not end, or stopped, must not keep every
 * other worker from being recycled); returns 1 when pid holds it. The
 * master's fold of the holder's slot frees it. */
int nw_scoreboard_take_recycle_turn(nw_scoreboard *b, int32_t pid, nw_msec now, nw_msec max_ms);

/* Whether a worker of `generation` forked at or after `since` (monotonic
 * ms) is ready to take connections (idle or busy): a recycled worker's
 * replacement, asked for then. */
int nw_scoreboard_ready_since(const nw_scoreboard *b, int32_t generation, nw_msec since);

/* Which bucket a duration falls in. */
int nw_scoreboard_bucket(uint64_t duration_us);

/* A reader's consistent copy of the totals: the header's counts of the
 * workers gone plus every live slot's (retried while the master folds). */
void nw_scoreboard_totals(const nw_scoreboard *b, nw_score_counts *out);

/* The route of a request: FNV-1a over "METHOD path", the target up to its
 * '?' (never 0). nw_route_hash_request takes "METHOD target" as one
 * string (the slot's request), nw_route_hash the two pieces. */
uint64_t nw_route_hash(const char *method, size_t method_len, const char *target, size_t target_len);
uint64_t nw_route_hash_request(const char *request, size_t len);

/* The master: watch route (an entry of its own, or a free one); returns
 * its entry's index, or -1 when every entry is taken. */
int nw_scoreboard_watch_route(nw_scoreboard *b, uint64_t route);
/* The master: route's entry answers 503 until `until`. */
void nw_scoreboard_block_route(nw_scoreboard *b, int entry, nw_msec until);
/* The master: stop watching route's entry. */
void nw_scoreboard_unwatch_route(nw_scoreboard *b, int entry);
/* A worker, before the app: whether the route is answered 503 now; a
 * watched route's request is counted. One load when no route is watched. */
static inline int nw_scoreboard_route_check(nw_score_header *h, uint64_t route, nw_msec now)
{
    if (!h->crash_routes)
        return 0;
    for (int i = 0; i < NW_CRASH_ROUTES; i++) {
        nw_crash_route *e = &h->crash_route[i];
        if (e->hash != route)
            continue;
        if (e->until > now)
            return 1;
        __atomic_fetch_add(&e->started, 1, __ATOMIC_RELAXED);
        return 0;
    }
    return 0;
}

#endif
