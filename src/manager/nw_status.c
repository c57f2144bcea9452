/* The status pages (see nw_status.h). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "nw_status.h"
#include "nw_procfs.h"
#include "nw_response.h"

#include <sys/socket.h>
#include <stdlib.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static const char *const state_names[] = { "free", "starting", "idle", "busy", "stopping" };
static const char *const restart_names[NW_RESTART_REASONS] = {
    "max-requests", "crash", "watchdog", "memory", "signal", "lifetime", "exit" };

/* One worker as the pages show it. */
typedef struct {
    int pid, state, generation, slot, accepts;
    uint64_t served, rss, parked, bytes, duration_us, last_end_us;
    double running_s, age_s;
    double cpu_s;                       /* -1: /proc could not say */
    double rps, mean_s, last_s;         /* rates (nw_status_rates); -1: no request yet */
    char request[NW_SCOREBOARD_REQUEST + 1];
    char client[NW_SCOREBOARD_PEER];    /* "" when unknown */
} worker_row;

typedef nw_status_total_rate total_rates;

/* ------------------------------------------------------------ buffers */

static int put(nw_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int put(nw_buf *b, const char *fmt, ...)
{
    for (int tries = 0; tries < 2; tries++) {
        va_list ap;
        va_start(ap, fmt);
        size_t room = b->cap - b->len;
        int n = vsnprintf(b->data ? b->data + b->len : NULL, room, fmt, ap);
        va_end(ap);
        if (n < 0)
            return -1;
        if ((size_t)n < room) {
            b->len += (size_t)n;
            return 0;
        }
        if (nw_buf_reserve(b, (size_t)n + 1) < 0)
            return -1;
    }
    return -1;
}

static int put_html(nw_buf *b, const char *s)
{
    for (; *s; s++) {
        int r;
        switch (*s) {
        case '<': r = put(b, "&lt;"); break;
        case '>': r = put(b, "&gt;"); break;
        case '&': r = put(b, "&amp;"); break;
        case '"': r = put(b, "&quot;"); break;
        default:
            r = (unsigned char)*s < 0x20 ? put(b, "?") : nw_buf_append(b, s, 1);
        }
        if (r < 0)
            return -1;
    }
    return 0;
}

static int put_json_string(nw_buf *b, const char *s)
{
    if (nw_buf_append(b, "\"", 1) < 0)
        return -1;
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        int r;
        if (c == '"' || c == '\\')
            r = put(b, "\\%c", c);
        else if (c < 0x20 || c >= 0x7f)
            r = put(b, "\\u%04x", c);     /* bytes, not UTF-8: each one shown as itself */
        else
            r = nw_buf_append(b, s, 1);
        if (r < 0)
            return -1;
    }
    return nw_buf_append(b, "\"", 1);
}

/* A label value of the text format: '"', '\\' and newlines escaped. */
static int put_label(nw_buf *b, const char *s)
{
    int r = 0;
    for (; *s && !r; s++)
        r = *s == '"' || *s == '\\' ? put(b, "\\%c", *s)
          : *s == '\n'             ? put(b, "\\n")
          :                          nw_buf_append(b, s, 1);
    return r;
}

/* ------------------------------------------------------------ reading */

static void read_client(const nw_score_slot *s, char *out, size_t cap)
{
    struct sockaddr_in6 sa;
    uint32_t len = s->client_len;
    out[0] = 0;
    if (len < sizeof sa.sin6_family || len > sizeof sa)
        return;
    memcpy(&sa, &s->client, len);
    if (sa.sin6_family == AF_UNIX)
        snprintf(out, cap, "unix socket");
    else
        nw_format_address((const struct sockaddr *)&sa, len, out, cap);
}

static int read_row(const nw_score_slot *s, worker_row *w, uint64_t now_us)
{
    w->pid = s->pid;
    w->state = s->state;
    if (!w->pid || w->state <= NW_WORKER_FREE || w->state > NW_WORKER_STOPPING)
        return 0;
    w->generation = s->generation;
    w->accepts = !s->standby;
    w->served = s->counts.served;
    w->parked = s->parked;
    uint32_t len = s->request_len < NW_SCOREBOARD_REQUEST ? s->request_len : NW_SCOREBOARD_REQUEST;
    memcpy(w->request, s->request, len);
    w->request[len] = 0;
    uint64_t since = s->since_us;
    w->running_s = w->state == NW_WORKER_BUSY && now_us > since ? (double)(now_us - since) / 1e6 : 0;
    uint64_t born_us = (uint64_t)s->born * 1000;
    w->age_s = now_us > born_us ? (double)(now_us - born_us) / 1e6 : 0;
    w->bytes = s->counts.bytes_sent;
    w->duration_us = s->counts.duration_us;
    w->last_end_us = s->last_end_us;
    w->last_s = w->last_end_us ? (double)s->last_us / 1e6 : -1;
    read_client(s, w->client, sizeof w->client);
    if (nw_procfs_stat(w->pid, &w->cpu_s, &w->rss, NULL) < 0) {
        w->cpu_s = -1;
        w->rss = 0;
    }
    return 1;
}

/* Every worker on the board; *n gets the count. The caller frees. */
static worker_row *read_rows(const nw_scoreboard *b, size_t *n, uint64_t now_us)
{
    worker_row *rows = calloc(b->h.nslots ? b->h.nslots : 1, sizeof *rows);
    *n = 0;
    if (!rows)
        return NULL;
    for (uint32_t i = 0; i < b->h.nslots; i++)
        if (b->slot[i].pid && read_row(&b->slot[i], &rows[*n], now_us)) {
            rows[*n].slot = (int)i;
            (*n)++;
        }
    return rows;
}

/* Every open client connection is in one state, and only one:
 * narwhal_connections, the connections table and /status.json say the
 * same. What the manager holds comes from its lists; the rest from the
 * board, read in one consistent pass (nw_scoreboard_connections): frames
 * on the serve queue (queued, with the manager's own queue, since both
 * wait for a worker), frames on the handoff queue (handoff), connections
 * parked in workers (parked) and the rest of what workers hold (worker:
 * being served, or in a worker's hands between requests). Counted by the
 * descriptors held, not by the workers' states: a busy worker stands for
 * one connection, and 12 keep-alive clients of 4 workers read "worker 4"
 * and nothing else while 8 of them had a request on the serve queue. Not
 * counted: connections the kernel holds in a listen queue, accepted by
 * nobody yet (narwhal_listen_queue_length). */
