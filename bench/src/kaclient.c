/* kaclient: a small epoll HTTP/1.1 load client for Narwhal's benchmarks.
 *
 * N connections ("clients"), all concurrent, each sending R sequential GET
 * requests over one keep-alive connection: the next request goes out only
 * when the previous response has fully arrived (Content-Length, chunked or
 * read-until-close bodies are all parsed). Every request has a deadline
 * (--timeout, default 5 s). What wrk does not tell, this does: failed
 * requests, timeouts, and connections the server never answered at all.
 *
 * Options (see usage()):
 *   -p PORT            server port on 127.0.0.1 (required; loopback only)
 *   -c N               concurrent connections (default 100)
 *   -n R               requests per connection (default 250)
 *   -d SECONDS         run for this long instead of R requests each
 *   --max-time S       stop starting requests after S seconds (R mode)
 *   --timeout S        per-request deadline (default 5)
 *   --paths P:W,...    request paths with weights, e.g. /fast:19,/slow:1;
 *                      latency is then also reported per path
 *   --idle M           first open M idle keep-alive connections: each sends
 *                      one request, waits for the answer, then stays open
 *                      and silent while the N active connections run
 *   --idle-wait S      how long to wait for the idle connections' answers
 *                      before starting the active ones (default 5)
 *   --drain S          once -d / --max-time is over, how long requests still
 *                      in flight may take to finish (default: --timeout);
 *                      those that do not are counted as timeouts
 *
 * A connection the server closes between requests (keep-alive limit, or a
 * server that does not keep connections alive) is reopened and the request
 * sent again: counted in reconnects, not as a failure. A connection that
 * was sent a request and closed, reset or timed out without a single byte
 * of answer is counted in unanswered_conns. A connection that got less
 * than a tenth of the answers the mean connection got is counted in
 * starved_conns (a request-weighted p99 hides a few connections left waiting).
 *
 * Output: key=value lines (machine-parseable), latencies in milliseconds,
 * measured from when the request was started (including connect time when
 * a new connection was needed) to the last byte of the response.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_PATHS 16
#define MAX_HEAD 16384
#define MAX_LINE 1024

enum { ST_NEW, ST_CONNECTING, ST_WRITING, ST_READING, ST_HOLD, ST_DONE };
enum { P_HEAD, P_BODY_CL, P_BODY_EOF, P_CHUNK_SIZE, P_CHUNK_DATA, P_CHUNK_CRLF, P_TRAILER };
enum { FEED_MORE = 0, FEED_DONE = 1, FEED_ERROR = -1 };

typedef struct { double *v; size_t n, cap; } samples_t;

typedef struct {
    int fd, id, state, is_idle, registered, pending_err, conn_failed;
    unsigned events;           /* epoll mask currently registered */
    long done;                 /* requests finished (any outcome) */
    long ok;                   /* ... of which answered with 2xx/3xx */
    long limit;                /* requests to make; -1 = until stop time */
    int path;                  /* index of the current request's path */
    size_t wpos;
    double t_start, deadline;
    long sock_bytes;           /* bytes received on the current socket */
    long sock_reqs;            /* requests sent on the current socket */
    long resp_bytes;           /* bytes of the current response so far */
    int retried;               /* current request already re-sent once */
    /* response parser */
    int pstate, status, close_after;
    long long remaining;
    char *head; size_t hlen;
    char line[MAX_LINE]; size_t llen;
} conn_t;

static struct {
    const char *host; int port;
    long conns, reqs; double duration, max_time, timeout;
    long idle; double idle_wait, drain;
    int npaths; char *path[MAX_PATHS]; int weight[MAX_PATHS];
    int *seq; int seqlen;
    char *req[MAX_PATHS]; size_t reqlen[MAX_PATHS];
} opt;

static struct {
    long ok, failed, bad_status, connect_errors, timeouts, unanswered, reconnects, incomplete;
    long idle_answered, idle_failed, idle_timeouts, idle_closed, idle_unanswered;
    samples_t all, per_path[MAX_PATHS];
} st;

