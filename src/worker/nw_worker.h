/* A worker's scheduling: which connection it serves next and where a
 * connection goes when the worker is done with it for now. Perl-free: the
 * caller (the XS glue) runs the app and builds $env. The worker is made of
 * parts, each owning its state in its own file (the members of struct
 * nw_worker below name them): the listeners and the serve queue
 * (nw_sources.h), the handoff queue (nw_handoff.h), the parked set
 * (nw_parking.h), custody's wait list (nw_custody_wait.h), adoption
 * (nw_adopt.h), the park watcher thread (nw_watcher.h), its place in the
 * pool (nw_pool_place.h), its deferred signals (nw_worker_signals.h) and
 * the deadlines its wait ends at (nw_deadlines.h). See "The worker" in
 * docs/DESIGN.md. *
 * The queues, named from the manager's side of the story:
 *   serve queue   manager -> workers, SERVE frames (shared by all workers)
 *   handoff queue workers -> manager, HANDOFF frames (shared)
 *   adopt queue   workers -> workers, ADOPT frames: a leaving worker's parked
 *                 connections (both ends shared; no manager involved)
 *
 * Threads: every function here is for the main thread, between
 * nw_worker_enter and nw_worker_leave, except where it says otherwise.
 * The park watcher thread never calls back into the caller: connections it
 * hands to the manager are kept for the main thread to let go (the owner
 * callbacks below run on the main thread only). */
#ifndef NW_WORKER_H
#define NW_WORKER_H

#include <stdint.h>
#include <sys/socket.h>
#include "nw_adopt.h"
#include "nw_conn.h"
#include "nw_custody_wait.h"
#include "nw_deadlines.h"
#include "nw_handoff.h"
#include "nw_parking.h"
#include "nw_pool_place.h"
#include "nw_watcher.h"
#include "nw_wconn.h"
#include "nw_worker_signals.h"
#include "nw_limits.h"
#include "nw_park.h"
#include "nw_proxy.h"
#include "nw_scoreboard.h"
#include "nw_sources.h"



/* Why the caller lets a connection go (nw_worker_release). The worker
 * decides what that means: park it, hand it to the manager, or close it. */
typedef enum {
    NW_RELEASE_KEEPALIVE, /* a response was written and the connection may serve another;
                           * kept when the next request's bytes are here already */
    NW_RELEASE_IDLE,      /* no complete request arrived within the wait */
    NW_RELEASE_QUANTUM,   /* it had its turn of pipelined requests; let go only if
                           * others are waiting */
    NW_RELEASE_RETIRE,    /* the worker leaves, the server goes on: parked, for the
                           * other workers to adopt with the rest of the parked set;
                           * without adoption to the manager; closed as with STOP
                           * when neither can take it */
    NW_RELEASE_STOP,      /* the server stops: FIN, a brief drain, close */
    NW_RELEASE_CLOSE,     /* done with it: the response closes the connection, or the
                           * peer went away, timed out or was answered with an error */
} nw_release_reason;

/* What nw_worker_release did. */
typedef enum {
    NW_RELEASE_KEPT,      /* nothing: the caller serves it on (or waits on it itself) */
    NW_RELEASE_PARKED,    /* watched here; nw_worker_next gives it back when readable */
    NW_RELEASE_HANDED_OFF,/* the manager has it; our fd is closed */
    NW_RELEASE_CLOSED,    /* closed */
} nw_release_result;



/* A worker: its own fields, then its parts, each owning its state in
 * its own file; the worker is their only caller, and they reach back only
 * through the call-backs they were given. */