enum { CS_IDLE, CS_READING, CS_QUEUED, CS_WRITING, CS_CLOSING, CS_HANDOFF, CS_PARKED, CS_WORKER,
       CS_STATES, CS_TOTAL = CS_STATES };
static const char *const conn_state_names[CS_STATES + 1] = {
    "idle", "reading", "queued", "writing", "closing", "handoff", "parked", "worker", "total" };

/* The count in each state, and at CS_TOTAL their sum. */
static void conn_states(const nw_status_manager *m, uint64_t c[CS_STATES + 1])
{
    c[CS_IDLE] = m->held_idle;
    c[CS_READING] = m->held_reading;
    c[CS_QUEUED] = m->held_queued + m->board.serve_queued;
    c[CS_WRITING] = m->held_writing;
    c[CS_CLOSING] = m->held_closing;
    c[CS_HANDOFF] = m->board.handoff_queued;
    c[CS_PARKED] = m->board.parked;
    c[CS_WORKER] = m->board.in_workers;
    c[CS_TOTAL] = 0;
    for (int i = 0; i < CS_STATES; i++)
        c[CS_TOTAL] += c[i];
}

static void count_states(const worker_row *rows, size_t n, uint64_t by_state[5])
{
    memset(by_state, 0, 5 * sizeof *by_state);
    for (size_t i = 0; i < n; i++)
        by_state[rows[i].state]++;
}

/* ------------------------------------------------------------ rates */

/* The rows' rates (nw_status_rates.c), through its view of a worker. */
static void rates_apply(nw_status_rates *rates, worker_row *rows, size_t n,
                        const nw_score_counts *t, uint64_t now_us, double uptime_s,
                        total_rates *out)
{
    nw_status_worker_rate *w = calloc(n ? n : 1, sizeof *w);
    if (!w) {
        *out = (total_rates){ -1, -1, -1, 0 };
        return;
    }
    for (size_t i = 0; i < n; i++)
        w[i] = (nw_status_worker_rate){ rows[i].slot, rows[i].pid, rows[i].served,
                                        rows[i].duration_us, rows[i].last_end_us,
                                        rows[i].age_s, rows[i].last_s, 0, 0 };
    nw_status_rates_apply(rates, w, n, t, now_us, uptime_s, out);
    for (size_t i = 0; i < n; i++) {
        rows[i].rps = w[i].rps;
        rows[i].mean_s = w[i].mean_s;
    }
    free(w);
}

/* ------------------------------------------------------------ routes */

int nw_status_route(const char *head, size_t len, int *head_only)
{
    const char *sp = memchr(head, ' ', len);
    *head_only = 0;
    if (!sp)
        return NW_STATUS_NOT_FOUND;
    size_t mlen = (size_t)(sp - head);
    if (mlen == 4 && !memcmp(head, "HEAD", 4))
        *head_only = 1;
    else if (!(mlen == 3 && !memcmp(head, "GET", 3)))
        return NW_STATUS_BAD_METHOD;
    const char *path = sp + 1, *end = head + len;
    size_t plen = 0;
    while (path + plen < end && path[plen] != ' ' && path[plen] != '?' && path[plen] != '\r')
        plen++;
    static const struct { const char *path; int page; } routes[] = {
        { "/metrics", NW_STATUS_METRICS }, { "/status", NW_STATUS_HTML },
        { "/status.json", NW_STATUS_JSON }, { "/health", NW_STATUS_HEALTH },
        { "/", NW_STATUS_HTML },
    };
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++)
        if (strlen(routes[i].path) == plen && !memcmp(routes[i].path, path, plen))
            return routes[i].page;
    return NW_STATUS_NOT_FOUND;
}

/* ------------------------------------------------------------ shared */

/* Names of counts: label values of /metrics, keys of /status.json, headings of
 * /status. */
static const char *const class_names[NW_SCORE_CLASSES] = { "1xx", "2xx", "3xx", "4xx", "5xx" };
static const char *const pool_reasons[NW_POOL_CHANGES] = { "grow_waited", "grow_stuck",
                                                           "shrink_idle" };
static const char *const proxy_reasons[NW_PROXY_REJECTS] = { "bad_header", "not_allowed" };
static const char *const waiting_where[] = { "manager", "serve_queue" };
static const char *const refused_reasons[] = { "serve_queue", "handoff", "full", "memory" };
static const char *const handoff_directions[] = { "to_manager", "to_worker", "worker_to_worker" };
static const char *const failure_kinds[] = { "spool", "fd_limit", "manager_restart" };

#define COUNT_OF(a) (sizeof (a) / sizeof *(a))

/* What the pages show besides the rows, read once per render. */
typedef struct {
    const nw_scoreboard *b;
    const nw_status_manager *m;
    const worker_row *rows;
    size_t n;
    nw_score_counts t;                  /* (nw_scoreboard_totals) */
    uint64_t by_state[5];
    uint64_t conns[CS_STATES + 1];      /* (conn_states) */
    uint64_t waiting[COUNT_OF(waiting_where)];
    uint64_t refused[COUNT_OF(refused_reasons)];
    uint64_t handoffs[COUNT_OF(handoff_directions)];
    int64_t offload_bytes, now_unix;
    char version[sizeof ((nw_score_header *)0)->version + 1],
         perl[sizeof ((nw_score_header *)0)->perl_version + 1];
    total_rates rates;                  /* /status and /status.json only */
    char host[256];
    uint64_t accepting;                 /* /metrics only */
    uint64_t failures[COUNT_OF(failure_kinds)];
    int64_t up;
    nw_procfs_numbers p;                /* the master's */
} page_view;

static void view_metrics(page_view *v)
{
    const nw_status_manager *m = v->m;
    for (size_t i = 0; i < v->n; i++)
        v->accepting += v->rows[i].accepts && v->rows[i].state != NW_WORKER_STOPPING;
    memcpy(v->failures, (uint64_t[]){ v->t.spool_failed, v->t.fd_limit, v->b->h.manager_restarts },
           sizeof v->failures);
    v->up = !(v->b->h.stopping || m->stopping);
    nw_procfs_read(v->b->h.master_pid, &v->p);
    if (!(v->p.start_unix > 0))
        v->p.start_unix = (double)v->b->h.started_unix;
}

