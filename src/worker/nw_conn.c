#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "nw_conn.h"
#include "nw_conn_body.h"
#include "nw_frame.h"
#include "nw_log.h"
#include "nw_scoreboard.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#define LINGER_SECONDS   0.5       /* after an error reply, drain this long... */
#define LINGER_MAX_BYTES (1024 * 1024) /* ...or this much, so the reply is not reset */

/* Every read of the socket goes through these two and conn_read
 * (nw_conn_body.h), which keep c->drained: a short read, or a brief look
 * that found nothing, left the socket empty. A head's reads also keep
 * c->arrived_ns. */
static ssize_t conn_read_head(nw_conn *c, char *buf, size_t len, nw_msec deadline)
{
    ssize_t n = nw_io_read(c->fd, buf, len, deadline, &c->arrived_ns);
    c->drained = n > 0 && (size_t)n < len;
    return n;
}

static ssize_t conn_read_brief(nw_conn *c, char *buf, size_t len, double wait_s)
{
    ssize_t n = nw_io_read_brief(c->fd, buf, len, wait_s, &c->arrived_ns);
    c->drained = n == NW_IO_TIMEOUT || (n > 0 && (size_t)n < len);
    return n;
}

static const volatile int32_t *closing_flag;

void nw_conn_watch_closing(const volatile int32_t *flag)
{
    closing_flag = flag;
}

int nw_conn_server_closing(void)
{
    return closing_flag && *closing_flag;
}

static volatile int64_t *offload_counter;

void nw_conn_watch_offload(volatile int64_t *counter)
{
    offload_counter = counter;
}

static volatile uint32_t *held_counter;
static volatile int64_t *handoff_counter;

/* A child the app forks shares the scoreboard: its copies of the worker's
 * connections, closed as it exits, are not the worker's to count. */
static void held_after_fork_child(void)
{
    held_counter = NULL;
}

void nw_conn_count_held(volatile uint32_t *held)
{
    static int atfork_done;
    if (!atfork_done && pthread_atfork(NULL, NULL, held_after_fork_child) == 0)
        atfork_done = 1;
    held_counter = held;
}

void nw_conn_count_handoffs(volatile int64_t *handoffs)
{
    handoff_counter = handoffs;
}

void nw_conn_fd_gone(nw_conn *c)
{
    if (c->held && c->held == held_counter)
        __atomic_sub_fetch(c->held, 1, __ATOMIC_RELAXED);
    c->held = NULL;
}

nw_conn *nw_conn_new(int fd, int is_tcp, const nw_conn_config *cfg)
{
    nw_conn *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->fd = fd;                 /* (bare: its buffers come with its first read) */
    if (fd >= 0 && (c->held = held_counter))
        __atomic_add_fetch(c->held, 1, __ATOMIC_RELAXED);
    c->is_tcp = is_tcp;
    c->cfg = *cfg;
    c->body_fd = -1;
    c->rest_fd = -1;
    c->proxy_pending = cfg->proxy_protocol;
    c->idle_deadline = nw_deadline_in(cfg->read_timeout);
    return c;
}

static void rest_drop(nw_conn *c)
{
    if (c->rest_fd >= 0)
        close(c->rest_fd);
    if (c->rest_counted && offload_counter)
        nw_scoreboard_offload_release(offload_counter, c->rest_counted);
    c->rest_fd = -1;
    c->rest_is_memfd = 0;
    c->rest_off = 0;
    c->rest_len = c->rest_counted = 0;
}

/* ---- buffers of idle connections (DESIGN.md) ---------------------------- */

typedef struct nw_conn_buffer_set buffer_set;

static size_t headers_wanted(const nw_conn *c)
{
    return c->cfg.parse.max_headers ? c->cfg.parse.max_headers : 1;
}

static void set_free(buffer_set *s)
{
    nw_buf_free(&s->in);
    nw_buf_free(&s->out);
    free(s->headers);
}

void nw_conn_spares_free(nw_conn_spares *s)
{
    while (s->count > 0)
        set_free(&s->set[--s->count]);
}

/* A buffer of the set for the connection's, unless it has its own
 * (bytes that came with it from the manager). */
static void take_buffer(nw_buf *mine, nw_buf *spare)
{
    if (mine->data)
        nw_buf_free(spare);
    else
        *mine = *spare;
}

/* Before a bare connection's head is read: the set given back last, or a
 * fresh header table (the buffers then grow as they are written). -1:
 * out of memory. */