static int epfd;
static struct sockaddr_in addr;
static double stop_at = 0;     /* no new requests after this (0 = none) */
static long idle_pending, active_left;   /* connections not yet retired */
static volatile sig_atomic_t interrupted = 0;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void die(const char *msg) { fprintf(stderr, "kaclient: %s\n", msg); exit(2); }

static void push(samples_t *s, double v) {
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 4096;
        s->v = realloc(s->v, s->cap * sizeof(double));
        if (!s->v) die("out of memory");
    }
    s->v[s->n++] = v;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(const samples_t *s, double p) {
    if (!s->n) return 0;
    size_t i = (size_t)ceil(p * s->n);
    if (i < 1) i = 1;
    if (i > s->n) i = s->n;
    return s->v[i - 1];
}

/* ---------- options ---------- */

static void usage(void) {
    fprintf(stderr,
        "usage: kaclient -p PORT [-c N] [-n R | -d SECONDS] [--max-time S] [--timeout S]\n"
        "                [--paths /a:W,/b:W] [--idle M] [--idle-wait S] [-H HOST]\n");
    exit(2);
}

static void parse_paths(char *spec) {
    for (char *tok = strtok(spec, ","); tok; tok = strtok(NULL, ",")) {
        if (opt.npaths == MAX_PATHS) die("too many paths");
        char *colon = strrchr(tok, ':');
        int w = 1;
        if (colon) { *colon = 0; w = atoi(colon + 1); }
        if (tok[0] != '/' || w < 1) die("bad --paths entry (want /path:weight)");
        opt.path[opt.npaths] = strdup(tok);
        opt.weight[opt.npaths++] = w;
    }
}

/* Spread the weighted paths evenly over one cycle (smooth weighted round robin). */
static void build_sequence(void) {
    int total = 0, cur[MAX_PATHS] = {0};
    for (int i = 0; i < opt.npaths; i++) total += opt.weight[i];
    opt.seq = malloc(sizeof(int) * total);
    opt.seqlen = total;
    for (int k = 0; k < total; k++) {
        int best = 0;
        for (int i = 0; i < opt.npaths; i++) {
            cur[i] += opt.weight[i];
            if (cur[i] > cur[best]) best = i;
        }
        cur[best] -= total;
        opt.seq[k] = best;
    }
}

static void build_requests(void) {
    for (int i = 0; i < opt.npaths; i++) {
        char buf[2048];
        int n = snprintf(buf, sizeof buf,
                         "GET %s HTTP/1.1\r\nHost: %s:%d\r\nUser-Agent: kaclient\r\n\r\n",
                         opt.path[i], opt.host, opt.port);
        if (n <= 0 || n >= (int)sizeof buf) die("path too long");
        opt.req[i] = strdup(buf);
        opt.reqlen[i] = (size_t)n;
    }
}

static void parse_args(int argc, char **argv) {
    opt.host = "127.0.0.1"; opt.conns = 100; opt.reqs = 250;
    opt.timeout = 5; opt.idle_wait = 5; opt.drain = -1;
    char *paths = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define ARG(name) (!strcmp(a, name) && v && ++i)
        if (ARG("-p")) opt.port = atoi(v);
        else if (ARG("-H")) opt.host = v;
        else if (ARG("-c")) opt.conns = atol(v);
        else if (ARG("-n")) opt.reqs = atol(v);
        else if (ARG("-d")) opt.duration = atof(v);
        else if (ARG("--max-time")) opt.max_time = atof(v);
        else if (ARG("--timeout")) opt.timeout = atof(v);
        else if (ARG("--paths")) paths = strdup(v);
        else if (ARG("--idle")) opt.idle = atol(v);
        else if (ARG("--idle-wait")) opt.idle_wait = atof(v);
        else if (ARG("--drain")) opt.drain = atof(v);
        else usage();
#undef ARG
    }
    if (opt.port <= 0 || opt.port > 65535 || opt.conns < 0 || opt.reqs < 1 || opt.timeout <= 0)
        usage();
    if (opt.drain < 0) opt.drain = opt.timeout;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_port = htons(opt.port);
    if (inet_pton(AF_INET, opt.host, &addr.sin_addr) != 1) die("-H wants a numeric IPv4 address");
    if ((ntohl(addr.sin_addr.s_addr) >> 24) != 127) die("refusing to send traffic off loopback");
    if (paths) parse_paths(paths); else parse_paths(strdup("/"));
    build_sequence();
    build_requests();
}

