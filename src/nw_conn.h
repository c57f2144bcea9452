/* One client connection inside a worker: its read buffer, the request being
 * served (head, framing, body) and the response being written.
 * Owns the socket fd; nw_conn_destroy closes it. */
#ifndef NW_CONN_H
#define NW_CONN_H

#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>
#include "nw_buf.h"
#include "nw_limits.h"
#include "nw_http.h"
#include "nw_io.h"
#include "nw_response.h"
#include "nw_proxy.h"

#define NW_REQUEST_ID_MAX 64    /* bytes of a response's X-Request-Id kept for the log */

typedef struct {
    nw_parse_limits parse;
    uint64_t max_request_body;  /* 0: no limit */
    size_t body_in_memory;      /* larger bodies go to an unlinked temp file */
    double timeout;             /* one read or write making no progress */
    double read_timeout;        /* a whole request head, from its first byte */
    double read_timeout_max;    /* ...moved on while bytes arrive fast enough, up to this */
    double min_head_rate;       /* bytes a second that move it on (0: never) */
    double keepalive_timeout;   /* between requests */
    double max_keepalive_reqs;  /* no keep-alive once this many requests were read; 0: no limit */
    int proxy_protocol;         /* a PROXY header comes first (nw_proxy.h) */
    int custody;                /* --custody: parked connections' copies go to the manager */
    uint64_t max_offload_bytes; /* an in-memory rest larger than this is not offloaded */
    uint64_t max_offload_total; /* nor one that would take all of them past this */
    int offload;                /* set by the worker: a manager can finish responses */
} nw_conn_config;

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


/* Results of nw_conn_read_head and nw_conn_read_body. */
#define NW_REQ_READY     1
#define NW_REQ_AGAIN     0    /* no bytes of a request yet: the wait is over, or a signal */
#define NW_REQ_CLOSED  (-21)  /* peer went away */
#define NW_REQ_TIMEOUT (-22)  /* idle too long between requests: close quietly */
#define NW_REQ_ERROR   (-23)  /* answer c->error_status and close */

/* Buffers of idle connections (DESIGN.md): the sets that connections
 * which needed none for now gave back, for the next ones to read into.
 * Its owner's (a worker's): used by the thread that serves. */
typedef struct {
    int count;
    struct nw_conn_buffer_set {
        nw_buf in, out;
        nw_header *headers;
        size_t headers_cap;     /* its entries */
    } set[NW_SPARE_BUFFER_SETS];
} nw_conn_spares;

/* Free the sets it holds. */
void nw_conn_spares_free(nw_conn_spares *s);

typedef struct {
    int fd;
    int is_tcp;
    int listener;               /* index of the listener it came through */
    nw_conn_config cfg;

    nw_buf in;                  /* bytes read and not yet consumed */
    nw_head_scan head_scan;     /* how far the end of the head was looked for */
    size_t consumed;            /* bytes of `in` that belong to this request */
    unsigned requests;          /* request heads parsed on this connection */
    nw_msec idle_deadline;      /* first byte of the next request due by then */
    uint64_t unsent;            /* the last response was still in the socket, this much
                                 * of it, when its keep-alive time ran out (0: no) */
    nw_msec unsent_deadline;    /* ... and the kernel must send more of it by then */
    nw_msec head_deadline;      /* whole head due by then; 0 before its first byte */
    nw_msec head_started;       /* its first byte came then */
    int64_t arrived_ns;         /* the kernel received the head's last read bytes then
                                 * (CLOCK_REALTIME ns, SO_TIMESTAMPNS; 0: unknown) */

    nw_request req;
    nw_header *headers;         /* cfg.parse.max_headers entries; NULL while bare (idle) */
    size_t headers_cap;         /* its entries (at least cfg.parse.max_headers) */
    nw_conn_spares *spares;     /* where its buffers go while it needs none, and come
                                 * from (NULL: freed, and allocated) */
    size_t head_len;
    nw_framing framing;
    int is_head_method;
    int error_status;
    int spool_errno;            /* the body could not be spooled to TMPDIR: why (503) */

    nw_buf body;                /* request body, when in memory */
    int body_fd;                /* request body, when spilled; -1 otherwise */
    uint64_t body_len;

    nw_buf out;                 /* response head waiting for the first body bytes */
    int out_framing;            /* enum nw_out_framing */
    int64_t out_left;           /* NW_OUT_LENGTH: bytes still owed */
    int responded;              /* a response head was decided for this request */
    int status;                 /* its status (0: none yet) */
    uint64_t body_sent;         /* response body bytes written (framing included) */
    int proxy_pending;          /* its PROXY header is not parsed yet */
    int proxy_fresh;            /* one was just parsed: its addresses are news */
    int proxy_refused;          /* closed because its PROXY header was not valid (for the
                                 * caller to count: narwhal_proxy_rejected_total) */
    nw_proxy_info proxy;        /* what the last one said */
    char request_id[NW_REQUEST_ID_MAX];  /* the response's X-Request-Id (the access log's) */
    unsigned request_id_len;
    int keep_alive;             /* the connection stays open after this response */
    int broken;                 /* a write failed: stop writing, close */
    int lent;                   /* the socket is in blocking mode for the app
                                 * (psgix.io) until nw_conn_reclaim */
    int drained;                /* the last read left the socket empty (it was
                                 * short): whatever comes next raises an edge-
                                 * triggered event (see nw_park.h) */
    struct iovec *iov;
    int iov_cap;
    /* Output offload (DESIGN.md, "Slow readers"): what is left of the
     * response when the socket was full, for the manager to finish. */
    int offload_response;       /* this response's rest may be left to the manager */
    int rest_fd;                /* a memfd of unsent bytes, or a dup of the body's file; -1: none */
    int rest_is_memfd;
    int64_t rest_off;           /* where the rest begins in rest_fd */
    uint64_t rest_len;          /* bytes of it */
    uint64_t rest_counted;      /* bytes counted against --max-offload-total */
    /* Custody (DESIGN.md): the manager holds a copy of the socket, so our
     * close alone ends nothing: nw_conn_close_fd shuts it down first, in
     * this process only (never in a child the app forked, whose copy of
     * the worker is destroyed at its exit). */
    int custody;                /* the pid of the worker that gave the copy; 0: none */
    volatile uint32_t *held;    /* the count its open socket is in (nw_conn_count_held), or
                                 * NULL: none, or its socket is gone */
    uint64_t cookie;            /* its SO_COOKIE, once in custody */
} nw_conn;

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