static int furnish(nw_conn *c)
{
    nw_conn_spares *sp = c->spares;
    while (sp && sp->count > 0) {
        buffer_set s = sp->set[--sp->count];
        if (s.headers_cap >= headers_wanted(c)) {
            take_buffer(&c->in, &s.in);
            take_buffer(&c->out, &s.out);
            c->headers = s.headers;
            c->headers_cap = s.headers_cap;
            return 0;
        }
        set_free(&s);   /* (another --max-headers: not for this connection) */
    }
    c->headers = calloc(headers_wanted(c), sizeof *c->headers);
    c->headers_cap = headers_wanted(c);
    return c->headers ? 0 : -1;
}

void nw_conn_shed_buffers(nw_conn *c)
{
    if (c->fd < 0) {            /* closed: what is buffered is for nobody */
        c->in.len = c->out.len = 0;
        c->consumed = 0;
        memset(&c->req, 0, sizeof c->req);  /* (its pointers were into c->in) */
    }
    if (!c->headers || c->in.len > 0 || c->out.len > 0)
        return;
    buffer_set s = { c->in, c->out, c->headers, c->headers_cap };
    if (c->spares && c->spares->count < NW_SPARE_BUFFER_SETS)
        c->spares->set[c->spares->count++] = s;
    else
        set_free(&s);
    memset(&c->in, 0, sizeof c->in);
    memset(&c->out, 0, sizeof c->out);
    c->headers = NULL;
    c->headers_cap = 0;
}

void nw_conn_destroy(nw_conn *c)
{
    if (!c)
        return;
    rest_drop(c);
    nw_conn_close_fd(c);
    body_reset(c);
    nw_buf_free(&c->in);
    nw_buf_free(&c->body);
    nw_buf_free(&c->out);
    free(c->headers);
    free(c->iov);
    free(c);
}

/* No complete head yet: is what we have already over a limit? */
static int head_over_limit(nw_conn *c)
{
    if (c->in.len > c->cfg.parse.max_request_line
        && !memchr(c->in.data, '\n', c->cfg.parse.max_request_line + 1))
        return 414;
    if (c->in.len > c->cfg.parse.max_header_bytes)
        return 431;
    return 0;
}

static int parse_ready_head(nw_conn *c)
{
    int r = nw_http_parse_head(c->in.data, c->in.len, &c->req, c->headers,
                               &c->cfg.parse);
    if (r == NW_PARSE_ERROR)
        return head_error(c, c->req.error_status ? c->req.error_status : 400);
    if (r == NW_PARSE_INCOMPLETE)
        return NW_REQ_AGAIN;   /* only blank lines so far */
    c->head_len = (size_t)r;
    c->consumed = c->head_len;
    c->requests++;
    if (nw_http_framing(&c->req, &c->framing) != 0)
        return head_error(c, c->framing.error_status);
    if (c->framing.options_asterisk)
        return head_error(c, 200);  /* the server's own answer (nw_conn_send_error) */
    c->is_head_method = c->req.method_len == 4
                        && memcmp(c->req.method, "HEAD", 4) == 0;
    return NW_REQ_READY;
}

/* The PROXY header before the head: NW_REQ_READY when it is parsed (and
 * consumed), NW_REQ_AGAIN while it is incomplete, NW_REQ_CLOSED when it is
 * not one (closed: never guess). */
static int read_proxy_header(nw_conn *c)
{
    size_t used = 0;
    int r = nw_proxy_parse(c->in.data, c->in.len, &c->proxy, &used);
    if (r == NW_PROXY_MORE)
        return NW_REQ_AGAIN;
    if (r == NW_PROXY_BAD) {
        nw_conn_close_fd(c);
        c->proxy_refused = 1;
        return NW_REQ_CLOSED;
    }
    nw_buf_consume(&c->in, used);
    c->proxy_pending = 0;
    c->proxy_fresh = 1;
    return NW_REQ_READY;
}

/* Empty lines before a request line are dropped as they come, by the rule
 * the manager applies too (nw_http_empty_lines): they do not start the
 * head, and count toward no limit. -1: a bare CR (400). */
static int drop_empty_lines(nw_conn *c)
{
    int bad;
    size_t n = nw_http_empty_lines(c->in.data, c->in.len, &bad);
    if (bad)
        return -1;
    if (n > 0) {
        nw_buf_consume(&c->in, n);
        memset(&c->head_scan, 0, sizeof c->head_scan);
    }
    return 0;
}

