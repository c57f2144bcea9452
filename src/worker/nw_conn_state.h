/* The state of one client connection inside a worker: the types that
 * nw_conn.c (reading heads, writing responses) and nw_conn_body.c
 * (reading bodies) share. Functions: nw_conn.h, nw_conn_body.h. */
#ifndef NW_CONN_STATE_H
#define NW_CONN_STATE_H

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

#endif
