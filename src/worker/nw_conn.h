/* One client connection inside a worker: its read buffer, the request being
 * served (head, framing, body) and the response being written.
 * Owns the socket fd; nw_conn_destroy closes it. */
#ifndef NW_CONN_H
#define NW_CONN_H

#include "nw_conn_state.h"

/* A connection whose PROXY header is bad: nw_conn_read_head closes it
 * without an answer (NW_REQ_CLOSED). */

/* The server is stopping or draining (a flag the master sets on the
 * scoreboard): responses stop keeping connections alive, so clients move
 * to a new connection before this server closes. NULL: never. */
void nw_conn_watch_closing(const volatile int32_t *flag);
int nw_conn_server_closing(void);

/* The scoreboard's count of offloaded bytes (--max-offload-total). NULL:
 * in-memory rests are never offloaded (files still are). */
void nw_conn_watch_offload(volatile int64_t *counter);

/* Counts for narwhal_connections (NULL: none). held: the worker's slot's
 * count of the sockets it holds open, which every connection made from
 * now on is in until its socket is closed or passed on (in this process
 * only: a child the app forks counts nothing). handoffs: the board's count
 * of HANDOFF frames on the handoff queue, which a hand-off adds to before
 * it sends (and the manager takes off as it reads). */
void nw_conn_count_held(volatile uint32_t *held);
void nw_conn_count_handoffs(volatile int64_t *handoffs);

/* Free the sets it holds. */
void nw_conn_spares_free(nw_conn_spares *s);

nw_conn *nw_conn_new(int fd, int is_tcp, const nw_conn_config *cfg);
void nw_conn_destroy(nw_conn *c);

/* This process's copy of the socket is closed (or was never to count):
 * the socket lives on elsewhere (passed to another process) or is gone.
 * For code that closes c->fd itself and sets it to -1. */
void nw_conn_fd_gone(nw_conn *c);

/* Close the connection's socket for good (a FIN at once, even with the
 * manager's copy open: see custody). Not for a socket that lives on
 * elsewhere (a hand-off, an adoption): those close their copy only. */
void nw_conn_close_fd(nw_conn *c);

/* Give the manager a copy of the socket to hold in custody, with what it
 * needs to take the connection over (listener, request count, PROXY
 * addresses) should this process end (worker pid). Once per connection;
 * never waits (a full queue: not now, maybe at its next park). 0 or -1. */
int nw_conn_custody(nw_conn *c, int channel, int pid);

/* The manager lets its copy go (the socket was lent to the app: its close
 * must end the connection as it would without custody). 0 or -1. */
int nw_conn_custody_release(nw_conn *c, int channel, int pid);

/* Read and parse the next request head. max_wait_s bounds the wait while
 * no byte of it has arrived (NW_REQ_AGAIN after it); with wait_partial,
 * also while part of it has. The deadlines hold either way. */
int nw_conn_read_head(nw_conn *c, double max_wait_s, int wait_partial);

/* Send the connection, its request count, its deadline and the bytes read
 * past the last request to the manager in one HANDOFF frame, then close our
 * copy. Returns 0, or -1 (nothing sent; the connection is still ours). */
int nw_conn_handoff(nw_conn *c, int channel);

/* nw_conn_handoff, waiting up to wait_ms while the queue to the manager is
 * full (its socket's send buffer; a burst of hand-offs can fill it while
 * the manager is busy), or while the kernel refuses the descriptor for a
 * while (ETOOMANYREFS: this user's descriptors in flight over unix sockets
 * are over its open-file limit, until the manager takes some; ENOBUFS,
 * ENOMEM), tried again every NW_HANDOFF_RETRY_MS then. */
int nw_conn_handoff_patiently(nw_conn *c, int channel, int wait_ms);

/* Whether a hand-off's errno is one to wait out and try again (the
 * queue full, or the kernel refusing for a while), not a failure. */
int nw_conn_handoff_waits(int err);

/* The response is complete but part of it could not be written yet
 * (c->rest_fd >= 0): send the connection and the rest to the manager in one
 * HANDOFF frame with NW_FRAME_F_OUTPUT; after the rest, the manager keeps
 * the connection for its next request (keep_alive) or closes it. Returns 0,
 * or -1 (nothing sent; still ours). */
int nw_conn_handoff_output(nw_conn *c, int channel, int keep_alive);

/* nw_conn_handoff_output, waiting up to wait_ms while the queue is full. */
int nw_conn_handoff_output_patiently(nw_conn *c, int channel, int keep_alive, int wait_ms);

/* Write the rest here, waiting (up to the write timeout per write), when
 * the manager cannot take it. NW_IO_OK or an error (then broken). */
int nw_conn_finish_rest(nw_conn *c);

/* Read the whole body (answering 100-continue first when asked). */
int nw_conn_read_body(nw_conn *c);

/* Forget the current request, keep pipelined bytes, arm the idle deadline
 * (from now: the caller's reading of nw_now_ms as the request ended). */
void nw_conn_finish_request(nw_conn *c, nw_msec now);

/* The connection needs no buffers for now (it waits for its next request
 * with nothing buffered either way, or it is closed): its input buffer,
 * response-head buffer and header table go to c->spares (or are freed),
 * and it is bare until its next read takes a set back
 * (DESIGN.md, "Buffers of idle connections"). Nothing happens when bytes
 * are buffered on an open connection; a closed one's are dropped. */
void nw_conn_shed_buffers(nw_conn *c);

/* FIN first, drain briefly, then close: a request crossing our close meets
 * end-of-stream (which clients retry) rather than a reset. */
void nw_conn_close_gently(nw_conn *c);

/* Answer an error status with Connection: close, then close gently. */
void nw_conn_send_error(nw_conn *c, int status);

/* Send an interim 1xx response whose head is in b. Returns NW_IO_*. */
int nw_conn_send_raw(nw_conn *c, const char *p, size_t len);

/* The head in c->out is complete; framing and keep-alive are decided. */
void nw_conn_head_ready(nw_conn *c, int framing, int64_t length, int keep_alive);

/* Send body pieces (the pending head first). Frames them as chunks when
 * chunked, drops them for HEAD/204/304, never exceeds a Content-Length.
 * Returns NW_IO_OK or an error (and the connection is marked broken). */
int nw_conn_write_body(nw_conn *c, const struct iovec *pieces, int n);

/* Send len bytes of a file (the pending head first). */
int nw_conn_send_file(nw_conn *c, int file_fd, off_t offset, size_t len);

/* The app had the socket (psgix.io) in blocking mode: make it ours again
 * (non-blocking) before the server writes or reads on it. */
void nw_conn_reclaim(nw_conn *c);

/* The response is cut short (the app died while producing it): nothing
 * more is written, not even the last chunk, so the client sees the body
 * as truncated (RFC 9112 7.1, 8), and the connection will be closed. */
void nw_conn_abandon(nw_conn *c);

/* End the body: flush the head, write the last chunk, settle keep-alive.
 * Returns 1 when the connection may serve another request. */
int nw_conn_end_body(nw_conn *c);

#endif