/* The keep-alive time ran out while the last response was still in the
 * socket (bytes the kernel has not sent yet: a slow reader's), so the
 * connection was not idle: wait, up to until, for them to be sent (the
 * socket polls writable only then) or for the client's next bytes, and
 * start its keep-alive time then (DESIGN.md, "Slow readers"). What the
 * kernel sends moves the wait on by --timeout, as a write's progress
 * does. NW_REQ_READY: its keep-alive time starts again; NW_REQ_AGAIN:
 * still sending at until; NW_REQ_TIMEOUT: nothing waits there, or the
 * client took nothing for --timeout. */
static int idle_once_sent(nw_conn *c, nw_msec until)
{
    uint64_t unsent = nw_io_unsent(c->fd);
    if (!unsent && !c->unsent)
        return NW_REQ_TIMEOUT;              /* it was idle */
    if (unsent && (!c->unsent || unsent < c->unsent)) {  /* the first look, or progress */
        c->unsent = unsent;
        c->unsent_deadline = nw_deadline_in(c->cfg.timeout);
    }
    if (unsent) {
        if (nw_now_ms() >= c->unsent_deadline || nw_io_writable_when_sent(c->fd, 1) < 0)
            return NW_REQ_TIMEOUT;
        int r = nw_io_wait(c->fd, POLLOUT | POLLIN,
                           until < c->unsent_deadline ? until : c->unsent_deadline);
        nw_io_writable_when_sent(c->fd, 0);
        if (r != NW_IO_OK)
            return NW_REQ_AGAIN;    /* (without progress by its deadline: the next look says) */
    }
    c->unsent = 0;
    c->idle_deadline = nw_deadline_in(c->cfg.keepalive_timeout);
    return NW_REQ_READY;
}

int nw_conn_read_head(nw_conn *c, double max_wait_s, int wait_partial)
{
    if (!c->headers && furnish(c) < 0)
        return head_error(c, 500);
    for (;;) {
        if (c->in.len > 0 && c->proxy_pending) {
            int r = read_proxy_header(c);
            if (r == NW_REQ_CLOSED)
                return r;
            if (r == NW_REQ_READY)
                continue;
        }
        if (c->in.len > 0 && c->proxy_pending) {
            if (c->head_deadline == 0)
                c->head_started = nw_now_ms();
            c->head_deadline = nw_head_deadline(c->head_started, c->in.len, c->cfg.read_timeout,
                                                c->cfg.read_timeout_max, c->cfg.min_head_rate);
        } else if (c->in.len > 0 && (c->in.data[0] == '\r' || c->in.data[0] == '\n')
                   && drop_empty_lines(c) < 0) {
            return head_error(c, 400);
        }
        if (c->in.len > 0 && !c->proxy_pending) {
            if (nw_http_head_end(c->in.data, c->in.len, &c->head_scan)) {
                int r = parse_ready_head(c);
                if (r != NW_REQ_AGAIN)
                    return r;
                c->head_scan.scanned = c->in.len;
            } else {
                int over = head_over_limit(c);
                if (over)
                    return head_error(c, over);
                if (!nw_http_line_can_start(c->in.data, c->in.len))
                    return head_error(c, 400);   /* not HTTP: no head will end */
            }
            if (c->head_deadline == 0)
                c->head_started = nw_now_ms();
            c->head_deadline = nw_head_deadline(c->head_started, c->in.len, c->cfg.read_timeout,
                                                c->cfg.read_timeout_max, c->cfg.min_head_rate);
        }
        /* (a lone CR that became an empty line: the head had begun) */
        int waiting_first_byte = c->in.len == 0 && c->head_deadline == 0;
        nw_msec deadline = waiting_first_byte ? c->idle_deadline : c->head_deadline;
        nw_msec wait_until = nw_deadline_in(max_wait_s);
        int wait_shorter = (waiting_first_byte || wait_partial) && wait_until < deadline;
        if (wait_shorter)
            deadline = wait_until;
        if (nw_buf_reserve(&c->in, NW_READ_CHUNK) < 0)
            return head_error(c, 500);
        /* A wait under a millisecond is a brief look, not a deadline. */
        ssize_t n = wait_shorter && max_wait_s < 0.001
            ? conn_read_brief(c, c->in.data + c->in.len, c->in.cap - c->in.len, max_wait_s)
            : conn_read_head(c, c->in.data + c->in.len, c->in.cap - c->in.len, deadline);
        if (n > 0) {
            c->in.len += (size_t)n;
            continue;
        }
        if (n == NW_IO_INTERRUPTED) {
            if (waiting_first_byte || wait_partial)
                return NW_REQ_AGAIN;
            continue;
        }
        if (n == NW_IO_TIMEOUT) {
            if (wait_shorter)
                return NW_REQ_AGAIN;
            if (!waiting_first_byte)
                return head_error(c, 408);
            int r = c->fd >= 0 ? idle_once_sent(c, wait_until) : NW_REQ_TIMEOUT;
            if (r == NW_REQ_READY)
                continue;   /* (its keep-alive time starts now) */
            return r;
        }
        return NW_REQ_CLOSED;
    }
}