static void raise_nofile(long need) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl)) return;
    if ((long)rl.rlim_cur >= need) return;
    if ((long)rl.rlim_max < need) rl.rlim_max = need;   /* works as root */
    rl.rlim_cur = need;
    if (setrlimit(RLIMIT_NOFILE, &rl)) {
        getrlimit(RLIMIT_NOFILE, &rl);
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
        fprintf(stderr, "kaclient: warning: could only raise open files to %ld (need %ld)\n",
                (long)rl.rlim_cur, need);
    }
}

/* ---------- response parser ---------- */

static void parser_reset(conn_t *c) {
    c->pstate = P_HEAD; c->status = 0; c->close_after = 0;
    c->remaining = 0; c->hlen = 0; c->llen = 0; c->resp_bytes = 0;
}

static int header_is(const char *line, size_t len, const char *name, const char **val) {
    size_t n = strlen(name);
    if (len <= n || strncasecmp(line, name, n) || line[n] != ':') return 0;
    const char *p = line + n + 1;
    while (*p == ' ' || *p == '\t') p++;
    *val = p;
    return 1;
}

static int has_token(const char *val, size_t len, const char *tok) {
    size_t n = strlen(tok);
    for (size_t i = 0; i + n <= len; i++)
        if (!strncasecmp(val + i, tok, n)) return 1;
    return 0;
}

/* The head (status line + fields, ending with CRLFCRLF) is complete in c->head. */
static int parse_head(conn_t *c) {
    char *h = c->head, *end = h + c->hlen;
    int minor;
    if (sscanf(h, "HTTP/1.%d %d", &minor, &c->status) != 2) return FEED_ERROR;
    int keepalive_10 = 0, chunked = 0;
    long long cl = -1;
    char *line = memchr(h, '\n', c->hlen) + 1;
    while (line < end) {
        char *nl = memchr(line, '\n', end - line);
        if (!nl) break;
        size_t len = nl - line;
        if (len && line[len - 1] == '\r') len--;
        const char *v;
        if (header_is(line, len, "Content-Length", &v)) cl = strtoll(v, NULL, 10);
        else if (header_is(line, len, "Transfer-Encoding", &v)) chunked = has_token(v, len - (v - line), "chunked");
        else if (header_is(line, len, "Connection", &v)) {
            size_t vl = len - (v - line);
            if (has_token(v, vl, "close")) c->close_after = 1;
            if (has_token(v, vl, "keep-alive")) keepalive_10 = 1;
        }
        line = nl + 1;
    }
    if (minor == 0 && !keepalive_10) c->close_after = 1;
    if (c->status < 200 && c->status >= 100) { c->hlen = 0; return FEED_MORE; } /* 1xx: skip */
    if (chunked) c->pstate = P_CHUNK_SIZE;
    else if (cl >= 0) { c->pstate = P_BODY_CL; c->remaining = cl; }
    else if (c->status == 204 || c->status == 304) { c->pstate = P_BODY_CL; c->remaining = 0; }
    else { c->pstate = P_BODY_EOF; c->close_after = 1; }
    return FEED_MORE;
}

/* Accumulate one CRLF-terminated line into c->line; returns bytes consumed,
 * sets *complete when the line ended. */
static size_t take_line(conn_t *c, const char *p, size_t n, int *complete, int *err) {
    const char *nl = memchr(p, '\n', n);
    size_t take = nl ? (size_t)(nl - p) + 1 : n;
    if (c->llen + take >= MAX_LINE) { *err = 1; return n; }
    memcpy(c->line + c->llen, p, take);
    c->llen += take;
    c->line[c->llen] = 0;
    *complete = nl != NULL;
    return take;
}

