/* Where a worker's new work comes from: its listeners (new clients,
 * accepted here) and the serve queue (connections the manager serves to
 * workers, SERVE frames, shared by all workers). Both are in the worker's
 * epoll with EPOLLEXCLUSIVE; the worker notes what epoll reports
 * (listener_ready, serve_queue_ready) and takes from them in turns with
 * its parked connections. Part of the worker (nw_worker.c), its only
 * caller: the park watcher's work uses it too, with the worker's lock.
 * What a source needs of the worker (a connection made, whether to leave
 * new clients to the others) goes through the call-backs below. */
#ifndef NW_SOURCES_H
#define NW_SOURCES_H

#include <stdint.h>
#include <sys/socket.h>
#include "nw_limits.h"
#include "nw_proxy.h"
#include "nw_scoreboard.h"
#include "nw_wconn.h"

typedef struct {
    int fd;                     /* -1: the manager's (a TLS listener): its connections
                                 * come through the serve queue only */
    int is_tcp;
} nw_worker_listener;

/* What the sources ask of the worker (ctx). */
typedef struct {
    /* A connection on listener for fd, or NULL with fd closed (no memory). */
    nw_wconn *(*conn_new)(void *ctx, int listener, int fd,
                          const struct sockaddr_storage *peer, socklen_t plen);
    void (*let_go)(void *ctx, nw_wconn *wc);    /* to the manager for good, or closed; freed */
    int (*defer_accept)(void *ctx);     /* leave new clients to the other workers now */
    void (*accepted)(void *ctx);        /* a new client was taken */
} nw_sources_ops;

typedef struct {
    nw_sources_ops ops;
    void *ctx;
    int epfd;                   /* the worker's epoll */
    nw_worker_listener listener[NW_MAX_LISTENERS];
    int count;
    int next;                   /* where the next accept round starts */
    uint64_t listener_ready;    /* bit i: listener i may have a client */
    uint64_t relayed;           /* bit i: listener i is the manager's (fd -1): its
                                 * connections are relayed TLS ones, a PROXY header first */
    int serve_queue;            /* -1 without a manager */
    int serve_queue_ready;      /* the serve queue may hold a connection */
    int spare;                  /* a descriptor kept so a frame's has room (room_for_one) */
    uint64_t serve_event;       /* the serve queue's epoll data */
    nw_msec serve_paused_until; /* no room for a descriptor: the serve queue is out of
                                 * epoll until then (0: watched) */
    int took_served;            /* the last new connection came from the serve queue */
    char *frame_data;           /* NW_FRAME_MAX_DATA bytes for incoming frames (with a
                                 * serve queue; adoption reads its frames here too) */
    nw_proxy_cidr *proxy_from;  /* --proxy-from: the peers that may connect (none: any) */
    size_t proxy_from_n;
    nw_score_slot *slot;        /* refused --proxy-from peers are counted here, or NULL */
    nw_score_counts *counts;    /* clients left waiting at the open-file limit, or NULL */
    volatile int64_t *serve_queued; /* the board's count of frames on the serve queue, which
                                 * each frame taken lowers (narwhal_connections), or NULL */
} nw_sources;

/* No listener, no serve queue yet; listeners go into epfd. */
void nw_sources_init(nw_sources *s, const nw_sources_ops *ops, void *ctx, int epfd);

/* Take connections from the serve queue fd too (a copy of it is kept),
 * event its data in epoll. Returns 0, or -1 with errno. */
int nw_sources_open_serve_queue(nw_sources *s, int fd, uint64_t event);

/* Where refused peers, clients left waiting and frames taken are counted
 * (each NULL: not counted). */
void nw_sources_count_in(nw_sources *s, nw_score_slot *slot, nw_score_counts *counts,
                         volatile int64_t *serve_queued);

/* Add a listening socket (made non-blocking; its epoll data is its
 * index). Returns 0, or -1 with errno (EMFILE past NW_MAX_LISTENERS). */
int nw_sources_listen(nw_sources *s, int fd, int is_tcp);

/* The listeners into the worker's epoll (watched: 1) or out of it (0: a
 * standby worker). Returns 0, or -1 with errno. */
int nw_sources_watch_listeners(nw_sources *s, int watched);

/* Every listener may have a client: each is tried at the next look. */
void nw_sources_all_ready(nw_sources *s);

/* --proxy-from: add a CIDR to the peers allowed to connect (then only
 * those may). -1 when it does not parse. */
int nw_sources_proxy_from(nw_sources *s, const char *cidr);

/* A new client from the listeners epoll reported, or NULL. */
nw_wconn *nw_sources_accept_ready(nw_sources *s);

/* A serve queue left unwatched at the open-file limit is watched again
 * once its time (serve_paused_until, a deadline of the worker's) has come. */
void nw_sources_serve_queue_due(nw_sources *s, nw_msec now);

/* The next connection on the serve queue, or NULL. */
nw_wconn *nw_sources_take_served(nw_sources *s);

/* A new connection: the listeners and the serve queue take turns, so
 * that connections circulating through the manager cannot starve new ones
 * in the listen queue, nor the other way round. NULL: none now. (Inline:
 * every look for a connection asks.) */
static inline nw_wconn *nw_sources_take_new(nw_sources *s)
{
    nw_wconn *wc;
    if (s->took_served) {
        if ((wc = nw_sources_accept_ready(s)))
            s->took_served = 0;
        else if ((wc = nw_sources_take_served(s)))
            s->took_served = 1;
    } else {
        if ((wc = nw_sources_take_served(s)))
            s->took_served = 1;
        else if ((wc = nw_sources_accept_ready(s)))
            s->took_served = 0;
    }
    return wc;
}

/* A client from listener idx, or NULL (errno: EAGAIN when it has none);
 * and, after a NULL other than for ENOMEM, that listener has none: it is
 * not tried again until epoll reports it readable. */
nw_wconn *nw_sources_accept_on(nw_sources *s, int idx);
void nw_sources_listener_empty(nw_sources *s, int idx);

/* A leaving worker: it may have taken the wake-up for a request waiting
 * in the serve queue, or for a new client (EPOLLEXCLUSIVE: no other worker
 * had it), and that one would wait for the next arrival to wake a worker.
 * Each (at most NW_PASS_ON_MAX from the queue and from each listener; none
 * from the listeners of a standby worker, which took no wake-up of theirs)
 * is let go (to the manager, which serves it again, or reads its head,
 * with a wake-up of its own). */
void nw_sources_pass_on_waiting(nw_sources *s, int standby);

/* Whether epoll reported a source that was not read to its end. */
static inline int nw_sources_ready(const nw_sources *s)
{
    return s->listener_ready || s->serve_queue_ready;
}

/* A wake-up this worker took and left: epoll reported a listener or the
 * serve queue, and the worker went out to serve something else before it
 * read them to EAGAIN. They are EPOLLEXCLUSIVE, so no other worker heard
 * of it (DESIGN.md, "Parking": "A wake-up taken and left"). */
static inline int nw_sources_wakeup_left(const nw_sources *s)
{
    return s->listener_ready || (s->serve_queue >= 0 && s->serve_queue_ready);
}

/* Close the serve queue's copy and free what the sources hold. */
void nw_sources_close(nw_sources *s);

#endif