static void view_read(page_view *v, int page, const nw_scoreboard *b, const nw_status_manager *m,
                      nw_status_rates *rates, worker_row *rows, size_t n, uint64_t now_us,
                      int64_t now_unix)
{
    *v = (page_view){ .b = b, .m = m, .rows = rows, .n = n, .now_unix = now_unix,
                      .waiting = { m->held_queued, m->board.serve_queued },
                      .offload_bytes = m->offload_bytes > 0 ? m->offload_bytes : 0 };
    nw_scoreboard_totals(b, &v->t);
    for (int i = 0; i < NW_PROXY_REJECTS; i++)
        v->t.proxy_rejected[i] += m->proxy_rejected[i];
    memcpy(v->refused, (uint64_t[]){ m->refused[NW_REFUSED_SERVE_QUEUE], v->t.handoff_refused,
                                     m->refused[NW_REFUSED_FULL], m->refused[NW_REFUSED_MEMORY] },
           sizeof v->refused);
    memcpy(v->handoffs, (uint64_t[]){ m->handoffs_in, m->handoffs_out, v->t.adopted },
           sizeof v->handoffs);
    count_states(rows, n, v->by_state);
    conn_states(m, v->conns);
    memcpy(v->version, b->h.version, sizeof b->h.version);
    memcpy(v->perl, b->h.perl_version, sizeof b->h.perl_version);
    if (page == NW_STATUS_METRICS) {
        view_metrics(v);
        return;
    }
    rates_apply(rates, rows, n, &v->t, now_us, (double)(now_unix - b->h.started_unix), &v->rates);
    if (gethostname(v->host, sizeof v->host - 1) != 0)
        strcpy(v->host, "?");
}

/* Complete requests waiting for a worker that the manager can see. */
static uint64_t requests_waiting(const page_view *v)
{
    return v->waiting[0] + v->waiting[1];
}

/* ------------------------------------------------------------ metrics */

/* A family of /metrics: its values are read at offset `at` of the view,
 * the manager's record or the board's header, one for each value of its
 * label (or one, with no label), unless it writes its series itself. A
 * family of doubles whose value is negative (not known) is left out. */
enum { FROM_VIEW, FROM_MANAGER, FROM_HEADER };
enum { AS_U64, AS_I64, AS_I32, AS_F2, AS_F0 };  /* %llu, %lld, %d, %.2f, %.0f */
typedef struct metric_family metric_family;
struct metric_family {
    const char *name, *type, *help;
    int (*series)(nw_buf *o, const metric_family *f, const page_view *v);
    unsigned char from, as;
    size_t at, sum;                 /* (a histogram: its buckets and its sum, in the view) */
    const char *label;
    const char *const *values;
    size_t n;
};

static const volatile char *family_values(const metric_family *f, const page_view *v)
{
    const volatile char *base = f->from == FROM_MANAGER ? (const volatile char *)v->m
                              : f->from == FROM_HEADER  ? (const volatile char *)&v->b->h
                              :                           (const volatile char *)v;
    return base + f->at;
}

static int put_value(nw_buf *o, int as, const volatile char *p, size_t i)
{
    switch (as) {
    case AS_I64: return put(o, "%lld", (long long)((const volatile int64_t *)p)[i]);
    case AS_I32: return put(o, "%d", (int)((const volatile int32_t *)p)[i]);
    case AS_F2:  return put(o, "%.2f", ((const volatile double *)p)[i]);
    case AS_F0:  return put(o, "%.0f", ((const volatile double *)p)[i]);
    default:     return put(o, "%llu", (unsigned long long)((const volatile uint64_t *)p)[i]);
    }
}

static int fixed_series(nw_buf *o, const metric_family *f, const page_view *v)
{
    int r = 0;
    for (size_t i = 0; i < (f->label ? f->n : 1); i++) {
        r |= f->label ? put(o, "%s{%s=\"%s\"} ", f->name, f->label, f->values[i])
                      : put(o, "%s ", f->name);
        r |= put_value(o, f->as, family_values(f, v), i);
        r |= put(o, "\n");
    }
    return r;
}

/* A histogram in seconds from counts per bucket (nw_score_bounds_us). */
static int histogram(nw_buf *o, const metric_family *f, const page_view *v)
{
    const uint64_t *bucket = (const uint64_t *)((const char *)v + f->at);
    uint64_t sum_us = *(const uint64_t *)((const char *)v + f->sum), cumulative = 0;
    int r = 0;
    for (int i = 0; i < NW_SCORE_BUCKETS; i++) {
        cumulative += bucket[i];
        if (i < NW_SCORE_BUCKETS - 1)
            r |= put(o, "%s_bucket{le=\"%g\"} %llu\n", f->name,
                     (double)nw_score_bounds_us[i] / 1e6, (unsigned long long)cumulative);
        else
            r |= put(o, "%s_bucket{le=\"+Inf\"} %llu\n", f->name, (unsigned long long)cumulative);
    }
    r |= put(o, "%s_sum %.6f\n", f->name, (double)sum_us / 1e6);
    return r | put(o, "%s_count %llu\n", f->name, (unsigned long long)cumulative);
}

/* By scoreboard slot, not pid: a replaced worker's successor takes the
 * lowest free slot, so the series stay (about --max-workers of them)
 * while the workers come and go. */
static int slot_series(nw_buf *o, const metric_family *f, const page_view *v)
{
    int r = 0;
    for (size_t i = 0; i < v->n; i++)
        r |= put(o, "%s{slot=\"%d\"} %llu\n", f->name, v->rows[i].slot,
                 (unsigned long long)v->rows[i].rss);
    return r;
}

/* The field at `at` of each listener whose queue could be read. */
static int listener_series(nw_buf *o, const metric_family *f, const page_view *v)
{
    int r = 0;
    for (const nw_status_listener *l = v->m->listener; l < v->m->listener + v->m->nlisteners; l++)
        if (l->known)
            r |= put(o, "%s{listener=\"%s\"} %u\n", f->name, l->address,
                     *(const uint32_t *)((const char *)l + f->at));
    return r;
}