/* Feed received bytes; returns FEED_DONE when the response is complete. */
static int feed(conn_t *c, const char *p, size_t n) {
    while (n > 0 || (c->pstate == P_BODY_CL && c->remaining == 0)) {
        switch (c->pstate) {
        case P_HEAD: {
            size_t room = MAX_HEAD - c->hlen;
            size_t take = n < room ? n : room;
            size_t from = c->hlen > 3 ? c->hlen - 3 : 0;
            memcpy(c->head + c->hlen, p, take);
            c->hlen += take;
            char *e = memmem(c->head + from, c->hlen - from, "\r\n\r\n", 4);
            if (!e) {
                if (c->hlen == MAX_HEAD) return FEED_ERROR;
                return FEED_MORE;
            }
            size_t head_len = (e - c->head) + 4;
            size_t used = take - (c->hlen - head_len);
            c->hlen = head_len;
            p += used; n -= used;
            if (parse_head(c) == FEED_ERROR) return FEED_ERROR;
            break;
        }
        case P_BODY_CL: {
            size_t take = (long long)n < c->remaining ? n : (size_t)c->remaining;
            c->remaining -= take; p += take; n -= take;
            if (c->remaining == 0) return n ? FEED_ERROR : FEED_DONE;
            break;
        }
        case P_BODY_EOF:
            return FEED_MORE;                       /* ends at EOF */
        case P_CHUNK_SIZE: case P_CHUNK_CRLF: case P_TRAILER: {
            int complete = 0, err = 0;
            size_t used = take_line(c, p, n, &complete, &err);
            if (err) return FEED_ERROR;
            p += used; n -= used;
            if (!complete) return FEED_MORE;
            int empty = c->line[0] == '\n' || (c->line[0] == '\r' && c->line[1] == '\n');
            c->llen = 0;
            if (c->pstate == P_CHUNK_SIZE) {
                char *endp;
                long long sz = strtoll(c->line, &endp, 16);
                if (endp == c->line || sz < 0) return FEED_ERROR;
                if (sz == 0) c->pstate = P_TRAILER;
                else { c->remaining = sz; c->pstate = P_CHUNK_DATA; }
            } else if (c->pstate == P_CHUNK_CRLF) {
                if (!empty) return FEED_ERROR;
                c->pstate = P_CHUNK_SIZE;
            } else if (empty) {
                return n ? FEED_ERROR : FEED_DONE;   /* end of trailers */
            }
            break;
        }
        case P_CHUNK_DATA: {
            size_t take = (long long)n < c->remaining ? n : (size_t)c->remaining;
            c->remaining -= take; p += take; n -= take;
            if (c->remaining == 0) c->pstate = P_CHUNK_CRLF;
            break;
        }
        }
    }
    return FEED_MORE;
}

/* ---------- connections ---------- */

static void ep_set(conn_t *c, unsigned events) {
    if (c->registered && c->events == events) return;
    struct epoll_event ev = { .events = events, .data.ptr = c };
    c->events = events;
    if (epoll_ctl(epfd, c->registered ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, c->fd, &ev))
        die("epoll_ctl");
    c->registered = 1;
}

/* A socket closed without a byte of answer, after the request went out or
 * while the connect was still pending (a full listen queue drops SYNs), is a
 * connection the server never answered. A refused connect is not: that is
 * counted in connect_errors. */
static void close_sock(conn_t *c) {
    if (c->fd < 0) return;
    if (c->sock_bytes == 0 && !c->conn_failed && (c->sock_reqs > 0 || c->state == ST_CONNECTING))
        st.unanswered++;
    close(c->fd);                  /* also removes it from epoll */
    c->fd = -1; c->registered = 0;
}

static void send_current(conn_t *c);

static void open_sock(conn_t *c) {
    c->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c->fd < 0) die("socket() failed (raise ulimit -n?)");
    int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    c->sock_bytes = 0; c->sock_reqs = 0; c->pending_err = 0; c->conn_failed = 0;
    /* the outcome, even an immediate refusal, is handled from the event loop */
    if (connect(c->fd, (struct sockaddr *)&addr, sizeof addr) && errno != EINPROGRESS)
        c->pending_err = errno;
    c->state = ST_CONNECTING;
    ep_set(c, EPOLLOUT);
}