typedef struct nw_worker {
    int epfd;                   /* every source, parked connection and the signalfd */
    nw_conn_config cfg;
    nw_worker_owner_ops ops;
    nw_conn_spares spares;      /* its connections' buffers while they need none */
    int took_parked;            /* the last connection was a parked one */
    int taken_any;              /* nw_worker_next has given a connection */
    nw_msec last_poll;          /* when epoll was last asked */
    nw_msec looked;             /* when the main thread last looked for a connection
                                 * (nw_worker_next), or polled since */
    int draining;               /* stopping: serve what has arrived, and parked
                                 * connections' next requests until drain_until */
    nw_msec drain_until;
    int pid;                    /* this worker's process (custody frames name it) */
    nw_score_counts *counts;    /* the scoreboard slot's counts, or NULL */
    nw_score_slot *slot;        /* that slot (the connection in flight), or NULL */
    const nw_scoreboard *board; /* the board it is in, or NULL */
    nw_worker_life life;        /* whether it leaves, and why (nw_worker_signals.h) */

    /* the parts */
    nw_parking parking;         /* the parked set, and what may park (nw_parking.h) */
    nw_deadlines deadlines;     /* when a wait must end for its parts' sake (nw_deadlines.h) */
    nw_sources sources;         /* the listeners and the serve queue (nw_sources.h) */
    nw_handoff handoff;         /* the handoff queue: to the manager (nw_handoff.h) */
    nw_pool_place place;        /* accepting or standby; its share (nw_pool_place.h) */
    nw_custody_wait custody;    /* parked connections whose copies are not sent yet
                                 * (nw_custody_wait.h) */
    nw_adopt adopt;             /* the adopt queue: leaving workers' parked connections
                                 * (nw_adopt.h) */
    nw_watcher watcher;         /* the park watcher thread; its lock is held by the main
                                 * thread whenever it is inside (nw_watcher.h) */
    nw_deferred_signals signals;    /* blocked while the app runs (nw_worker_signals.h) */
} nw_worker;


/* A worker with no listeners yet. park_ms 0 turns parking off. Returns
 * NULL with errno. */
nw_worker *nw_worker_new(const nw_conn_config *cfg, double park_seconds,
                         int serve_queue, int handoff_queue, const nw_worker_owner_ops *ops);

/* Adopt parked connections of leaving workers from in_fd, and send this
 * worker's own there when it leaves (both: the two ends of one
 * SOCK_SEQPACKET socketpair, duplicated here). Needs a manager (what does
 * not fit goes there), and an open-file limit of NW_MAX_PARKED +
 * NW_ADOPT_BATCH + NW_ADOPT_FD_RESERVE or more, so that any worker can
 * always take a batch: the soft limit is raised to that when the hard one
 * allows; with less, adoption stays off (and 0 is returned too). Returns
 * 0, or -1 with errno. */
int nw_worker_adopt_queue(nw_worker *w, int in_fd, int out_fd);

/* Count adopted connections and refused --proxy-from peers in slot (a
 * scoreboard slot of board), read by the metrics page, and publish the
 * parked count there, which busy workers compare before they adopt
 * (DESIGN.md, "Retirement"); NULL: neither. */
void nw_worker_count_in(nw_worker *w, const nw_scoreboard *board, nw_score_slot *slot);

/* Add a listening socket (made non-blocking). Returns 0, or -1 with errno
 * (EMFILE past NW_MAX_LISTENERS). fd -1: a listener of the manager's (a
 * TLS listener) takes its index: its connections come from the serve
 * queue, relayed, their addresses in a PROXY header at their start. */
int nw_worker_listen(nw_worker *w, int fd, int is_tcp);

/* A standby worker (DESIGN.md, "Accepting workers"): the listeners leave
 * its epoll, and it serves what the serve queue brings (the manager's,
 * when the accepting workers are stuck), what adoption brings after the
 * accepting workers had their chance, and its parked connections; it
 * takes the listeners back when the server stops (nw_worker_drain: the
 * manager, stopped first, takes no new client then). Needs a manager
 * (EINVAL without a serve queue). Call after the listeners, before
 * serving. Returns 0, or -1 with errno. */
int nw_worker_standby(nw_worker *w);

/* Start the park watcher when there is something for it to do (a
 * manager). Call once, after the listeners, before serving. */
void nw_worker_start(nw_worker *w);

/* The main thread is inside (nw_worker_enter) or out serving a request
 * (nw_worker_leave; safe to call twice). Entering lets go of the
 * connections the watcher handed off meanwhile (owner ops drop). */
void nw_worker_enter(nw_worker *w);
void nw_worker_leave(nw_worker *w);

/* The next connection to serve: a readable parked one, one from the serve
 * queue or a new client, taking turns. Waits up to wait_ms. NULL when
 * nothing came, or on a signal (errno EINTR). A parked connection comes
 * back with the worker's hold on its owner passed to the caller; a new one
 * has owner NULL. */
nw_wconn *nw_worker_next(nw_worker *w, int wait_ms);