static int build_series(nw_buf *o, const metric_family *f, const page_view *v)
{
    int r = put(o, "%s{version=\"", f->name);
    r |= put_label(o, v->version[0] ? v->version : "unknown");
    r |= put(o, "\",perl=\"");
    r |= put_label(o, v->perl[0] ? v->perl : "unknown");
    return r | put(o, "\"} 1\n");
}

/* The TLS families have series only with a TLS listener. */
static const char *const tls_handshake_kinds[] = { "full", "resumed" };
static const char *const tls_states[] = { "handshake", "relaying", "closing" };

static int tls_counts(nw_buf *o, const metric_family *f, const page_view *v,
                      const char *label, const char *const *names, const uint64_t *counts, size_t n)
{
    int r = 0;
    for (size_t i = 0; v->m->tls_reasons && i < n; i++)
        r |= put(o, "%s{%s=\"%s\"} %llu\n", f->name, label, names[i],
                 (unsigned long long)counts[i]);
    return r;
}

static int tls_handshake_series(nw_buf *o, const metric_family *f, const page_view *v)
{
    return tls_counts(o, f, v, "kind", tls_handshake_kinds, v->m->tls_handshakes,
                      COUNT_OF(tls_handshake_kinds));
}

static int tls_open_series(nw_buf *o, const metric_family *f, const page_view *v)
{
    return tls_counts(o, f, v, "state", tls_states, v->m->tls_open, COUNT_OF(tls_states));
}

/* One series for each reason the TLS part names (none without a TLS
 * listener). */
static int tls_series(nw_buf *o, const metric_family *f, const page_view *v)
{
    int r = 0;
    for (int i = 0; i < v->m->tls_reasons; i++) {
        r |= put(o, "%s{reason=\"", f->name);
        r |= put_label(o, v->m->tls_reason[i]);
        r |= put(o, "\"} %llu\n", (unsigned long long)v->m->tls_refused[i]);
    }
    return r;
}

#define VIEW(f)    .from = FROM_VIEW, .at = offsetof(page_view, f)
#define MANAGER(f) .from = FROM_MANAGER, .at = offsetof(nw_status_manager, f)
#define HEADER(f)  .from = FROM_HEADER, .at = offsetof(nw_score_header, f)
#define LABEL(name, list) .label = name, .values = list, .n = COUNT_OF(list)
#define HISTOGRAM(b, s) .series = histogram, VIEW(t.b), .sum = offsetof(page_view, t.s)

/* /metrics, in this order. The process_* families are the standard ones,
 * of the master (the process that owns the server: its pid is in the
 * scoreboard). */