static int want_more(conn_t *c) {
    if (interrupted) return 0;
    if (c->is_idle) return c->done < 1;
    if (stop_at && now() >= stop_at) return 0;
    return c->limit < 0 || c->done < c->limit;
}

/* Begin the next request of this connection, or retire it. */
static void next_request(conn_t *c) {
    if (!want_more(c)) {
        if (c->is_idle) idle_pending--; else active_left--;
        if (c->is_idle && c->fd >= 0) { c->state = ST_HOLD; ep_set(c, EPOLLIN | EPOLLRDHUP); return; }
        close_sock(c);
        c->state = ST_DONE;
        return;
    }
    c->path = opt.seq[(c->done + (long)c->id * 7) % opt.seqlen];
    c->t_start = now();
    c->deadline = c->t_start + (c->is_idle ? opt.idle_wait : opt.timeout);
    c->retried = 0;
    send_current(c);
}

static void on_writable(conn_t *c);

static void send_current(conn_t *c) {
    parser_reset(c);
    c->wpos = 0;
    if (c->fd < 0) { open_sock(c); return; }
    c->state = ST_WRITING;
    on_writable(c);                 /* write at once; epoll only if it blocks */
}

/* One request is over: record it and move on. outcome: 1 ok, 0 failed, 2 timeout */
static void finish(conn_t *c, int outcome) {
    double lat = now() - c->t_start;
    c->done++;
    if (c->is_idle) {
        if (outcome == 1 && c->close_after) st.idle_closed++;   /* not kept alive */
        if (outcome == 1) st.idle_answered++;
        else if (outcome == 2) st.idle_timeouts++;
        else st.idle_failed++;
    } else if (outcome == 1 && c->status >= 200 && c->status < 400) {
        st.ok++;
        c->ok++;
        push(&st.all, lat * 1000);
        push(&st.per_path[c->path], lat * 1000);
    } else if (outcome == 1) {
        st.failed++; st.bad_status++;
    } else if (outcome == 2) {
        st.timeouts++;
    } else {
        st.failed++;
    }
    if (outcome != 1 || c->close_after) close_sock(c);
    next_request(c);
}

/* The socket broke (EOF, reset, connect error) while a request was pending. */
static void broken(conn_t *c, int connect_failed) {
    int nothing_yet = c->resp_bytes == 0;
    int reused = c->sock_reqs > 1;
    if (c->pstate == P_BODY_EOF) {               /* body delimited by close: done */
        c->close_after = 1;
        finish(c, 1);
        return;
    }
    if (nothing_yet && reused && !connect_failed && !c->retried) {
        /* keep-alive race: the server closed an idle connection; send again */
        close(c->fd); c->fd = -1; c->registered = 0;
        st.reconnects++;
        c->retried = 1;
        send_current(c);
        return;
    }
    if (connect_failed) { st.connect_errors++; c->conn_failed = 1; }
    finish(c, 0);
}

static void on_writable(conn_t *c) {
    if (c->state == ST_CONNECTING) {
        int err = 0; socklen_t len = sizeof err;
        getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err || c->pending_err) { broken(c, 1); return; }
        c->state = ST_WRITING;
    }
    const char *req = opt.req[c->path];
    size_t len = opt.reqlen[c->path];
    while (c->wpos < len) {
        ssize_t w = send(c->fd, req + c->wpos, len - c->wpos, MSG_NOSIGNAL);
        if (w < 0 && errno == EAGAIN) { ep_set(c, EPOLLOUT); return; }
        if (w <= 0) { broken(c, 0); return; }
        if (c->wpos == 0) c->sock_reqs++;
        c->wpos += w;
    }
    c->state = ST_READING;
    ep_set(c, EPOLLIN | EPOLLRDHUP);
}

static char rbuf[1 << 18];