void nw_conn_finish_request(nw_conn *c, nw_msec now)
{
    nw_conn_reclaim(c);
    nw_buf_consume(&c->in, c->consumed);
    c->consumed = 0;
    memset(&c->head_scan, 0, sizeof c->head_scan);
    c->head_deadline = 0;
    c->head_len = 0;
    body_reset(c);
    c->out.len = 0;
    c->responded = 0;
    c->status = 0;
    c->body_sent = 0;
    c->request_id_len = 0;
    memset(&c->req, 0, sizeof c->req);  /* its pointers were into bytes now consumed */
    c->out_framing = 0;
    c->unsent = 0;
    c->idle_deadline = nw_deadline_at(now, c->cfg.keepalive_timeout);
}

int nw_conn_read_body(nw_conn *c)
{
    return nw_conn_body_read(c, nw_conn_send_raw);
}

int nw_conn_send_raw(nw_conn *c, const char *p, size_t len)
{
    struct iovec iov = { (void *)p, len };
    if (nw_conn_finish_rest(c) != NW_IO_OK)   /* (bytes never overtake a rest) */
        return NW_IO_CLOSED;
    int r = nw_io_writev_all(c->fd, &iov, 1, c->cfg.timeout);
    if (r != NW_IO_OK)
        c->broken = 1;
    return r;
}

/* Read and drop what the client still sends, briefly, so that closing does
 * not reset the connection before it has read our answer. */
static void linger_close(nw_conn *c)
{
    char buf[NW_READ_CHUNK];
    size_t drained = 0;
    nw_msec deadline = nw_deadline_in(LINGER_SECONDS);
    shutdown(c->fd, SHUT_WR);
    while (drained < LINGER_MAX_BYTES) {
        ssize_t n = conn_read(c, buf, sizeof buf, deadline);
        if (n == NW_IO_INTERRUPTED)
            continue;
        if (n <= 0)
            break;
        drained += (size_t)n;
    }
    nw_conn_close_fd(c);
}

void nw_conn_close_gently(nw_conn *c)
{
    if (c->fd >= 0)
        linger_close(c);
}

void nw_conn_send_error(nw_conn *c, int status)
{
    nw_buf b = { 0 };
    c->status = status;
    if (status == 200 ? nw_head_options(&b) == 0 : nw_head_error(&b, status) == 0)
        nw_conn_send_raw(c, b.data, b.len);
    nw_buf_free(&b);
    c->keep_alive = 0;
    if (c->fd >= 0)
        linger_close(c);
}

void nw_conn_head_ready(nw_conn *c, int framing, int64_t length, int keep_alive)
{
    c->responded = 1;
    c->out_framing = framing;
    c->out_left = length;
    c->keep_alive = keep_alive;
}

static struct iovec *iov_room(nw_conn *c, int n)
{
    if (n > c->iov_cap) {
        int cap = c->iov_cap ? c->iov_cap : 16;
        while (cap < n)
            cap *= 2;
        struct iovec *p = realloc(c->iov, (size_t)cap * sizeof *p);
        if (!p)
            return NULL;
        c->iov = p;
        c->iov_cap = cap;
    }
    return c->iov;
}

/* Append the pending head (if any) as the first iovec. */
static int take_head(nw_conn *c, struct iovec *v)
{
    if (c->out.len == 0)
        return 0;
    v->iov_base = c->out.data;
    v->iov_len = c->out.len;
    return 1;
}

static size_t iov_total(const struct iovec *v, int n)
{
    size_t total = 0;
    for (int i = 0; i < n; i++)
        total += v[i].iov_len;
    return total;
}