static const metric_family families[] = {
    { "narwhal_requests_total", "counter", "Requests answered by the workers, by status class.",
      VIEW(t.by_class), LABEL("class", class_names) },
    { "narwhal_request_duration_seconds", "histogram",
      "Time from a complete request to the end of its response.", HISTOGRAM(bucket, duration_us) },
    { "narwhal_request_queue_seconds", "histogram",
      "Time a complete request waited before a worker began it: in the connection manager's "
      "queue, parked in a busy worker, or in the listen queue (TCP: from the kernel's receive "
      "time).", HISTOGRAM(queue_bucket, queue_us) },
    { "narwhal_response_body_bytes_total", "counter",
      "Bytes of response bodies the workers wrote (chunked framing included).",
      VIEW(t.bytes_sent) },
    { "narwhal_workers", "gauge", "Worker processes, by state.", VIEW(by_state[NW_WORKER_STARTING]),
      .label = "state", .values = state_names + NW_WORKER_STARTING,
      .n = NW_WORKER_STOPPING - NW_WORKER_STARTING + 1 },
    { "narwhal_workers_accepting", "gauge", "Workers taking new clients from the listeners "
      "(--accepting-workers); the others serve what the connection manager gives them.",
      VIEW(accepting) },
    { "narwhal_workers_wanted", "gauge", "Workers the master keeps running.",
      HEADER(workers_wanted), .as = AS_I32 },
    { "narwhal_workers_min", "gauge",
      "The elastic pool's lower bound (--min-workers; the upper one without it).",
      HEADER(workers_min), .as = AS_I32 },
    { "narwhal_workers_max", "gauge", "The pool's upper bound (--max-workers).",
      HEADER(workers_max), .as = AS_I32 },
    { "narwhal_pool_changes_total", "counter", "Workers the elastic pool added (requests "
      "waited, or every worker was stuck) or retired (idle).",
      HEADER(pool_changes), LABEL("reason", pool_reasons) },
    { "narwhal_worker_restarts_total", "counter",
      "Workers started in place of one that left, by why it left.",
      HEADER(restarts), LABEL("reason", restart_names) },
    { "narwhal_worker_resident_bytes", "gauge",
      "Resident set size of each worker, by scoreboard slot.", .series = slot_series },
    { "narwhal_connections", "gauge", "Open client connections, each in one state: held idle "
      "or reading a head in the manager, queued for a worker (in the manager or on the serve "
      "queue), written to a slow reader by the manager, closing there, on the handoff queue, "
      "parked in a worker between requests, or in a worker otherwise (being served).",
      VIEW(conns), .label = "state", .values = conn_state_names, .n = CS_STATES },
    { "narwhal_requests_waiting", "gauge", "Complete requests waiting for a worker: in the "
      "connection manager's own queue (manager) and on the serve queue the workers take from "
      "(serve_queue).", VIEW(waiting), LABEL("where", waiting_where) },
    { "narwhal_refused_total", "counter", "Connections closed unserved because they could not "
      "be passed on or kept, each answered 503 when it held a request and logged: the serve "
      "queue refused the manager's hand-off (serve_queue), a worker's hand-off to the manager "
      "failed (handoff), the manager held --max-connections with none idle (full), no memory "
      "(memory).", VIEW(refused), LABEL("reason", refused_reasons) },
    { "narwhal_handoffs_total", "counter", "Connections passed between workers and the "
      "manager, and from a leaving worker to the others.",
      VIEW(handoffs), LABEL("direction", handoff_directions) },
    { "narwhal_offloaded_total", "counter",
      "Responses a worker left to the manager to finish for a slow reader.", MANAGER(offloaded) },
    { "narwhal_offload_bytes", "gauge",
      "Bytes of such responses held in memory (--max-offload-total).",
      VIEW(offload_bytes), .as = AS_I64 },
    { "narwhal_proxy_rejected_total", "counter", "Connections closed under --proxy-protocol: "
      "no valid PROXY header (bad_header) or a peer outside --proxy-from (not_allowed).",
      VIEW(t.proxy_rejected), LABEL("reason", proxy_reasons) },
    { "narwhal_tls_refused_total", "counter", "Connections on a TLS listener closed before or "
      "during the handshake, each logged (rate-limited): plain HTTP (plain_http, answered 400), "
      "a protocol below TLS 1.2 (version), nothing in common (cipher), not TLS (garbage), the "
      "client gone (closed), our certificate refused by the client (certificate_refused), no "
      "handshake within --read-timeout (timeout), anything else (other).",
      .series = tls_series },
    { "narwhal_tls_handshakes_total", "counter", "TLS handshakes completed on the TLS "
      "listeners: full, or resumed from a session ticket.", .series = tls_handshake_series },
    { "narwhal_tls_connections", "gauge", "TLS connections the manager holds, each counted "
      "against --max-connections: in their handshake, relaying (to a worker, or parked), or "
      "closing.", .series = tls_open_series },
    { "narwhal_shed_total", "counter",
      "Requests answered 503 after waiting longer than --max-queue-wait.", MANAGER(shed) },
    { "narwhal_manager_accepted_total", "counter", "Connections the manager took from the "
      "listeners itself because every worker was stuck on a request (they wait in its queue, "
      "measured).", MANAGER(accepted) },
    { "narwhal_manager_accepting", "gauge",
      "1 while the manager takes new connections: no accepting worker can take one.",
      MANAGER(accepting), .as = AS_I32 },
    { "narwhal_custody_connections", "gauge", "Connections parked in workers of which the "
      "manager holds a copy, so that a worker's death does not close them.", MANAGER(custody) },
    { "narwhal_custody_taken_over_total", "counter", "Connections the manager took over from "
      "workers that died without giving them up (a KILL, an app's exit).",
      MANAGER(custody_taken) },
    { "narwhal_custody_lost_total", "counter",
      "Connections closed because their worker died serving their request.",
      MANAGER(custody_lost) },
    { "narwhal_listen_queue_length", "gauge", "Connections in a listener's accept queue (TCP "
      "listeners; the sum of an address's queues, --listen-queues).",
      .series = listener_series, .at = offsetof(nw_status_listener, queue) },
    { "narwhal_listen_queue_limit", "gauge",
      "A listener's backlog (the sum of an address's queues' backlogs).",
      .series = listener_series, .at = offsetof(nw_status_listener, backlog) },
    { "narwhal_failures_total", "counter", "Failures that are not a request's own, each also "
      "logged: a request body that could not be spooled to TMPDIR (spool; answered 503), an "
      "accept refused by the open-file limit (fd_limit), a connection manager that died and "
      "was started again (manager_restart).", VIEW(failures), LABEL("kind", failure_kinds) },
    { "narwhal_crash_refused_total", "counter", "Requests answered 503 without running the "
      "app: their route had killed workers again and again (--crash-backoff).",
      VIEW(t.crash_refused) },
    { "narwhal_start_time_seconds", "gauge",
      "When the master started, in seconds since the epoch.", HEADER(started_unix), .as = AS_I64 },
    { "narwhal_up", "gauge", "1 while the server accepts work, 0 once it stops.",
      VIEW(up), .as = AS_I64 },
    { "process_cpu_seconds_total", "counter",
      "Total user and system CPU time of the master, in seconds.", VIEW(p.cpu_s), .as = AS_F2 },
    { "process_resident_memory_bytes", "gauge", "Resident memory size of the master, in bytes.",
      VIEW(p.rss), .as = AS_F0 },
    { "process_virtual_memory_bytes", "gauge", "Virtual memory size of the master, in bytes.",
      VIEW(p.vsize), .as = AS_F0 },
    { "process_start_time_seconds", "gauge",
      "Start time of the master since the epoch, in seconds.", VIEW(p.start_unix), .as = AS_F2 },
    { "process_open_fds", "gauge", "Open file descriptors of the master.",
      VIEW(p.fds), .as = AS_F0 },
    { "process_max_fds", "gauge", "The master's limit of open file descriptors.",
      VIEW(p.max_fds), .as = AS_F0 },
    { "narwhal_build_info", "gauge", "Always 1; the labels say which Narwhal runs, on which perl.",
      .series = build_series },
};

static int render_metrics(nw_buf *o, const page_view *v)
{
    int r = 0;
    for (const metric_family *f = families; f < families + COUNT_OF(families); f++) {
        if (!f->series && f->as >= AS_F2 && *(const double *)family_values(f, v) < 0)
            continue;
        r |= put(o, "# HELP %s %s\n# TYPE %s %s\n", f->name, f->help, f->name, f->type);
        r |= (f->series ? f->series : fixed_series)(o, f, v);
    }
    return r;
}


/* ------------------------------------------------------------ JSON */

/* A number of seconds, or null where there is none (negative). */
static int json_seconds(nw_buf *o, const char *name, double s)
{
    return s < 0 ? put(o, ",\"%s\":null", name) : put(o, ",\"%s\":%.6f", name, s);
}

/* "name":count for each of n names, comma-separated. */
static int json_counts_of(nw_buf *o, const char *const *names, const volatile uint64_t *counts,
                          size_t n)
{
    int r = 0;
    for (size_t i = 0; i < n; i++)
        r |= put(o, "%s\"%s\":%llu", i ? "," : "", names[i], (unsigned long long)counts[i]);
    return r;
}

