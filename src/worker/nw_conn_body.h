/* A request's body, read by the worker's connection code (nw_conn.c):
 * Content-Length or chunked, kept in memory or, once it outgrows
 * cfg.body_in_memory, spooled to an unlinked file under TMPDIR; with
 * what the two files share. nw_conn_read_body (nw_conn.h) is its caller. */
#ifndef NW_CONN_BODY_H
#define NW_CONN_BODY_H

#include "nw_conn_state.h"
#include "nw_io.h"

#include <unistd.h>

/* Read the whole body of c's request; send_raw writes the interim
 * "100 Continue" when the client asked for it. NW_REQ_READY, or an error
 * (NW_REQ_ERROR with c->error_status, NW_REQ_CLOSED, NW_REQ_TIMEOUT). */
int nw_conn_body_read(nw_conn *c, int (*send_raw)(nw_conn *c, const char *p, size_t len));

/* A read of the socket that keeps c->drained (a short read left it empty). */
static inline ssize_t conn_read(nw_conn *c, char *buf, size_t len, nw_msec deadline)
{
    ssize_t n = nw_io_read(c->fd, buf, len, deadline, NULL);
    c->drained = n > 0 && (size_t)n < len;
    return n;
}

/* The request fails with status (nw_conn_send_error answers it). */
static inline int head_error(nw_conn *c, int status)
{
    c->error_status = status;
    return NW_REQ_ERROR;
}

/* The body of the last request is gone: its bytes, its count, its file. */
static inline void body_reset(nw_conn *c)
{
    c->spool_errno = 0;
    c->body.len = 0;
    c->body_len = 0;
    if (c->body_fd >= 0) {
        close(c->body_fd);
        c->body_fd = -1;
    }
}

#endif