static void on_readable(conn_t *c) {
    for (;;) {
        ssize_t r = recv(c->fd, rbuf, sizeof rbuf, 0);
        if (r < 0 && errno == EAGAIN) return;
        if (r <= 0) {
            if (c->state == ST_HOLD) {          /* server closed an idle connection */
                st.idle_closed++;
                close_sock(c); c->state = ST_DONE;
            } else {
                broken(c, 0);
            }
            return;
        }
        c->sock_bytes += r;
        if (c->state == ST_HOLD) continue;       /* unexpected bytes: ignore */
        c->resp_bytes += r;
        int f = feed(c, rbuf, (size_t)r);
        if (f == FEED_ERROR) { c->close_after = 1; finish(c, 0); return; }
        if (f == FEED_DONE) { finish(c, 1); return; }
    }
}

static void check_deadlines(conn_t *cs, long n, double t) {
    int draining = stop_at && t >= stop_at + opt.drain;
    for (long i = 0; i < n; i++) {
        conn_t *c = &cs[i];
        if (c->state != ST_CONNECTING && c->state != ST_WRITING && c->state != ST_READING) continue;
        if (t < c->deadline && !(draining && !c->is_idle)) continue;
        if (c->is_idle) {
            /* idle connections stay open and waiting: count once, keep the
             * server's backlog as a real crowd of idle clients would */
            if (c->deadline > 0) { st.idle_timeouts++; c->deadline = 1e300; }
            continue;
        }
        finish(c, 2);
    }
}

/* Run until *left reaches 0 (or until the time `until`, if given). */
static void run_loop(conn_t *cs, long total, long *left, double until) {
    struct epoll_event evs[1024];
    double last_check = 0;
    while (!interrupted && *left > 0) {
        double t = now();
        if (until && t >= until) break;
        if (t - last_check >= 0.02) {
            check_deadlines(cs, total, t);
            last_check = t;
        }
        int n = epoll_wait(epfd, evs, 1024, 20);
        if (n < 0 && errno != EINTR) die("epoll_wait");
        for (int i = 0; i < n; i++) {
            conn_t *c = evs[i].data.ptr;
            if (c->fd < 0) continue;
            if (c->state == ST_CONNECTING || c->state == ST_WRITING) {
                if (evs[i].events & (EPOLLERR | EPOLLHUP) && c->state == ST_CONNECTING) broken(c, 1);
                else on_writable(c);
            } else if (c->state == ST_READING || c->state == ST_HOLD) {
                on_readable(c);
            }
        }
    }
}

static void on_signal(int sig) { (void)sig; interrupted = 1; }

static int cmp_long(const void *a, const void *b) {
    long x = *(const long *)a, y = *(const long *)b;
    return x < y ? -1 : x > y;
}

/* Fairness among the active connections: a request-weighted p99 does not
 * show a few connections left waiting while the others are served, this
 * does. Starved: answered less than a tenth of the mean (not the median:
 * when most connections wait, the median connection is a starved one). */
static void print_fairness(conn_t *cs, long from, long to) {
    long n = to - from;
    if (n <= 0) return;
    long *v = malloc(sizeof(long) * n);
    double sum = 0;
    for (long i = 0; i < n; i++) { v[i] = cs[from + i].ok; sum += v[i]; }
    qsort(v, n, sizeof(long), cmp_long);
    double mean = sum / n;
    long starved = 0;
    for (long i = 0; i < n; i++) if (v[i] * 10.0 < mean) starved++;
    printf("conn_ok_min=%ld\nconn_ok_mean=%.1f\nconn_ok_max=%ld\nstarved_conns=%ld\n",
           v[0], mean, v[n - 1], starved);
    free(v);
}

static void print_stats(const char *prefix, samples_t *s) {
    qsort(s->v, s->n, sizeof(double), cmp_double);
    double sum = 0;
    for (size_t i = 0; i < s->n; i++) sum += s->v[i];
    printf("%scount=%zu\n", prefix, s->n);
    printf("%smin_ms=%.3f\n", prefix, s->n ? s->v[0] : 0);
    printf("%savg_ms=%.3f\n", prefix, s->n ? sum / s->n : 0);
    printf("%sp50_ms=%.3f\n", prefix, pct(s, 0.50));
    printf("%sp90_ms=%.3f\n", prefix, pct(s, 0.90));
    printf("%sp99_ms=%.3f\n", prefix, pct(s, 0.99));
    printf("%smax_ms=%.3f\n", prefix, s->n ? s->v[s->n - 1] : 0);
}