static int json_workers(nw_buf *o, const worker_row *rows, size_t n)
{
    int r = put(o, "\"workers\":[");
    for (size_t i = 0; i < n; i++) {
        const worker_row *w = &rows[i];
        r |= put(o, "%s{\"pid\":%d,\"slot\":%d,\"state\":\"%s\",\"generation\":%d,\"accepts\":%s,"
                 "\"served\":%llu,\"rss_bytes\":%llu,\"age_seconds\":%.3f,\"running_seconds\":%.3f,"
                 "\"requests_per_second\":%.3f,\"bytes_sent\":%llu",
                 i ? "," : "", w->pid, w->slot, state_names[w->state], w->generation,
                 w->accepts ? "true" : "false", (unsigned long long)w->served,
                 (unsigned long long)w->rss, w->age_s, w->running_s, w->rps,
                 (unsigned long long)w->bytes);
        r |= json_seconds(o, "mean_seconds", w->mean_s);
        r |= json_seconds(o, "last_seconds", w->last_s);
        r |= json_seconds(o, "cpu_seconds", w->cpu_s);
        r |= put(o, ",\"client\":");
        r |= w->client[0] ? put_json_string(o, w->client) : put(o, "null");
        r |= put(o, ",\"request\":");
        r |= put_json_string(o, w->request);
        r |= put(o, "}");
    }
    return r | put(o, "]");
}

static int json_counts(nw_buf *o, const page_view *v)
{
    const nw_score_counts *t = &v->t;
    int r = put(o, "\"requests\":{\"total\":%llu,\"by_class\":{", (unsigned long long)t->served);
    r |= json_counts_of(o, class_names, t->by_class, NW_SCORE_CLASSES);
    r |= put(o, "},\"duration_seconds_sum\":%.6f,\"per_second\":%.3f,\"rate_window_seconds\":%.3f,"
             "\"bytes_sent\":%llu", (double)t->duration_us / 1e6, v->rates.rps,
             v->rates.window_s, (unsigned long long)t->bytes_sent);
    r |= json_seconds(o, "mean_seconds", v->rates.mean_s);
    r |= json_seconds(o, "last_seconds", v->rates.last_s);
    r |= put(o, "},\"restarts\":{");
    r |= json_counts_of(o, restart_names, v->b->h.restarts, NW_RESTART_REASONS);
    return r | put(o, "}");
}

static int json_manager(nw_buf *o, const page_view *v)
{
    const nw_status_manager *m = v->m;
    int r = put(o, "\"connections\":{\"total\":%llu,", (unsigned long long)v->conns[CS_TOTAL]);
    r |= json_counts_of(o, conn_state_names, v->conns, CS_STATES);
    /* requests waiting for a worker: where the manager sees them, and
     * (with custody) those parked in a worker that is busy */
    r |= put(o, "},\"requests_waiting\":{\"total\":%llu,\"manager\":%llu,\"serve_queue\":%llu,"
             "\"parked\":", (unsigned long long)requests_waiting(v),
             (unsigned long long)m->held_queued, (unsigned long long)m->board.serve_queued);
    r |= m->parked_known ? put(o, "%llu", (unsigned long long)m->parked_readable) : put(o, "null");
    r |= put(o, "},\"refused\":{");
    r |= json_counts_of(o, refused_reasons, v->refused, COUNT_OF(v->refused));
    r |= put(o, "},\"handoffs\":{");
    r |= json_counts_of(o, handoff_directions, v->handoffs, 2);     /* (not worker_to_worker) */
    r |= put(o, "},\"tls_refused\":");
    if (m->tls_reasons) {
        uint64_t sum = 0;
        for (int i = 0; i < m->tls_reasons; i++)
            sum += m->tls_refused[i];
        r |= put(o, "%llu,\"tls_handshakes\":{", (unsigned long long)sum);
        r |= json_counts_of(o, tls_handshake_kinds, m->tls_handshakes, COUNT_OF(tls_handshake_kinds));
        r |= put(o, "},\"tls_connections\":{");
        r |= json_counts_of(o, tls_states, m->tls_open, COUNT_OF(tls_states));
        r |= put(o, "}");
    } else {
        r |= put(o, "null,\"tls_handshakes\":null,\"tls_connections\":null");
    }
    r |= put(o, ",\"shed\":%llu,\"offloaded\":%llu,\"offload_bytes\":%lld,\"listeners\":[",
             (unsigned long long)m->shed, (unsigned long long)m->offloaded,
             (long long)v->offload_bytes);
    for (int i = 0; i < m->nlisteners; i++) {
        r |= put(o, "%s{\"address\":", i ? "," : "");
        r |= put_json_string(o, m->listener[i].address);
        if (m->listener[i].known)
            r |= put(o, ",\"queue\":%u,\"backlog\":%u", m->listener[i].queue,
                     m->listener[i].backlog);
        r |= put(o, ",\"queues\":%u", m->listener[i].queues ? m->listener[i].queues : 1);
        r |= put(o, "}");
    }
    return r | put(o, "]");
}

static int render_json(nw_buf *o, const page_view *v, const worker_row *rows, size_t n)
{
    const nw_scoreboard *b = v->b;
    int r = put(o, "{\"master_pid\":%d,\"host\":", b->h.master_pid);
    r |= put_json_string(o, v->host);
    r |= put(o, ",\"version\":");
    r |= put_json_string(o, v->version[0] ? v->version : "unknown");
    r |= put(o, ",\"perl_version\":");
    r |= put_json_string(o, v->perl[0] ? v->perl : "unknown");
    r |= put(o, ",\"started\":%lld,\"uptime_seconds\":%lld,\"stopping\":%s,\"workers_wanted\":%d,",
             (long long)b->h.started_unix, (long long)(v->now_unix - b->h.started_unix),
             b->h.stopping || v->m->stopping ? "true" : "false", b->h.workers_wanted);
    r |= put(o, "\"workers_min\":%d,\"workers_max\":%d,\"pool_grown\":%llu,\"pool_shrunk\":%llu,",
             b->h.workers_min, b->h.workers_max,
             (unsigned long long)(b->h.pool_changes[NW_POOL_GROW_WAITED]
                                  + b->h.pool_changes[NW_POOL_GROW_STUCK]),
             (unsigned long long)b->h.pool_changes[NW_POOL_SHRINK_IDLE]);
    r |= json_workers(o, rows, n);
    r |= put(o, ",");
    r |= json_counts(o, v);
    r |= put(o, ",");
    r |= json_manager(o, v);
    return r | put(o, "}\n");
}

/* ------------------------------------------------------------ HTML */

