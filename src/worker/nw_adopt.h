/* Adoption (docs/DESIGN.md, "Retirement: the other workers adopt the
 * parked connections"): a leaving worker's parked connections go to the
 * other workers through the adopt queue, a batch a frame, and they adopt
 * them. The adopt queue is SOCK_SEQPACKET, shared by all workers (both
 * ends), in every worker's epoll with EPOLLEXCLUSIVE. Part of the worker
 * (nw_worker.c), its only caller, which calls these from its loop and as
 * it leaves. It works on the worker's parking and handoff parts, and asks
 * the worker through the call-backs below (a connection made; where the
 * worker stands in the pool). Main thread only,
 * except nw_adopt_give_away's crashing mode. */
#ifndef NW_ADOPT_H
#define NW_ADOPT_H

#include <stdint.h>
#include <sys/socket.h>
#include "nw_deadlines.h"
#include "nw_handoff.h"
#include "nw_parking.h"
#include "nw_scoreboard.h"
#include "nw_wconn.h"

/* Where the worker stands, for who takes a waiting batch. */
typedef enum {
    NW_ADOPT_NEW,       /* it has not taken a connection yet */
    NW_ADOPT_SERVING,   /* an accepting worker that has */
    NW_ADOPT_STANDBY,   /* a standby worker: the accepting ones first */
} nw_adopt_standing;

/* What adoption asks of the worker (ctx). */
typedef struct {
    /* A connection on listener for fd, or NULL with fd closed (no such
     * listener, or no memory). */
    nw_wconn *(*conn_new)(void *ctx, int listener, int fd,
                          const struct sockaddr_storage *peer, socklen_t plen);
    nw_adopt_standing (*standing)(void *ctx);
    int (*within_share)(void *ctx, nw_msec now);    /* it holds no more than the mean */
} nw_adopt_ops;

/* The worker's pieces adoption works with. */
typedef struct {
    int epfd;                   /* the worker's epoll */
    uint64_t event;             /* the adopt queue's data there */
    nw_parking *parking;        /* its parked set: where adopted ones go, what a leaving
                                 * worker gives away, what counts against the open-file
                                 * limit */
    nw_handoff *handoff;        /* what does not fit goes to the manager */
    const nw_worker_owner_ops *owner;   /* a connection let go: its object dropped */
    nw_deadlines *deadlines;    /* where the step back is registered */
} nw_adopt_shared;

typedef struct {
    nw_adopt_ops ops;
    void *ctx;
    int in, out;                /* the adopt queue's ends; -1: no adoption */
    int ready;                  /* the adopt queue may hold a frame */
    nw_msec seen;               /* a busy worker saw it ready then (0: not yet) */
    nw_msec aside_until;        /* out of the adopt queue's wake-ups until then (0: in them) */
    long fd_limit;              /* take a frame only while parked + a batch stays under this */
    int epfd;
    uint64_t event;
    nw_parking *parking;
    nw_handoff *handoff;
    const nw_worker_owner_ops *owner;
    nw_deadlines *deadlines;
    char *frame_data;           /* the worker's NW_FRAME_MAX_DATA bytes for incoming frames */
    const nw_scoreboard *board; /* the pool's parked counts, or NULL */
    nw_score_counts *counts;    /* adoptions counted there, or NULL */
    volatile int64_t *passing;  /* the board's count of connections on their way between
                                 * processes: an ADOPT frame's add to it, or NULL */
} nw_adopt;

/* Adoption off (no queue yet), working for ctx through ops. */
void nw_adopt_init(nw_adopt *ad, const nw_adopt_ops *ops, void *ctx,
                   const nw_adopt_shared *shared);

/* Adopt from in_fd, send to out_fd (duplicated here), incoming frames read
 * into frame_data. Needs an open-file limit of NW_MAX_PARKED +
 * NW_ADOPT_BATCH + NW_ADOPT_FD_RESERVE or more, so that any worker can
 * always take a batch: the soft limit is raised to that when the hard one
 * allows; with less, adoption stays off (and 0 is returned too). Returns
 * 0, or -1 with errno. */
int nw_adopt_open(nw_adopt *ad, int in_fd, int out_fd, char *frame_data);

/* Count adoptions in counts, compare with the pool's parked counts on
 * board, and add what is on its way to passing (each NULL: none). */
void nw_adopt_count_in(nw_adopt *ad, const nw_scoreboard *board, nw_score_counts *counts,
                       volatile int64_t *passing);

void nw_adopt_close(nw_adopt *ad);

/* A worker that has not taken a connection yet: a waiting batch, and the
 * ones behind it while it stays within its share (then it steps aside
 * from the rest). Returns 1 when it took one. */
int nw_adopt_when_new(nw_adopt *ad, nw_msec now);

/* A busy worker's look at the queue, and an idle one's (either steps
 * aside when it may not take the batch). Return 1 when they took one. */
int nw_adopt_when_busy(nw_adopt *ad, nw_msec now);
int nw_adopt_when_idle(nw_adopt *ad, nw_msec now);

/* Back in the adopt queue's wake-ups after stepping aside. */
void nw_adopt_step_back(nw_adopt *ad);

/* A leaving worker: the frames waiting in the queue go to its back again
 * (each wakes a worker), and the parked set goes to the other workers
 * (crashing: from the crash handler, async-signal-safe). */
void nw_adopt_pass_on(nw_adopt *ad, int patience_ms);
void nw_adopt_give_away(nw_adopt *ad, int crashing);

#endif