int main(int argc, char **argv) {
    parse_args(argc, argv);
    signal(SIGPIPE, SIG_IGN);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    long total = opt.idle + opt.conns;
    raise_nofile(total + 64);
    epfd = epoll_create1(EPOLL_CLOEXEC);
    conn_t *cs = calloc(total, sizeof(conn_t));
    if (!cs) die("out of memory");
    for (long i = 0; i < total; i++) {
        cs[i].fd = -1; cs[i].id = (int)i; cs[i].state = ST_NEW;
        cs[i].is_idle = i < opt.idle;
        cs[i].limit = opt.duration > 0 ? -1 : opt.reqs;
        cs[i].head = malloc(MAX_HEAD);
        if (!cs[i].head) die("out of memory");
    }

    /* phase 1: the idle crowd */
    double t_idle = now();
    if (opt.idle > 0) {
        idle_pending = opt.idle;
        for (long i = 0; i < opt.idle; i++) next_request(&cs[i]);
        run_loop(cs, total, &idle_pending, t_idle + opt.idle_wait);
    }
    double idle_setup = now() - t_idle;
    long idle_answered_before = st.idle_answered;

    /* phase 2: the active connections */
    double t0 = now();
    if (opt.duration > 0) stop_at = t0 + opt.duration;
    else if (opt.max_time > 0) stop_at = t0 + opt.max_time;
    active_left = opt.conns;
    for (long i = opt.idle; i < total; i++) next_request(&cs[i]);
    run_loop(cs, total, &active_left, 0);
    double elapsed = now() - t0;

    /* what was never even started (max-time, interrupt) */
    if (opt.duration <= 0)
        for (long i = opt.idle; i < total; i++) st.incomplete += cs[i].limit - cs[i].done;

    printf("connections=%ld\n", opt.conns);
    printf("requests_per_conn=%ld\n", opt.duration > 0 ? -1 : opt.reqs);
    printf("total_time_s=%.3f\n", elapsed);
    printf("ok=%ld\n", st.ok);
    printf("failed=%ld\n", st.failed);
    printf("bad_status=%ld\n", st.bad_status);
    printf("connect_errors=%ld\n", st.connect_errors);
    printf("timeouts=%ld\n", st.timeouts);
    printf("reconnects=%ld\n", st.reconnects);
    printf("incomplete=%ld\n", st.incomplete);
    printf("rps=%.1f\n", elapsed > 0 ? st.ok / elapsed : 0);
    print_stats("lat_", &st.all);
    print_fairness(cs, opt.idle, total);
    if (opt.npaths > 1)
        for (int i = 0; i < opt.npaths; i++) {
            char prefix[300];
            snprintf(prefix, sizeof prefix, "path.%s.", opt.path[i]);
            print_stats(prefix, &st.per_path[i]);
        }
    if (opt.idle > 0) {
        long still_waiting = 0;
        for (long i = 0; i < opt.idle; i++)
            if (cs[i].fd >= 0 && cs[i].done == 0) {
                still_waiting++;
                if (cs[i].sock_bytes == 0) st.idle_unanswered++;
            }
        printf("idle_conns=%ld\n", opt.idle);
        printf("idle_setup_s=%.3f\n", idle_setup);
        printf("idle_answered_in_setup=%ld\n", idle_answered_before);
        printf("idle_answered=%ld\n", st.idle_answered);
        printf("idle_failed=%ld\n", st.idle_failed);
        printf("idle_timeouts=%ld\n", st.idle_timeouts);
        printf("idle_still_waiting=%ld\n", still_waiting);
        printf("idle_unanswered=%ld\n", st.idle_unanswered);
        printf("idle_closed_by_server=%ld\n", st.idle_closed);
    }
    /* every socket still open now: those never answered count too */
    for (long i = 0; i < total; i++) close_sock(&cs[i]);
    printf("unanswered_conns=%ld\n", st.unanswered);
    return interrupted ? 130 : 0;
}