static const char html_style[] =
    "body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}"
    "h1{font-size:1.4em;margin:0 0 .2em}p.sub{color:#666;margin:0 0 1em}"
    "table{border-collapse:collapse;margin:0 0 1.2em}"
    "th,td{padding:.25em .7em;border-bottom:1px solid #ddd;text-align:left}"
    "caption{text-align:left;color:#666;padding:0 0 .2em}th{background:#f4f4f4}td.n{text-align:right;font-variant-numeric:tabular-nums}"
    ".idle{color:#1a7f37}.busy{color:#9a6700;font-weight:600}.starting,.stopping{color:#666}"
    ".slow{background:#fff1e5}.cards{display:flex;gap:1em;flex-wrap:wrap;margin:0 0 1.2em}"
    ".card{border:1px solid #ddd;border-radius:6px;padding:.4em .8em;min-width:6em}"
    ".card b{display:block;font-size:1.5em}code{font-size:13px}";

static int html_duration(nw_buf *o, double s)
{
    if (s < 60)
        return put(o, "%.1f s", s);
    if (s < 3600)
        return put(o, "%d min %d s", (int)s / 60, (int)s % 60);
    if (s < 86400)
        return put(o, "%d h %d min", (int)s / 3600, (int)s % 3600 / 60);
    return put(o, "%d d %d h", (int)s / 86400, (int)s % 86400 / 3600);
}

/* A response time: "-" when none, us below a millisecond, ms below a second. */
static int html_latency(nw_buf *o, double s)
{
    return s < 0     ? put(o, "-")
         : s < 1e-3  ? put(o, "%.0f \xc2\xb5s", s * 1e6)
         : s < 1     ? put(o, "%.1f ms", s * 1e3)
         :             put(o, "%.2f s", s);
}

static int html_bytes(nw_buf *o, uint64_t n)
{
    static const char *const unit[] = { "B", "kB", "MB", "GB", "TB" };
    double v = (double)n;
    int u = 0;
    while (v >= 1000 && u < 4) {
        v /= 1000;
        u++;
    }
    return u ? put(o, "%.1f %s", v, unit[u]) : put(o, "%llu B", (unsigned long long)n);
}

static int html_card(nw_buf *o, const char *label, unsigned long long v)
{
    return put(o, "<div class=card><b>%llu</b>%s</div>", v, label);
}

/* The cards of what is happening now: rates and response times. */
static int html_now(nw_buf *o, const page_view *v)
{
    int r = put(o, "<div class=cards><div class=card><b>%.1f</b>requests/s</div>"
                "<div class=card><b>", v->rates.rps);
    r |= html_latency(o, v->rates.mean_s);
    r |= put(o, "</b>mean response</div><div class=card><b>");
    r |= html_latency(o, v->rates.last_s);
    r |= put(o, "</b>last response</div>");
    r |= html_card(o, "requests", (unsigned long long)v->t.served);
    r |= put(o, "<div class=card><b>");
    r |= html_bytes(o, v->t.bytes_sent);
    r |= put(o, "</b>sent</div>");
    r |= html_card(o, "busy workers", (unsigned long long)v->by_state[NW_WORKER_BUSY]);
    r |= html_card(o, "idle workers", (unsigned long long)v->by_state[NW_WORKER_IDLE]);
    r |= html_card(o, "open connections", (unsigned long long)v->conns[CS_TOTAL]);
    r |= html_card(o, "requests waiting", (unsigned long long)requests_waiting(v));
    r |= html_card(o, "shed (503)", (unsigned long long)v->m->shed);
    return r | put(o, "</div>");
}

static int html_header(nw_buf *o, const page_view *v)
{
    int r = put(o, "<h1>Narwhal ");
    r |= put_html(o, v->version[0] ? v->version : "");
    r |= put(o, " on ");
    r |= put_html(o, v->host);
    r |= put(o, "%s</h1><p class=sub>master %d, perl ",
             v->b->h.stopping || v->m->stopping ? " (stopping)" : "", v->b->h.master_pid);
    r |= put_html(o, v->perl[0] ? v->perl : "?");
    r |= put(o, ", up ");
    r |= html_duration(o, (double)(v->now_unix - v->b->h.started_unix));
    if (v->rates.window_s > 0)
        r |= put(o, "; rates over the last %.1f s", v->rates.window_s);
    else
        r |= put(o, "; rates since the start (the next render measures from this one)");
    return r | put(o, "</p>");
}

/* A table of one row of counts, each under its name. */
static int html_counts(nw_buf *o, const char *caption, const char *const *names,
                       const volatile uint64_t *counts, size_t n)
{
    int r = put(o, "<table><caption>%s</caption><tr>", caption);
    for (size_t i = 0; i < n; i++)
        r |= put(o, "<th>%s</th>", names[i]);
    r |= put(o, "</tr><tr>");
    for (size_t i = 0; i < n; i++)
        r |= put(o, "<td class=n>%llu</td>", (unsigned long long)counts[i]);
    return r | put(o, "</tr></table>");
}

static int html_tables(nw_buf *o, const page_view *v)
{
    const nw_status_manager *m = v->m;
    int r = put(o, "<div class=cards>");
    r |= html_counts(o, "connections", conn_state_names, v->conns, CS_STATES + 1);
    r |= put(o, "<table><caption>requests waiting for a worker</caption><tr>"
             "<th>in the manager</th><th>on the serve queue</th><th>parked</th></tr><tr>"
             "<td class=n>%llu</td><td class=n>%llu</td><td class=n>",
             (unsigned long long)m->held_queued, (unsigned long long)m->board.serve_queued);
    r |= m->parked_known ? put(o, "%llu", (unsigned long long)m->parked_readable) : put(o, "-");
    r |= put(o, "</td></tr></table>");
    r |= html_counts(o, "responses", class_names, v->t.by_class, NW_SCORE_CLASSES);
    r |= html_counts(o, "workers replaced", restart_names, v->b->h.restarts, NW_RESTART_REASONS);
    return r | put(o, "</div>");
}