/* Let a connection go (see nw_release_reason). Unless the result is
 * NW_RELEASE_KEPT, the caller is done with wc's socket; wc itself stays
 * the caller's to free (nw_wconn_free), or the worker's hold on its owner
 * while parked. */
nw_release_result nw_worker_release(nw_worker *w, nw_wconn *wc, nw_release_reason why);

/* Between the response and after-response work (cleanup handlers,
 * harakiri): a rest of the response the client has not read yet goes to
 * the manager now, so that the work does not hold it back; keep_alive says
 * whether the connection then waits there for its next request. Returns 1
 * when handed off: the connection is the manager's, and the release that
 * follows only forgets it. 0: there was no rest (or it was written here). */
int nw_worker_hand_off_rest(nw_worker *w, nw_wconn *wc, int keep_alive);

/* Let every parked connection go: RETIRE gives them to the other workers
 * through the adopt queue (to the manager when it cannot), STOP closes
 * them all at once without resetting any. */
void nw_worker_release_parked(nw_worker *w, nw_release_reason why);

/* The server stops: from now on nw_worker_next returns only what has
 * arrived already (a client in the listen queue, a frame in the serve
 * queue, a parked connection with bytes) and, for serve_ms (NW_STOP_SERVE_MS;
 * tests give less, NARWHAL_TEST_STOP_SERVE_MS), the next request of a
 * parked connection, then NULL; parked connections no
 * longer go to the manager. Serving those with Connection: close before
 * exiting means no connection whose handshake the kernel completed, and
 * no request whose bytes arrived, is reset, and a busy keep-alive client
 * gets a close with its answer instead of a FIN racing its request. */
void nw_worker_drain(nw_worker *w, int serve_ms);

/* Defer these signals: block them, so that they never interrupt the
 * app (a sleep or a blocking call in it), and watch a signalfd for them
 * instead, so that nw_worker_next returns (NULL, errno EINTR) when one is
 * pending, at once while waiting and within NW_SIGNAL_LOOK_MS while busy.
 * A child the app forks starts with them unblocked. Returns 0 or -1. */
int nw_worker_defer_signals(nw_worker *w, const int *signals, int n);

/* Take the deferred signals that are pending from the signalfd: a stop
 * signal (TERM, INT, QUIT: the server stops; USR2: this worker retires)
 * goes into w->life here (nw_worker_life_signal, nw_worker_signals.h);
 * any other is returned
 * for the caller to act on, as a mask of (1 << signo). Cheap enough to
 * call after every request: when epoll has not reported one, it asks the
 * kernel at most every NW_SIGNAL_LOOK_MS. */
uint64_t nw_worker_deliver_signals(nw_worker *w);

/* The app took the socket (psgix.io): the manager lets go of its copy, so
 * that the app's close ends the connection as it would without custody. */
void nw_worker_lend_socket(nw_wconn *wc);

int nw_worker_has_manager(const nw_worker *w);

/* --proxy-from: add a CIDR to the peers allowed to connect (then only
 * those may). -1 when it does not parse. */
int nw_worker_proxy_from(nw_worker *w, const char *cidr);

/* Stop the watcher (it reads the parked connections, which the caller is
 * about to free). Idempotent. */
void nw_worker_stop_watcher(nw_worker *w);

/* This process's worker (the one started last), or NULL: for the caller's
 * exit hook. A child the app forks has none. */
nw_worker *nw_worker_of_process(void);

/* The worker is leaving by a way the request loop does not see (the app
 * called exit, a die escaped): stop the watcher and hand the parked
 * connections to the manager, so that they outlive the worker. With the
 * main thread outside. */
void nw_worker_leave_process(nw_worker *w);

/* From a signal handler, in a process about to die (a crash, the request
 * watchdog's last resort: nw_worker_signals.h): hand this process's
 * worker's parked connections to the other workers in ADOPT frames, else
 * to the manager, when the parked set is not in the middle of a change
 * (the main thread is out serving and the watcher's lock can be had, or
 * there is no watcher and the main thread was not inside); else nothing.
 * Nothing in a process without a worker (a child the app forked).
 * Async-signal-safe: frees and closes nothing. */
void nw_worker_hand_off_parked_from_handler(void);

/* Free the worker: stop the watcher, let go of the parked connections. */
void nw_worker_free(nw_worker *w);

#endif
