/* Reading a request body (see nw_conn_body.h). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "nw_conn_body.h"
#include "nw_log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Write n bytes to the body's temp file. */
static int write_all_spooled(nw_conn *c, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(c->body_fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            c->spool_errno = w < 0 ? errno : ENOSPC;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Where request bodies are spooled. */
static const char *spool_dir(void)
{
    const char *dir = getenv("TMPDIR");
    return dir && *dir ? dir : "/tmp";
}

/* Body bytes go to memory, or to an unlinked temp file once they outgrow
 * cfg.body_in_memory. A failure to create or write the file sets
 * c->spool_errno. */
static int spill_to_file(nw_conn *c)
{
    const char *dir = spool_dir();
    int fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) {
        char path[4096];
        snprintf(path, sizeof path, "%s/narwhal-body-XXXXXX", dir);
        fd = mkostemp(path, O_CLOEXEC);
        if (fd < 0) {
            c->spool_errno = errno;
            return -1;
        }
        unlink(path);
    }
    c->body_fd = fd;
    const char *p = c->body.data;
    size_t left = c->body.len;
    c->body.len = 0;
    return write_all_spooled(c, p, left);
}

static int sink_body(nw_conn *c, const char *p, size_t n)
{
    c->body_len += n;
    if (c->body_fd < 0 && c->body.len + n > c->cfg.body_in_memory
        && spill_to_file(c) < 0)
        return -1;
    if (c->body_fd < 0)
        return nw_buf_append(&c->body, p, n);
    return write_all_spooled(c, p, n);
}

/* A body that could not be kept: 503 (with Retry-After) and a line in the
 * log when the disk refused it (full, read-only, no such TMPDIR: not the
 * client's fault, and it may pass), 500 when memory did. */
static int body_sink_error(nw_conn *c)
{
    static nw_log_limit spool_log;
    if (!c->spool_errno)
        return head_error(c, 500);
    nw_log_limited(&spool_log, nw_now_ms(), "error",
                   "cannot spool the body of %.*s %.*s to %s (TMPDIR): %s; answered 503",
                   (int)(c->req.method_len < 16 ? c->req.method_len : 16), c->req.method,
                   (int)(c->req.target_len < 200 ? c->req.target_len : 200), c->req.target,
                   spool_dir(), strerror(c->spool_errno));
    return head_error(c, 503);
}

static int io_failure(nw_conn *c, ssize_t n)
{
    if (n == NW_IO_TIMEOUT)
        return head_error(c, 408);
    return NW_REQ_CLOSED;
}

static int read_length_body(nw_conn *c)
{
    uint64_t left = (uint64_t)c->framing.content_length;
    size_t have = c->in.len - c->head_len;
    size_t take = have < left ? have : (size_t)left;
    if (sink_body(c, c->in.data + c->head_len, take) < 0)
        return body_sink_error(c);
    c->consumed += take;
    left -= take;
    char buf[NW_READ_CHUNK * 4];
    while (left > 0) {
        size_t want = left < sizeof buf ? (size_t)left : sizeof buf;
        ssize_t n;
        do {
            n = conn_read(c, buf, want, nw_deadline_in(c->cfg.timeout));
        } while (n == NW_IO_INTERRUPTED);
        if (n <= 0)
            return io_failure(c, n);
        if (sink_body(c, buf, (size_t)n) < 0)
            return body_sink_error(c);
        left -= (uint64_t)n;
    }
    return NW_REQ_READY;
}

/* Decode what is buffered past c->consumed, in place, into the body sink. */
static int decode_buffered_chunks(nw_conn *c, nw_chunked *d)
{
    char *p = c->in.data + c->consumed;
    size_t avail = c->in.len - c->consumed;
    size_t out_len = 0;
    long used = nw_chunked_decode(d, p, avail, p, &out_len);
    if (used == NW_CHUNKED_TOO_LARGE)
        return head_error(c, 413);
    if (used < 0)
        return head_error(c, 400);
    if (sink_body(c, p, out_len) < 0)
        return body_sink_error(c);
    /* The decoded bytes were written over consumed input: drop both. */
    memmove(p, p + used, avail - (size_t)used);
    c->in.len -= (size_t)used;
    return NW_REQ_READY;
}

static int read_chunked_body(nw_conn *c)
{
    nw_chunked d;
    nw_chunked_init(&d, c->cfg.max_request_body, c->cfg.parse.max_header_bytes);
    for (;;) {
        int r = decode_buffered_chunks(c, &d);
        if (r != NW_REQ_READY || d.done)
            return r;
        if (nw_buf_reserve(&c->in, NW_READ_CHUNK) < 0)
            return head_error(c, 500);
        ssize_t n;
        do {
            n = conn_read(c, c->in.data + c->in.len, c->in.cap - c->in.len,
                           nw_deadline_in(c->cfg.timeout));
        } while (n == NW_IO_INTERRUPTED);
        if (n <= 0)
            return io_failure(c, n);
        c->in.len += (size_t)n;
    }
}

static void send_continue(nw_conn *c, int (*send_raw)(nw_conn *c, const char *p, size_t len))
{
    static const char msg[] = "HTTP/1.1 100 Continue\r\n\r\n";
    if (c->req.minor_version >= 1 && c->in.len == c->head_len)
        send_raw(c, msg, sizeof msg - 1);
}

int nw_conn_body_read(nw_conn *c, int (*send_raw)(nw_conn *c, const char *p, size_t len))
{
    body_reset(c);
    if (c->framing.body == NW_BODY_NONE
        || (c->framing.body == NW_BODY_LENGTH && c->framing.content_length == 0))
        return NW_REQ_READY;
    if (c->framing.body == NW_BODY_LENGTH && c->cfg.max_request_body
        && (uint64_t)c->framing.content_length > c->cfg.max_request_body)
        return head_error(c, 413);
    if (c->framing.expect_continue)
        send_continue(c, send_raw);
    /* The parsed head points into c->in, which may grow (move) as the body
     * is read: its pointers move with it (the access log and the
     * scoreboard read the request line and headers after the body). */
    uintptr_t head_was = (uintptr_t)c->in.data;
    int r = c->framing.body == NW_BODY_LENGTH ? read_length_body(c)
                                              : read_chunked_body(c);
    if ((uintptr_t)c->in.data != head_was)
        nw_http_request_moved(&c->req, head_was, c->in.data);
    if (r == NW_REQ_READY && c->body_fd >= 0 && lseek(c->body_fd, 0, SEEK_SET) < 0)
        return head_error(c, 500);
    return r;
}
