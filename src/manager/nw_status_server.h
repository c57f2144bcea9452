/* The status server: the --status-listen listener's clients, served from
 * the connection manager's epoll loop. It accepts, reads a head (up to
 * 4 KiB, 5 s for the whole exchange), renders the page through
 * nw_status.h from the scoreboard and the manager's numbers, writes it
 * without blocking and closes. Linux only (accept4, epoll). The manager
 * owns the loop and calls in; see "The operator layer" in docs/DESIGN.md.
 *
 * Every function is for the manager's thread; none blocks. */
#ifndef NW_STATUS_SERVER_H
#define NW_STATUS_SERVER_H

#include <stddef.h>
#include "nw_buf.h"
#include "nw_io.h"
#include "nw_scoreboard.h"
#include "nw_status.h"

#define NW_STATUS_CLIENTS       16      /* status requests served at once; more wait in the backlog */

/* A connection to the status listener. */
typedef struct {
    int     fd;             /* -1: free */
    int     answering;      /* the answer is rendered: writing it */
    nw_msec deadline;
    nw_buf  in, out;
    size_t  sent;
} nw_status_client;

/* Fills in the manager's part of a page (connections held, hand-offs,
 * listeners): called with the arg given to nw_status_server_start, each
 * time a page is rendered. */
typedef void nw_status_numbers_fn(void *arg, nw_status_manager *sm);

typedef struct {
    int     fd;                     /* the status listener, or -1 */
    int     ep;                     /* the epoll set it is watched in (the manager's), or -1 */
    int     listening;              /* the listener is in that set: not while every place
                                     * is taken (it would read ready on every wake) */
    int     active;                 /* clients in use: while any are, the caller's loop
                                     * must wake at least once a second for their deadlines */
    nw_status_client client[NW_STATUS_CLIENTS];
    nw_status_rates *rates;         /* the samples /status's rates are measured from
                                     * (allocated at the first render) */
    const nw_scoreboard *board;     /* read-only; NULL: none (the pages show no workers) */
    nw_status_numbers_fn *numbers;
    void   *numbers_arg;
} nw_status_server;

/* A status server on listen_fd (a listening socket, or -1: none), not
 * serving yet, with every client free. Cannot fail; nw_status_server_close
 * may follow at once. */
void nw_status_server_init(nw_status_server *s, int listen_fd);

/* Serve: the listener is made non-blocking and added to ep (EPOLLIN,
 * data.fd: the caller hands its events to nw_status_server_event), and its
 * clients will be too. Pages show board (may be NULL) and what numbers
 * fills in. Returns 0 (also without a listener), or -1 with errno. */
int nw_status_server_start(nw_status_server *s, int ep, const nw_scoreboard *board,
                           nw_status_numbers_fn *numbers, void *numbers_arg);

/* An event on fd, at now: 1 when fd was the listener (as many clients
 * accepted as are free) or one of the clients (a read, or a write of its
 * answer; a complete head is answered at once), 0 when it is not ours. */
int nw_status_server_event(nw_status_server *s, int fd, nw_msec now);

/* Close the clients whose deadline is past at now. */
void nw_status_server_expire(nw_status_server *s, nw_msec now);

/* Close every client and the listener, and free the rates. Idempotent. */
void nw_status_server_close(nw_status_server *s);

#endif