/* Append v to the in-memory rest (a memfd made on first use), within
 * --max-offload-bytes and --max-offload-total. 0, or -1: nothing kept. */
static int rest_append(nw_conn *c, struct iovec *v, int n)
{
    uint64_t len = iov_total(v, n);
    if ((c->rest_fd >= 0 && !c->rest_is_memfd) || !offload_counter
        || c->rest_counted + len > c->cfg.max_offload_bytes
        || nw_scoreboard_offload_reserve(offload_counter, len, c->cfg.max_offload_total) < 0)
        return -1;
    if (c->rest_fd < 0) {
        c->rest_fd = memfd_create("narwhal-response-rest", MFD_CLOEXEC);
        if (c->rest_fd < 0) {
            nw_scoreboard_offload_release(offload_counter, len);
            return -1;
        }
        c->rest_is_memfd = 1;
    }
    if (nw_io_writev_now(c->rest_fd, &v, &n) != NW_IO_OK) {   /* no memory: undo */
        nw_scoreboard_offload_release(offload_counter, len);
        if (ftruncate(c->rest_fd, (off_t)c->rest_len) != 0
            || lseek(c->rest_fd, (off_t)c->rest_len, SEEK_SET) < 0)
            c->broken = 1;
        return -1;
    }
    c->rest_len += len;
    c->rest_counted += len;
    return 0;
}

/* Write v without waiting; what the socket does not take becomes the rest.
 * Once there is a rest, later bytes go behind it. When it cannot be kept,
 * everything is written here, waiting, as without offload. */
static int write_or_leave(nw_conn *c, struct iovec *v, int n)
{
    if (c->rest_fd < 0) {
        int r = nw_io_writev_now(c->fd, &v, &n);
        if (r != NW_IO_AGAIN)
            return r;
    }
    if (rest_append(c, v, n) == 0)
        return NW_IO_OK;
    if (nw_conn_finish_rest(c) != NW_IO_OK)
        return NW_IO_CLOSED;
    return nw_io_writev_all(c->fd, v, n, c->cfg.timeout);
}

static int flush(nw_conn *c, struct iovec *v, int n)
{
    if (c->broken)
        return NW_IO_CLOSED;
    size_t total = iov_total(v, n);   /* v[0] is the head when one was pending */
    int r = c->offload_response || c->rest_fd >= 0
            ? write_or_leave(c, v, n)
            : nw_io_writev_all(c->fd, v, n, c->cfg.timeout);
    if (r == NW_IO_OK)
        c->body_sent += total - c->out.len;
    c->out.len = 0;
    if (r != NW_IO_OK)
        c->broken = 1;
    return r;
}

int nw_conn_finish_rest(nw_conn *c)
{
    if (c->rest_fd < 0)
        return c->broken ? NW_IO_CLOSED : NW_IO_OK;
    int r = c->broken ? NW_IO_CLOSED
          : nw_io_sendfile_all(c->fd, c->rest_fd, (off_t)c->rest_off, c->rest_len, c->cfg.timeout);
    rest_drop(c);
    if (r != NW_IO_OK)
        c->broken = 1;
    return r;
}

/* Copy pieces into v, cutting them at the bytes a Content-Length allows. */
static int add_length_pieces(nw_conn *c, struct iovec *v, const struct iovec *pieces, int n)
{
    int k = 0;
    for (int i = 0; i < n && c->out_left > 0; i++) {
        size_t len = pieces[i].iov_len;
        if ((int64_t)len > c->out_left)
            len = (size_t)c->out_left;   /* the app wrote more than it declared */
        if (len == 0)
            continue;
        v[k].iov_base = pieces[i].iov_base;
        v[k].iov_len = len;
        c->out_left -= (int64_t)len;
        k++;
    }
    return k;
}

int nw_conn_write_body(nw_conn *c, const struct iovec *pieces, int n)
{
    char chunk_head[24];
    struct iovec *v = iov_room(c, n + 3);
    if (!v) {
        c->broken = 1;
        return NW_IO_CLOSED;
    }
    int k = take_head(c, v);
    if (c->out_framing == NW_OUT_LENGTH) {
        k += add_length_pieces(c, v + k, pieces, n);
    } else if (c->out_framing == NW_OUT_CHUNKED) {
        size_t total = 0;
        for (int i = 0; i < n; i++)
            total += pieces[i].iov_len;
        if (total > 0) {
            v[k].iov_base = chunk_head;
            v[k++].iov_len = (size_t)snprintf(chunk_head, sizeof chunk_head,
                                              "%zx\r\n", total);
            memcpy(v + k, pieces, (size_t)n * sizeof *v);
            k += n;
            v[k].iov_base = (void *)"\r\n";
            v[k++].iov_len = 2;
        }
    } else if (c->out_framing == NW_OUT_CLOSE) {
        memcpy(v + k, pieces, (size_t)n * sizeof *v);
        k += n;
    }
    if (k == 0)
        return c->broken ? NW_IO_CLOSED : NW_IO_OK;
    return flush(c, v, k);
}