static int html_worker(nw_buf *o, const worker_row *w)
{
    int r = put(o, "<tr%s><td class=n>%d</td><td class=%s>%s</td><td>%s</td><td><code>",
                w->running_s >= 1 ? " class=slow" : "", w->pid, state_names[w->state],
                state_names[w->state], w->accepts ? "yes" : "standby");
    r |= put_html(o, w->client[0] ? w->client : "-");
    r |= put(o, "</code></td><td><code>");
    r |= put_html(o, w->request);
    r |= put(o, "</code></td><td class=n>");
    r |= w->state == NW_WORKER_BUSY ? html_duration(o, w->running_s) : put(o, "-");
    r |= put(o, "</td><td class=n>%.1f</td><td class=n>", w->rps);
    r |= html_latency(o, w->mean_s);
    r |= put(o, "</td><td class=n>");
    r |= html_latency(o, w->last_s);
    r |= put(o, "</td><td class=n>%llu</td><td class=n>", (unsigned long long)w->served);
    r |= html_bytes(o, w->bytes);
    r |= w->cpu_s < 0 ? put(o, "</td><td class=n>-") : put(o, "</td><td class=n>%.2f s", w->cpu_s);
    r |= put(o, "</td><td class=n>%.1f MB</td><td class=n>", (double)w->rss / (1024.0 * 1024.0));
    r |= html_duration(o, w->age_s);
    return r | put(o, "</td></tr>");
}

static int html_workers(nw_buf *o, const worker_row *rows, size_t n)
{
    int r = put(o, "<table><caption>workers</caption><tr><th>pid</th><th>state</th>"
                "<th>accepts</th><th>client</th><th>request</th><th>running</th><th>req/s</th><th>mean</th>"
                "<th>last</th><th>served</th><th>sent</th><th>CPU</th><th>RSS</th>"
                "<th>age</th></tr>");
    for (size_t i = 0; i < n; i++)
        r |= html_worker(o, &rows[i]);
    return r | put(o, "</table>");
}

static int render_html(nw_buf *o, const page_view *v, const worker_row *rows, size_t n)
{
    const nw_status_manager *m = v->m;
    int r = put(o, "<!DOCTYPE html><html><head><meta charset=utf-8>"
                "<meta http-equiv=refresh content=5><title>Narwhal status</title>"
                "<style>%s</style></head><body>", html_style);
    r |= html_header(o, v);
    r |= html_now(o, v);
    r |= html_tables(o, v);
    r |= html_workers(o, rows, n);
    r |= put(o, "<p class=sub>listen queues:");
    for (int i = 0; i < m->nlisteners; i++) {
        r |= put(o, " <code>");
        r |= put_html(o, m->listener[i].address);
        r |= m->listener[i].known ? put(o, "</code> %u/%u", m->listener[i].queue,
                                        m->listener[i].backlog)
                                  : put(o, "</code> -");
        if (m->listener[i].queues > 1)
            r |= put(o, " (%u queues)", m->listener[i].queues);
    }
    r |= put(o, " &middot; handoffs to the manager %llu, to workers %llu &middot; "
             "<a href=/status.json>json</a> <a href=/metrics>metrics</a></p></body></html>\n",
             (unsigned long long)m->handoffs_in, (unsigned long long)m->handoffs_out);
    return r;
}

/* ------------------------------------------------------------ responses */

/* /health's "ready": the master says so once every worker of the first
 * generation serves (READY=1 to systemd), at its next look; a worker that
 * has loaded the app and serves says so sooner. Until then: 503 starting. */
static int serving(const nw_scoreboard *b)
{
    if (b->h.ready)
        return 1;
    for (uint32_t i = 0; i < b->h.nslots; i++)
        if (b->slot[i].pid && (b->slot[i].state == NW_WORKER_IDLE || b->slot[i].state == NW_WORKER_BUSY))
            return 1;
    return 0;
}

static int render_body(nw_buf *o, int page, const nw_scoreboard *b, const nw_status_manager *m,
                       nw_status_rates *rates, uint64_t now_us, int64_t now_unix)
{
    size_t n = 0;
    worker_row *rows = read_rows(b, &n, now_us);
    if (!rows)
        return -1;
    page_view *v = malloc(sizeof *v);
    int r = -1;
    if (v) {
        view_read(v, page, b, m, rates, rows, n, now_us, now_unix);
        r = page == NW_STATUS_METRICS ? render_metrics(o, v)
          : page == NW_STATUS_JSON    ? render_json(o, v, rows, n)
          :                             render_html(o, v, rows, n);
        free(v);
    }
    free(rows);
    return r ? -1 : 0;
}

int nw_status_respond(nw_buf *out, int page, int head_only, const nw_scoreboard *b,
                      const nw_status_manager *m, nw_status_rates *rates, uint64_t now_us,
                      int64_t now_unix)
{
    nw_buf body = { 0 };
    int code = 200;
    const char *type = "text/plain; charset=utf-8", *extra = "";
    int r = 0;
    switch (page) {
    case NW_STATUS_METRICS: type = "text/plain; version=0.0.4; charset=utf-8"; break;
    case NW_STATUS_JSON:    type = "application/json"; break;
    case NW_STATUS_HTML:    type = "text/html; charset=utf-8"; break;
    case NW_STATUS_HEALTH:
        code = b->h.stopping || m->stopping || !serving(b) ? 503 : 200;
        r = put(&body, code == 200 ? "ok\n" : b->h.stopping || m->stopping ? "stopping\n" : "starting\n");
        break;
    case NW_STATUS_BAD_METHOD:
        code = 405;
        extra = "Allow: GET, HEAD\r\n";
        r = put(&body, "405 Method Not Allowed\n");
        break;
    default:
        code = 404;
        r = put(&body, "404 Not Found: try /status, /status.json, /metrics or /health\n");
    }
    if (code == 200 && page != NW_STATUS_HEALTH)
        r = render_body(&body, page, b, m, rates, now_us, now_unix);
    const char *reason = code == 200 ? "OK" : code == 503 ? "Service Unavailable"
                       : code == 405 ? "Method Not Allowed" : "Not Found";
    char date[NW_DATE_FIELD_LEN + 1];     /* (RFC 9110 6.6.1, as every answer of Narwhal's) */
    date[nw_date_field(date, (time_t)now_unix)] = '\0';
    r |= put(out, "HTTP/1.1 %d %s\r\n%sContent-Type: %s\r\nContent-Length: %zu\r\n"
             "Cache-Control: no-store\r\n%sConnection: close\r\n\r\n",
             code, reason, date, type, body.len, extra);
    if (!head_only && body.len)
        r |= nw_buf_append(out, body.data, body.len);
    free(body.data);
    return r ? -1 : 0;
}