/* The file's rest, when the socket is full: the manager sends it (a dup
 * of the file and the offset reached). Only with a Content-Length, and
 * when nothing is left before it. 0, or -1. */
static int rest_file(nw_conn *c, int file_fd, off_t offset, size_t len)
{
    if (!c->cfg.offload || c->rest_fd >= 0 || c->out_framing != NW_OUT_LENGTH)
        return -1;
    c->rest_fd = fcntl(file_fd, F_DUPFD_CLOEXEC, 3);
    if (c->rest_fd < 0)
        return -1;
    c->rest_off = offset;
    c->rest_len = len;
    return 0;
}

/* sendfile what the socket takes now, leaving the rest to the manager
 * when it may; else everything, waiting. */
static int send_file_body(nw_conn *c, int file_fd, off_t offset, size_t len)
{
    if (c->cfg.offload && c->rest_fd < 0) {
        int r = nw_io_sendfile_now(c->fd, file_fd, &offset, &len);
        if (r != NW_IO_AGAIN && r != NW_IO_UNSUPPORTED)
            return r;
        if (r == NW_IO_AGAIN && rest_file(c, file_fd, offset, len) == 0)
            return NW_IO_OK;
    }
    if (nw_conn_finish_rest(c) != NW_IO_OK)
        return NW_IO_CLOSED;
    return nw_io_sendfile_all(c->fd, file_fd, offset, len, c->cfg.timeout);
}

/* The head of a file response, with MSG_MORE: the kernel holds it back
 * and sends it in one segment with the file's first bytes (sendfile right
 * after pushes both), instead of a small segment of its own. What the
 * socket does not take stays in c->out for the usual write. */
static void send_head_corked(nw_conn *c)
{
    ssize_t n = send(c->fd, c->out.data, c->out.len, MSG_MORE | MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n <= 0)
        return;
    memmove(c->out.data, c->out.data + n, c->out.len - (size_t)n);
    c->out.len -= (size_t)n;
}

int nw_conn_send_file(nw_conn *c, int file_fd, off_t offset, size_t len)
{
    if (c->out_framing == NW_OUT_LENGTH && (int64_t)len > c->out_left)
        len = (size_t)c->out_left;
    if (c->out.len > 0 && len > 0 && c->is_tcp && c->out_framing == NW_OUT_LENGTH && !c->broken)
        send_head_corked(c);
    if (c->out.len > 0) {
        struct iovec v;
        take_head(c, &v);
        if (flush(c, &v, 1) != NW_IO_OK)
            return NW_IO_CLOSED;
    }
    if (c->out_framing == NW_OUT_NONE || len == 0)
        return c->broken ? NW_IO_CLOSED : NW_IO_OK;
    if (c->out_framing == NW_OUT_CHUNKED) {
        char head[24];
        int hl = snprintf(head, sizeof head, "%zx\r\n", len);
        if (nw_conn_send_raw(c, head, (size_t)hl) != NW_IO_OK)
            return NW_IO_CLOSED;
    }
    int r = send_file_body(c, file_fd, offset, len);
    if (r != NW_IO_OK) {
        c->broken = 1;
        return r;
    }
    c->body_sent += len;
    if (c->out_framing == NW_OUT_LENGTH)
        c->out_left -= (int64_t)len;
    if (c->out_framing == NW_OUT_CHUNKED)
        return nw_conn_send_raw(c, "\r\n", 2);
    return NW_IO_OK;
}

void nw_conn_reclaim(nw_conn *c)
{
    if (c->lent && c->fd >= 0)
        nw_io_set_nonblocking(c->fd);
    c->lent = 0;
}

void nw_conn_abandon(nw_conn *c)
{
    c->broken = 1;
    c->keep_alive = 0;
}

int nw_conn_end_body(nw_conn *c)
{
    struct iovec v[2];
    int k = take_head(c, v);
    if (c->out_framing == NW_OUT_CHUNKED) {
        v[k].iov_base = (void *)"0\r\n\r\n";
        v[k++].iov_len = 5;
    }
    if (k > 0)
        flush(c, v, k);
    if (c->out_framing == NW_OUT_LENGTH && c->out_left != 0)
        c->keep_alive = 0;   /* body shorter than declared: the framing is lost */
    if (c->broken)
        c->keep_alive = 0;
    return c->keep_alive;
}

/* What goes in front of the unread bytes in a hand-off under
 * --proxy-protocol: nothing while the header has not been parsed (it is
 * still at their front), else a v2 header saying what the last one said. */
static size_t proxy_header(const nw_conn *c, char *out)
{
    if (c->proxy_pending)
        return 0;
    if (c->proxy.local)
        return nw_proxy_encode_v2(out, NULL, 0, NULL, 0);
    return nw_proxy_encode_v2(out, (const struct sockaddr *)&c->proxy.src, c->proxy.src_len,
                              (const struct sockaddr *)&c->proxy.dst, c->proxy.dst_len);
}

/* One HANDOFF frame: the connection, its deadline and unread bytes, and
 * with output, the rest of its response (a second fd). */
static int handoff(nw_conn *c, int channel, const nw_frame_output *output)
{
    nw_frame f;
    nw_msec now = nw_now_ms();
    if (c->fd < 0) {
        errno = EINVAL;
        return -1;
    }
    char prefix[sizeof(nw_frame_output) + NW_PROXY_V2_ROOM];
    size_t prefix_len = 0;
    nw_frame_init(&f, NW_FRAME_HANDOFF);
    if (output) {
        memcpy(prefix, output, sizeof *output);
        prefix_len = sizeof *output;
        f.flags |= NW_FRAME_F_OUTPUT;
    }
    if (c->cfg.proxy_protocol) {    /* the addresses travel with it (DESIGN.md) */
        prefix_len += proxy_header(c, prefix + prefix_len);
        f.flags |= NW_FRAME_F_PROXY;
    }
    /* bytes past the current request: all of them once it is finished
     * (consumed 0), the pipelined ones when its rest goes before that */
    const char *next = c->in.data ? c->in.data + c->consumed : NULL;
    size_t unread = output && !output->keep_alive ? 0 : c->in.len - c->consumed;
    size_t len = prefix_len + unread;
    f.listener = (uint16_t)c->listener;
    f.requests = c->requests;
    int finished = c->consumed == 0;    /* (the deadlines below are the next request's) */
    if (unread > 0 || (finished && c->head_deadline != 0)) {
        if (c->head_deadline == 0 || !finished) {
            c->head_started = now;
            c->head_deadline = nw_head_deadline(now, 0, c->cfg.read_timeout,
                                                c->cfg.read_timeout_max, c->cfg.min_head_rate);
        }
        f.flags |= NW_FRAME_F_HEAD_STARTED;
        f.deadline_ms = (int32_t)(c->head_deadline > now ? c->head_deadline - now : 0);
        f.ready_ms = (uint32_t)c->head_started;     /* the manager's rate counts from it */
    } else {
        nw_msec idle = finished ? c->idle_deadline : nw_deadline_in(c->cfg.keepalive_timeout);
        f.deadline_ms = (int32_t)(idle > now ? idle - now : 0);
    }
    if (len > NW_FRAME_MAX_DATA) {
        errno = EINVAL;
        return -1;
    }
    f.data_len = (uint32_t)len;
    int fds[2] = { c->fd, c->rest_fd };
    /* Counted on its way, and out of this worker's count, before it goes
     * (the manager may read it before sendmsg returns), one right after
     * the other: the connection is in one of the two counts all along
     * (narwhal_connections). Put back if it does not go. */
    volatile uint32_t *held = c->held && c->held == held_counter ? c->held : NULL;
    nw_scoreboard_queued_add(handoff_counter, 1);
    nw_conn_fd_gone(c);
    if (nw_frame_send_fds(channel, &f, prefix, prefix_len, next, fds, output ? 2 : 1) < 0) {
        int e = errno;
        if ((c->held = held))
            __atomic_add_fetch(held, 1, __ATOMIC_RELAXED);
        nw_scoreboard_queued_add(handoff_counter, -1);
        errno = e;
        return -1;
    }
    close(c->fd);
    c->fd = -1;
    return 0;
}

void nw_conn_close_fd(nw_conn *c)
{
    if (c->fd < 0)
        return;
    if (c->custody && c->custody == getpid())
        shutdown(c->fd, SHUT_RDWR);     /* the manager's copy sees the hang-up and goes */
    close(c->fd);
    c->fd = -1;
    nw_conn_fd_gone(c);
}

static int custody_frame(nw_conn *c, int channel, int pid, int release)
{
    nw_frame f;
    char data[sizeof(nw_frame_custody) + NW_PROXY_V2_ROOM];
    nw_frame_custody *rec = (nw_frame_custody *)data;
    size_t len = sizeof *rec;
    nw_frame_init(&f, NW_FRAME_CUSTODY);
    memset(rec, 0, sizeof *rec);
    rec->cookie = c->cookie;
    rec->pid = pid;
    f.listener = (uint16_t)c->listener;
    f.requests = c->requests;
    if (release) {
        f.flags = NW_FRAME_F_RELEASE;
    } else if (c->cfg.proxy_protocol) {
        len += proxy_header(c, data + len);
        f.flags = NW_FRAME_F_PROXY;
    }
    f.data_len = (uint32_t)len;
    return nw_frame_send(channel, &f, data, release ? -1 : c->fd);
}

int nw_conn_custody(nw_conn *c, int channel, int pid)
{
    if (c->custody || c->fd < 0)
        return 0;
    if (!c->cookie && !(c->cookie = nw_io_socket_cookie(c->fd)))
        return -1;
    if (custody_frame(c, channel, pid, 0) < 0)
        return -1;
    c->custody = pid;
    return 0;
}

int nw_conn_custody_release(nw_conn *c, int channel, int pid)
{
    if (!c->custody)
        return 0;
    if (custody_frame(c, channel, pid, 1) < 0)
        return -1;
    c->custody = 0;
    return 0;
}

int nw_conn_handoff(nw_conn *c, int channel)
{
    if (c->rest_fd >= 0) {     /* the rest must go with it */
        errno = EINVAL;
        return -1;
    }
    return handoff(c, channel, NULL);
}

int nw_conn_handoff_output(nw_conn *c, int channel, int keep_alive)
{
    if (c->rest_fd < 0 || c->broken) {
        errno = EINVAL;
        return -1;
    }
    nw_frame_output out = { .offset = (uint64_t)c->rest_off, .length = c->rest_len,
                            .counted = c->rest_counted, .keep_alive = keep_alive ? 1 : 0 };
    if (handoff(c, channel, &out) < 0)
        return -1;
    c->rest_counted = 0;        /* the manager gives them back now */
    rest_drop(c);
    return 0;
}

int nw_conn_handoff_waits(int err)
{
    return err == EAGAIN || err == EWOULDBLOCK || err == ETOOMANYREFS || err == ENOBUFS
           || err == ENOMEM;
}

/* Try a hand-off (output: -1 without, else its keep_alive) until it is
 * taken or wait_ms passed while the queue stayed full (or the kernel kept
 * refusing: see nw_conn_handoff_patiently). */
static int handoff_patiently(nw_conn *c, int channel, int output, int wait_ms)
{
    nw_msec until = nw_now_ms() + wait_ms;
    for (;;) {
        int r = output < 0 ? nw_conn_handoff(c, channel)
                           : nw_conn_handoff_output(c, channel, output);
        if (r == 0)
            return 0;
        int e = errno, full = e == EAGAIN || e == EWOULDBLOCK;
        if (!nw_conn_handoff_waits(e))
            return -1;
        nw_msec now = nw_now_ms();
        if (now >= until) {
            errno = e;
            return -1;
        }
        /* (room is what POLLOUT says; the others are waited out: POLLOUT
         * would say ready at once) */
        nw_msec wait = until - now;
        if (!full && wait > NW_HANDOFF_RETRY_MS)
            wait = NW_HANDOFF_RETRY_MS;
        struct pollfd p = { .fd = channel, .events = POLLOUT };
        poll(&p, full ? 1 : 0, (int)wait);
    }
}

int nw_conn_handoff_patiently(nw_conn *c, int channel, int wait_ms)
{
    return handoff_patiently(c, channel, -1, wait_ms);
}

int nw_conn_handoff_output_patiently(nw_conn *c, int channel, int keep_alive, int wait_ms)
{
    return handoff_patiently(c, channel, keep_alive ? 1 : 0, wait_ms);
}
