/* Unit tests of the scoreboard (src/shared/nw_scoreboard.c) and the status pages
 * (src/manager/nw_status.c): a board in a real memfd, mapped again read-only as
 * the manager maps it; counts folded in while a reader reads; the pages
 * rendered from it and checked as a client would read them. */
#define _GNU_SOURCE
#include "tap.h"
#include "nw_scoreboard.h"
#include "nw_status.h"
#include "nw_response.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static char *page(const nw_scoreboard *b, const nw_status_manager *m, const char *request,
                  size_t *len)
{
    int head_only;
    nw_buf out = { 0 };
    int p = nw_status_route(request, strlen(request), &head_only);
    if (nw_status_respond(&out, p, head_only, b, m, NULL, nw_now_us(), 1700000000) < 0)
        return NULL;
    nw_buf_append(&out, "", 1);
    *len = out.len - 1;
    return out.data;
}

static char *page_at(const nw_scoreboard *b, const nw_status_manager *m, nw_status_rates *rates,
                     const char *request, uint64_t now_us)
{
    int head_only;
    nw_buf out = { 0 };
    int p = nw_status_route(request, strlen(request), &head_only);
    if (nw_status_respond(&out, p, head_only, b, m, rates, now_us, 1700000000) < 0)
        return NULL;
    nw_buf_append(&out, "", 1);
    return out.data;
}

/* A request of d_us on slot s from client, with a body of bytes. */
static void serve_one(nw_score_slot *s, const struct sockaddr_in *client, uint64_t at,
                      uint64_t d_us, uint64_t bytes)
{
    nw_scoreboard_request_begin(s, "GET", 3, "/x", 2, at, (const struct sockaddr *)client,
                                sizeof *client);
    nw_scoreboard_request_end(s, 200, bytes, at + d_us);
}

static int has(const char *text, const char *want, const char *name)
{
    int found = text && strstr(text, want) != NULL;
    ok(found, name);
    if (!found)
        diag("no %s in %s", want, text ? text : "(null)");
    return found;
}

/* The fields an operator acts on: rates over the manager's samples,
 * response times, bytes, the client of a running request, the host and
 * version, connections by state. */
static void test_operator_fields(void)
{
    int fd = -1;
    nw_scoreboard *b = nw_scoreboard_create(4, &fd);
    uint64_t t0 = nw_now_us() / 1000 * 1000;     /* whole ms: ages are exact */
    b->h.master_pid = 77;
    b->h.started_unix = 1700000000 - 10;
    strcpy(b->h.version, "9.87");
    strcpy(b->h.perl_version, "5.36.0");
    nw_scoreboard_claim(&b->slot[0], 1001, 1, 0, (nw_msec)(t0 / 1000) - 10000);
    nw_scoreboard_claim(&b->slot[2], 1003, 1, 1, (nw_msec)(t0 / 1000) - 10000);
    b->slot[0].state = b->slot[2].state = NW_WORKER_IDLE;
    struct sockaddr_in c4 = { .sin_family = AF_INET, .sin_port = htons(4567) };
    inet_pton(AF_INET, "10.1.2.3", &c4.sin_addr);
    for (int i = 0; i < 20; i++)            /* 20 requests of 2 ms, 100 bytes each */
        serve_one(&b->slot[0], &c4, t0 - 5000000, 2000, 100);
    nw_status_manager m = { .held_idle = 3, .held_reading = 1, .held_queued = 2,
                            .held_writing = 4, .shed = 0 };
    nw_status_rates *rates = calloc(1, sizeof *rates);

    char *j = page_at(b, &m, rates, "GET /status.json HTTP/1.1\r\n\r\n", t0);
    has(j, "\"version\":\"9.87\"", "status.json: the version");
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    char want[512];
    snprintf(want, sizeof want, "\"host\":\"%s\"", host);
    has(j, want, "... the host's name");
    has(j, "\"per_second\":2.000,\"rate_window_seconds\":0.000", "... first render: 20 requests "
        "over 10 s up, a rate since the start");
    has(j, "\"bytes_sent\":2000", "... the bytes sent in all");
    has(j, "\"mean_seconds\":0.002000,\"last_seconds\":0.002000}", "... mean and last: 2 ms");
    has(j, "\"requests_per_second\":2.000,\"bytes_sent\":2000,\"mean_seconds\":0.002000,"
        "\"last_seconds\":0.002000", "... and the same for the worker (10 s old)");
    has(j, "\"client\":\"10.1.2.3:4567\"", "... the worker's client");
    has(j, "\"pid\":1001,\"slot\":0,\"state\":\"idle\",\"generation\":1,\"accepts\":true,",
        "... the first worker accepts new clients");
    has(j, "\"pid\":1003,\"slot\":2,\"state\":\"idle\",\"generation\":1,\"accepts\":false,",
        "... the other stands by (--accepting-workers)");
    has(j, "\"connections\":{\"total\":10,\"idle\":3,\"reading\":1,\"queued\":2,\"writing\":4",
        "... connections by state");
    free(j);

    /* 2 s later: 30 more requests of 10 ms on slot 0, one on slot 2 */
    for (int i = 0; i < 30; i++)
        serve_one(&b->slot[0], &c4, t0 + 1000000, 10000, 10);
    struct sockaddr_in6 c6 = { .sin6_family = AF_INET6, .sin6_port = htons(80) };
    inet_pton(AF_INET6, "2001:db8::1", &c6.sin6_addr);
    nw_scoreboard_request_begin(&b->slot[2], "POST", 4, "/y", 2, t0 + 1500000,
                                (const struct sockaddr *)&c6, sizeof c6);
    nw_scoreboard_request_end(&b->slot[2], 200, 5, t0 + 1500000 + 40000);
    j = page_at(b, &m, rates, "GET /status.json HTTP/1.1\r\n\r\n", t0 + 2000000);
    has(j, "\"per_second\":15.500,\"rate_window_seconds\":2.000", "2 s later: 31 requests "
        "over the 2 s since the last sample");
    has(j, "\"mean_seconds\":0.010968", "... their mean (30 of 10 ms, one of 40 ms)");
    has(j, "\"last_seconds\":0.040000}", "... the last to end took 40 ms");
    has(j, "\"requests_per_second\":15.000,\"bytes_sent\":2300,\"mean_seconds\":0.010000",
        "... the first worker: 30 in 2 s of 10 ms");
    has(j, "\"client\":\"[2001:db8::1]:80\"", "... an IPv6 client");
    free(j);

    /* 0.5 s later: no new sample, still measured from the first */
    j = page_at(b, &m, rates, "GET /status.json HTTP/1.1\r\n\r\n", t0 + 2500000);
    has(j, "\"per_second\":12.400,\"rate_window_seconds\":2.500", "a render within 1 s of the "
        "last sample measures from the one before it");
    free(j);

    /* a running request: its client on the HTML page, escaped */
    nw_scoreboard_request_begin(&b->slot[2], "GET", 3, "/slow", 5, t0 + 2600000,
                                (const struct sockaddr *)&c4, sizeof c4);
    char *h = page_at(b, &m, rates, "GET /status HTTP/1.1\r\n\r\n", t0 + 3000000);
    has(h, "<h1>Narwhal 9.87 on ", "HTML: the version and host in the title");
    has(h, "<td class=busy>busy</td><td>standby</td><td><code>10.1.2.3:4567</code></td>"
        "<td><code>GET /slow", "... the running request's client (of a standby worker)");
    has(h, "<td class=idle>idle</td><td>yes</td>", "... and a worker that accepts");
    has(h, "<th>reading</th><th>queued</th><th>writing</th><th>closing</th><th>handoff</th>"
        "<th>parked</th><th>worker</th>", "... a table of connections by state");
    has(h, "<td class=n>3</td><td class=n>1</td><td class=n>2</td><td class=n>4</td>",
        "... with the manager's counts");
    has(h, "</b>requests/s</div>", "... requests per second");
    has(h, "</b>mean response</div>", "... mean response time");
    has(h, "<b>2.3 kB</b>sent", "... bytes sent");
    free(h);
    /* /metrics: bytes, and it leaves the samples alone */
    nw_status_sample before = rates->last;
    char *mx = page_at(b, &m, rates, "GET /metrics HTTP/1.1\r\n\r\n", t0 + 9000000);
    has(mx, "\nnarwhal_response_body_bytes_total 2305\n", "/metrics: the body bytes");
    ok(rates->last.at_us == before.at_us, "... and takes no sample");
    free(mx);
    free(rates);
    nw_scoreboard_unmap(b);
    close(fd);
}

/* Every connection in one state: the manager's lists and what the board
 * says of the queues and the workers; and the requests that wait. */
static void test_connection_states(void)
{
    int fd = -1;
    nw_scoreboard *b = nw_scoreboard_create(4, &fd);
    nw_scoreboard_claim(&b->slot[0], 1001, 1, 0, nw_now_ms());
    nw_scoreboard_claim(&b->slot[1], 1002, 1, 1, nw_now_ms());
    nw_scoreboard_claim(&b->slot[3], 1004, 1, 0, nw_now_ms());
    b->slot[0].state = NW_WORKER_BUSY;
    b->slot[1].state = NW_WORKER_IDLE;
    b->slot[0].conns = 4;       /* one served, three parked */
    b->slot[0].parked = 3;
    b->slot[1].conns = 1;       /* idle, but a connection in its hands (between requests) */
    b->slot[3].conns = 9;       /* a worker gone (its slot freed): nothing of it counts */
    b->slot[3].pid = 0;
    b->h.serve_queued = 6;
    b->h.handoff_queued = 2;
    nw_status_manager m = { .held_idle = 3, .held_reading = 1, .held_queued = 2,
                            .held_writing = 4, .held_closing = 5, .parked_known = 1,
                            .parked_readable = 1 };
    m.refused[NW_REFUSED_SERVE_QUEUE] = 7;
    nw_scoreboard_connections(b, &m.board);
    is((int)m.board.in_workers, 2, "in workers, not parked: the busy one's and the idle one's");
    is((int)m.board.parked, 3, "... parked");
    is((int)m.board.serve_queued, 6, "... on the serve queue");
    is((int)m.board.handoff_queued, 2, "... on the handoff queue");
    b->h.serve_queued = -1;     /* (taken before its sender counted it) */
    nw_status_manager m2 = m;
    nw_scoreboard_connections(b, &m2.board);
    is((int)m2.board.serve_queued, 0, "a count below 0 for an instant reads 0");
    b->h.serve_queued = 6;

    char *mx = page_at(b, &m, NULL, "GET /metrics HTTP/1.1\r\n\r\n", nw_now_us());
    has(mx, "\nnarwhal_connections{state=\"idle\"} 3\n"
        "narwhal_connections{state=\"reading\"} 1\n"
        "narwhal_connections{state=\"queued\"} 8\n"
        "narwhal_connections{state=\"writing\"} 4\n"
        "narwhal_connections{state=\"closing\"} 5\n"
        "narwhal_connections{state=\"handoff\"} 2\n"
        "narwhal_connections{state=\"parked\"} 3\n"
        "narwhal_connections{state=\"worker\"} 2\n",
        "/metrics: every state, queued with the serve queue's");
    has(mx, "\nnarwhal_requests_waiting{where=\"manager\"} 2\n"
        "narwhal_requests_waiting{where=\"serve_queue\"} 6\n", "... the requests waiting");
    has(mx, "\nnarwhal_refused_total{reason=\"serve_queue\"} 7\n", "... and the refused ones");
    free(mx);
    char *j = page_at(b, &m, NULL, "GET /status.json HTTP/1.1\r\n\r\n", nw_now_us());
    has(j, "\"connections\":{\"total\":28,\"idle\":3,\"reading\":1,\"queued\":8,\"writing\":4,"
        "\"closing\":5,\"handoff\":2,\"parked\":3,\"worker\":2}", "status.json: the same, 28 in all");
    has(j, "\"requests_waiting\":{\"total\":8,\"manager\":2,\"serve_queue\":6,\"parked\":1}",
        "... the requests waiting for a worker");
    has(j, "\"refused\":{\"serve_queue\":7,", "... the refused connections");
    has(j, "\"pid\":1001,\"slot\":0,\"state\":\"busy\",\"generation\":1,\"accepts\":true",
        "... which worker accepts");
    has(j, "\"pid\":1002,\"slot\":1,\"state\":\"idle\",\"generation\":1,\"accepts\":false",
        "... and which stands by");
    free(j);
    b->slot[1].standby = 0;     /* (a standby worker whose requests block accepts too) */
    m.parked_known = 0;
    j = page_at(b, &m, NULL, "GET /status.json HTTP/1.1\r\n\r\n", nw_now_us());
    has(j, "\"pid\":1002,\"slot\":1,\"state\":\"idle\",\"generation\":1,\"accepts\":true",
        "... read from the slot as it is now");
    has(j, "\"serve_queue\":6,\"parked\":null}", "... parked requests unknown without custody");
    free(j);
    char *h = page_at(b, &m, NULL, "GET /status HTTP/1.1\r\n\r\n", nw_now_us());
    has(h, "<b>8</b>requests waiting", "/status: the requests waiting");
    has(h, "<th>in the manager</th><th>on the serve queue</th><th>parked</th></tr><tr>"
        "<td class=n>2</td><td class=n>6</td><td class=n>-</td>", "... where they wait");
    has(h, "<td class=n>5</td><td class=n>2</td><td class=n>3</td><td class=n>2</td>"
        "<td class=n>28</td>", "... the connections' states and their total");
    free(h);
    nw_scoreboard_unmap(b);
    close(fd);
}

static void test_buckets(void)
{
    is(nw_scoreboard_bucket(0), 0, "a zero duration is in the first bucket");
    is(nw_scoreboard_bucket(100), 0, "100 us is in le=0.0001 (bounds are inclusive)");
    is(nw_scoreboard_bucket(101), 1, "101 us is in le=0.00025");
    is(nw_scoreboard_bucket(5000), 5, "5 ms is in le=0.005");
    is(nw_scoreboard_bucket(5001), 6, "5.001 ms is in le=0.01");
    is(nw_scoreboard_bucket(10000000), 15, "10 s is in le=10");
    is(nw_scoreboard_bucket(30000000), 16, "30 s is in le=30");
    is(nw_scoreboard_bucket(30000001), 17, "more than 30 s is in +Inf");
}

static void test_routes(void)
{
    int h;
    is(nw_status_route("GET /metrics HTTP/1.1\r\n", 23, &h), NW_STATUS_METRICS, "GET /metrics");
    is(nw_status_route("GET /status?x=1 HTTP/1.1\r\n", 26, &h), NW_STATUS_HTML, "a query string is ignored");
    is(nw_status_route("GET /status.json HTTP/1.0\r\n", 27, &h), NW_STATUS_JSON, "GET /status.json");
    is(nw_status_route("HEAD /health HTTP/1.1\r\n", 23, &h), NW_STATUS_HEALTH, "HEAD /health");
    is(h, 1, "... is a HEAD");
    is(nw_status_route("POST /health HTTP/1.1\r\n", 23, &h), NW_STATUS_BAD_METHOD, "POST is refused");
    is(nw_status_route("GET /metricsx HTTP/1.1\r\n", 24, &h), NW_STATUS_NOT_FOUND, "no prefix matches");
    is(nw_status_route("GET", 3, &h), NW_STATUS_NOT_FOUND, "a cut line is no page");
}

/* The manager's look at the pool: stuck only when no worker is free or
 * coming and every busy one has been on its request long enough. */
static void test_pool_stuck(void)
{
    int fd = -1, busy = -1;
    nw_scoreboard *b = nw_scoreboard_create(4, &fd);
    uint64_t now = 10000000, min = 20000;
    ok(!nw_scoreboard_pool_stuck(b, now, min, 0, &busy), "no worker at all: not stuck (none busy)");
    is(busy, 0, "... and none busy");
    b->slot[0].state = NW_WORKER_BUSY;
    b->slot[0].since_us = now - 30000;
    b->slot[1].state = NW_WORKER_IDLE;
    ok(!nw_scoreboard_pool_stuck(b, now, min, 0, &busy), "one idle worker: not stuck");
    is(busy, 1, "... one busy");
    b->slot[1].state = NW_WORKER_BUSY;
    b->slot[1].since_us = now - 5000;
    ok(!nw_scoreboard_pool_stuck(b, now, min, 0, NULL), "a request that began 5 ms ago: not stuck");
    b->slot[1].since_us = now - 20000;
    ok(nw_scoreboard_pool_stuck(b, now, min, 0, NULL), "both busy for 20 ms and more: stuck");
    b->slot[2].state = NW_WORKER_STARTING;
    ok(!nw_scoreboard_pool_stuck(b, now, min, 0, NULL), "a worker starting: not stuck");
    b->slot[2].state = NW_WORKER_STOPPING;
    ok(nw_scoreboard_pool_stuck(b, now, min, 0, NULL), "a worker stopping does not count");
    /* --accepting-workers: slot 3 is a standby worker, idle */
    b->slot[3].state = NW_WORKER_IDLE;
    b->slot[3].standby = 1;
    ok(!nw_scoreboard_pool_stuck(b, now, min, 0, NULL), "a standby worker idle: the pool is not");
    ok(nw_scoreboard_pool_stuck(b, now, min, 1, &busy), "... but every accepting one is stuck");
    is(busy, 1, "... busy");
    b->slot[1].since_us = now - 5000;
    ok(!nw_scoreboard_pool_stuck(b, now, min, 1, NULL), "an accepting one began 5 ms ago: not");
    /* No accepting worker can take a client now, and a standby one is
     * idle: stuck (the manager takes the clients for it), whether the
     * accepting ones are starting (a crash's replacement loading the app,
     * a reload's), leaving, or gone (a failed start backing off). */
    b->slot[1].since_us = now - 20000;
    b->slot[1].state = NW_WORKER_STARTING;
    ok(nw_scoreboard_pool_stuck(b, now, min, 1, &busy), "one accepting stuck, one starting, a standby idle: stuck");
    b->slot[1].state = NW_WORKER_STOPPING;
    b->slot[0].state = NW_WORKER_STARTING;
    ok(nw_scoreboard_pool_stuck(b, now, min, 1, &busy), "the accepting ones starting and leaving, a standby idle: stuck");
    is(busy, 1, "... busy");
    ok(!nw_scoreboard_pool_stuck(b, now, min, 0, NULL), "... (the whole pool is not)");
    b->slot[3].state = NW_WORKER_BUSY;
    b->slot[3].since_us = now - 30000;
    ok(!nw_scoreboard_pool_stuck(b, now, min, 1, NULL), "... no standby idle either: not stuck (one is coming)");
    b->slot[3].state = NW_WORKER_IDLE;
    b->slot[0].state = NW_WORKER_IDLE;
    ok(!nw_scoreboard_pool_stuck(b, now, min, 1, NULL), "an accepting one idle: not stuck");
    b->slot[0].state = NW_WORKER_BUSY;
    b->slot[1].state = NW_WORKER_BUSY;
    b->slot[0].standby = b->slot[1].standby = 1;
    ok(nw_scoreboard_pool_stuck(b, now, min, 1, &busy), "no accepting worker at all, a standby one idle: stuck");
    is(busy, 1, "... (and looked at often)");
    b->slot[3].state = NW_WORKER_STOPPING;
    ok(!nw_scoreboard_pool_stuck(b, now, min, 1, &busy), "no accepting worker, no standby one idle: not stuck");
    is(busy, 0, "... and none of them busy");
    nw_scoreboard_unmap(b);
    close(fd);
}

/* A standby worker idle beside accepting workers whose requests block:
 * unused (the manager then takes new clients for it). */
static void test_standby_unused(void)
{
    int fd = -1;
    nw_scoreboard *b = nw_scoreboard_create(3, &fd);
    b->slot[0].state = b->slot[1].state = NW_WORKER_BUSY;
    b->slot[0].blocking = 1;
    b->slot[2].state = NW_WORKER_IDLE;
    b->slot[2].standby = 1;
    ok(nw_scoreboard_standby_unused(b), "accepting ones busy, one's requests block, a standby idle: unused");
    b->slot[0].blocking = 0;
    ok(!nw_scoreboard_standby_unused(b), "... not when their requests do not block (CPU: it stays out)");
    b->slot[0].blocking = 1;
    b->slot[1].state = NW_WORKER_IDLE;
    ok(!nw_scoreboard_standby_unused(b), "... nor with an accepting one idle");
    b->slot[1].state = NW_WORKER_STARTING;
    ok(!nw_scoreboard_standby_unused(b), "... nor with one starting");
    b->slot[1].state = NW_WORKER_BUSY;
    b->slot[2].state = NW_WORKER_BUSY;
    ok(!nw_scoreboard_standby_unused(b), "... nor with the standby one busy");
    nw_scoreboard_unmap(b);
    close(fd);
}

/* Whether a wake-up a worker left is worth passing on: another worker
 * is idle to take it. */
static void test_other_idle(void)
{
    int fd = -1;
    nw_scoreboard *b = nw_scoreboard_create(3, &fd);
    ok(!nw_scoreboard_other_idle(b, &b->slot[0]), "no other worker: none idle");
    b->slot[0].state = NW_WORKER_IDLE;
    ok(!nw_scoreboard_other_idle(b, &b->slot[0]), "the asking worker itself does not count");
    ok(nw_scoreboard_other_idle(b, NULL), "... and without a slot of its own, it does");
    b->slot[1].state = NW_WORKER_BUSY;
    b->slot[2].state = NW_WORKER_STARTING;
    ok(!nw_scoreboard_other_idle(b, &b->slot[0]), "busy or starting: not idle");
    b->slot[2].state = NW_WORKER_IDLE;
    ok(nw_scoreboard_other_idle(b, &b->slot[0]), "another idle: yes");
    nw_scoreboard_unmap(b);
    close(fd);
}

/* Who may adopt a busy worker's share of a leaving one's connections:
 * one holding no more than the serving workers' mean. */
static void test_mean_parked(void)
{
    int fd = -1;
    nw_scoreboard *b = nw_scoreboard_create(6, &fd);
    ok(nw_scoreboard_at_most_mean_parked(b, 100), "no worker at all: anyone may");
    uint32_t parked[] = { 300, 300, 300, 0, 900, 50 };
    int states[] = { NW_WORKER_BUSY, NW_WORKER_IDLE, NW_WORKER_BUSY, NW_WORKER_STARTING,
                     NW_WORKER_STOPPING, NW_WORKER_FREE };
    for (int i = 0; i < 6; i++) {
        b->slot[i].pid = 100 + i;
        b->slot[i].state = states[i];
        b->slot[i].parked = parked[i];
    }
    /* serving: 300, 300, 300 and the new one's 0: a mean of 225 */
    ok(nw_scoreboard_at_most_mean_parked(b, 0), "the new worker, at 0, may");
    ok(nw_scoreboard_at_most_mean_parked(b, 225), "one at the mean may");
    ok(!nw_scoreboard_at_most_mean_parked(b, 226), "one over it may not");
    ok(!nw_scoreboard_at_most_mean_parked(b, 300), "an old worker at 300 may not");
    b->slot[3].parked = 300;
    ok(nw_scoreboard_at_most_mean_parked(b, 300), "... once the new one holds as many");
    b->slot[3].pid = 0;
    b->slot[3].state = NW_WORKER_FREE;
    ok(nw_scoreboard_at_most_mean_parked(b, 300), "leaving and free slots do not count");
    /* a worker whose parked set went away from its crash handler (or an
     * app's exit) says busy still, holding nothing: not one that serves */
    b->slot[2].parked = 0;
    b->slot[2].parked_released = 1;
    ok(nw_scoreboard_at_most_mean_parked(b, 300), "one that let its parked set go does not count");
    /* serving now: 300 (busy) and 300 (idle); a standby worker holding 0
     * must not pull the mean down to 200 */
    b->slot[3].pid = 103;
    b->slot[3].state = NW_WORKER_IDLE;
    b->slot[3].parked = 0;
    ok(!nw_scoreboard_at_most_mean_parked(b, 300), "a worker at 0 counts in the mean");
    b->slot[3].standby = 1;
    ok(nw_scoreboard_at_most_mean_parked(b, 300), "... a standby one does not");
    nw_scoreboard_unmap(b);
    close(fd);
}

/* The recycling turn: one worker of the pool asks for its replacement at
 * a time; one at its count leaves once a worker forked since it asked is
 * ready. */
static void test_recycling_turn(void)
{
    int fd = -1;
    const nw_msec max = NW_RECYCLE_TURN_MAX_MS;
    nw_scoreboard *b = nw_scoreboard_create(4, &fd);
    for (int i = 0; i < 3; i++) {
        b->slot[i].pid = 200 + i;
        b->slot[i].state = NW_WORKER_BUSY;
        b->slot[i].generation = 1;
    }
    ok(nw_scoreboard_take_recycle_turn(b, 200, 5000, max), "a free turn is taken");
    ok(nw_scoreboard_take_recycle_turn(b, 200, 5001, max), "... and held by its holder");
    ok(!nw_scoreboard_take_recycle_turn(b, 201, 5002, max), "another worker waits");
    b->slot[0].state = NW_WORKER_STOPPING;
    ok(!nw_scoreboard_take_recycle_turn(b, 201, 5003, max), "... while the holder leaves");
    nw_scoreboard_fold(b, &b->slot[1]);
    ok(!nw_scoreboard_take_recycle_turn(b, 202, 5004, max), "another worker's fold does not free it");
    nw_scoreboard_fold(b, &b->slot[0]);
    is(b->h.recycling, 0, "the holder's fold frees it");
    ok(nw_scoreboard_take_recycle_turn(b, 202, 5005, max), "... and the next worker takes it");
    b->slot[2].pid = 0;
    b->slot[2].state = NW_WORKER_FREE;   /* (gone without a fold: not on the board) */
    ok(nw_scoreboard_take_recycle_turn(b, 203, 5006, max), "a holder no longer on the board holds nothing");
    /* A holder on the board, stuck (a request that does not end): its turn
     * is free once it has held it max ms. */
    b->slot[1].pid = 203;
    b->slot[1].state = NW_WORKER_BUSY;
    b->slot[1].generation = 1;
    b->slot[2].pid = 205;
    b->slot[2].state = NW_WORKER_IDLE;
    b->slot[2].generation = 1;
    ok(!nw_scoreboard_take_recycle_turn(b, 205, 5006 + max - 1, max), "a holder stuck for less than max holds it");
    ok(nw_scoreboard_take_recycle_turn(b, 205, 5006 + max, max), "... and for max, not any more");
    nw_scoreboard_fold(b, &b->slot[1]);
    is(NW_TURN_PID(b->h.recycling), 205, "the stuck holder's fold leaves it to the one that took it over");
    nw_scoreboard_fold(b, &b->slot[2]);
    is(b->h.recycling, 0, "... whose own fold frees it");
    /* (the ms the turn was taken at, modulo 2^32: a clock past 49 days) */
    b->slot[0].pid = 206;
    b->slot[0].state = NW_WORKER_BUSY;
    b->slot[0].generation = 1;
    nw_msec late = ((nw_msec)1 << 32) - 10;
    ok(nw_scoreboard_take_recycle_turn(b, 206, late, max), "a turn taken just before the ms wrap");
    ok(!nw_scoreboard_take_recycle_turn(b, 207, late + 20, max), "... is held just after it");
    ok(nw_scoreboard_take_recycle_turn(b, 207, late + max, max), "... for max");
    b->slot[0].pid = 0;
    b->slot[0].state = NW_WORKER_FREE;
    b->slot[1].pid = 0;
    b->slot[1].state = NW_WORKER_FREE;
    b->slot[2].pid = 0;
    b->slot[2].state = NW_WORKER_FREE;
    /* slots 0 to 2 are free now; slot 3: 203's replacement, asked at 1000 */
    ok(!nw_scoreboard_ready_since(b, 1, 1000), "no worker forked since the ask");
    nw_scoreboard_claim(&b->slot[3], 0, 1, 0, 1000);
    ok(!nw_scoreboard_ready_since(b, 1, 1000), "the replacement starting (no pid yet): not ready");
    b->slot[3].pid = 204;
    b->slot[3].state = NW_WORKER_IDLE;
    ok(nw_scoreboard_ready_since(b, 1, 1000), "ready once idle");
    ok(!nw_scoreboard_ready_since(b, 2, 1000), "... of its generation only");
    ok(!nw_scoreboard_ready_since(b, 1, 1001), "a worker forked before the ask is not its replacement");
    b->slot[3].state = NW_WORKER_BUSY;
    ok(nw_scoreboard_ready_since(b, 1, 1000), "busy is ready too");
    nw_scoreboard_unmap(b);
    close(fd);
}

/* The board as workers write it and the manager reads it. */
static void test_board(void)
{
    int fd = -1;
    nw_scoreboard *b = nw_scoreboard_create(4, &fd);
    ok(b && fd >= 0, "a board in a memfd");
    const nw_scoreboard *ro = nw_scoreboard_map(fd);
    ok(ro != NULL, "mapped again read-only from its fd");
    int junk = memfd_create("junk", MFD_CLOEXEC);
    ok(junk >= 0 && ftruncate(junk, 65536) == 0 && nw_scoreboard_map(junk) == NULL,
       "a memfd that is no board is refused");
    close(junk);
    b->h.master_pid = 77;
    b->h.workers_wanted = 2;
    nw_scoreboard_claim(&b->slot[0], 1001, 1, 0, nw_now_ms());
    nw_scoreboard_claim(&b->slot[1], 1002, 1, 0, nw_now_ms());
    b->slot[0].state = b->slot[1].state = NW_WORKER_IDLE;
    uint64_t t0 = nw_now_us();
    nw_scoreboard_request_begin(&b->slot[0], "GET", 3, "/a", 2, t0, NULL, 0);
    nw_scoreboard_request_end(&b->slot[0], 200, 0, t0 + 3000);
    nw_scoreboard_request_begin(&b->slot[0], "POST", 4, "/b", 2, t0, NULL, 0);
    nw_scoreboard_request_end(&b->slot[0], 503, 0, t0 + 2000000);
    nw_scoreboard_count_error(&b->slot[1], 400);
    nw_scoreboard_request_begin(&b->slot[1], "GET", 3, "/</script><b>\"x\"\x01", 17, t0, NULL, 0);
    nw_score_counts t;
    nw_scoreboard_totals(ro, &t);
    is(t.served, 3, "totals: three requests ended");
    is(t.by_class[1], 1, "one 2xx");
    is(t.by_class[3], 1, "one 4xx");
    is(t.by_class[4], 1, "one 5xx");
    is(t.bucket[0], 1, "the error in the first bucket");
    is(t.bucket[5], 1, "3 ms in le=0.005");
    is(t.bucket[13], 1, "2 s in le=2.5");
    is(t.duration_us, 2003000, "the sum of durations");

    /* A reaped worker's counts move into the header: the totals stay. */
    nw_scoreboard_fold(b, &b->slot[0]);
    nw_scoreboard_totals(ro, &t);
    is(t.served, 3, "folding a reaped worker keeps the totals");
    is(ro->slot[0].pid, 0, "... and frees its slot");
    is(ro->h.gone.served, 2, "... its counts are in the header");

    size_t len;
    nw_status_manager m = { .held_idle = 5, .shed = 2, .nlisteners = 1 };
    strcpy(m.listener[0].address, "127.0.0.1:5000");
    m.listener[0].known = 1;
    m.listener[0].queue = 3;
    m.listener[0].backlog = 1024;
    char *metrics = page(ro, &m, "GET /metrics HTTP/1.1\r\n\r\n", &len);
    ok(metrics && !strncmp(metrics, "HTTP/1.1 200 OK\r\n", 17), "/metrics: 200");
    /* RFC 9110 6.6.1: the status server has a clock, so its answers have a
     * Date (now_unix 1700000000 is Tue, 14 Nov 2023 22:13:20 GMT) */
    ok(strstr(metrics, "\r\nDate: Tue, 14 Nov 2023 22:13:20 GMT\r\n"), "... with a Date");
    ok(strstr(metrics, "Content-Type: text/plain; version=0.0.4"), "... Prometheus 0.0.4");
    ok(strstr(metrics, "\nnarwhal_requests_total{class=\"4xx\"} 1\n"), "... 4xx counted");
    ok(strstr(metrics, "\nnarwhal_request_duration_seconds_bucket{le=\"+Inf\"} 3\n"), "... +Inf is the count");
    ok(strstr(metrics, "\nnarwhal_request_duration_seconds_bucket{le=\"2.5\"} 3\n"), "... cumulative buckets");
    ok(strstr(metrics, "\nnarwhal_request_duration_seconds_bucket{le=\"1\"} 2\n"), "... le=1 has two");
    ok(strstr(metrics, "\nnarwhal_workers{state=\"busy\"} 1\n"), "... one busy worker");
    ok(strstr(metrics, "\nnarwhal_workers_accepting 1\n"), "... the one left accepts");
    ok(strstr(metrics, "\nnarwhal_connections{state=\"idle\"} 5\n"), "... the manager's idle connections");
    ok(strstr(metrics, "\nnarwhal_shed_total 2\n"), "... shed");
    ok(strstr(metrics, "\nnarwhal_listen_queue_length{listener=\"127.0.0.1:5000\"} 3\n"), "... the listen queue");
    const char *body = strstr(metrics, "\r\n\r\n") + 4;
    char want[64];
    snprintf(want, sizeof want, "Content-Length: %zu\r\n", strlen(body));
    ok(strstr(metrics, want), "... Content-Length is the body's");
    free(metrics);

    char *json = page(ro, &m, "GET /status.json HTTP/1.1\r\n\r\n", &len);
    ok(json && strstr(json, "\"request\":\"GET /</script><b>\\\"x\\\"\\u0001\""),
       "JSON escapes quotes and control bytes in request lines");
    ok(strstr(json, "\"master_pid\":77"), "... the master's pid");
    free(json);
    char *html = page(ro, &m, "GET /status HTTP/1.1\r\n\r\n", &len);
    ok(html && strstr(html, "GET /&lt;/script&gt;&lt;b&gt;&quot;x&quot;?"), "HTML escapes request lines");
    ok(!strstr(html, "</script><b>"), "... never raw");
    free(html);

    char *head = page(ro, &m, "HEAD /status HTTP/1.1\r\n\r\n", &len);
    ok(head && strstr(head, "\r\n\r\n") + 4 == head + len, "HEAD: no body");
    free(head);
    int32_t was[8];
    for (uint32_t i = 0; i < b->h.nslots && i < 8; i++) {
        was[i] = b->slot[i].state;
        b->slot[i].state = NW_WORKER_STARTING;
    }
    char *health = page(ro, &m, "GET /health HTTP/1.1\r\n\r\n", &len);
    ok(health && strstr(health, "503 Service Unavailable") && strstr(health, "\r\n\r\nstarting\n"),
       "/health: 503 starting while no worker serves");
    free(health);
    for (uint32_t i = 0; i < b->h.nslots && i < 8; i++)
        b->slot[i].state = was[i];
    health = page(ro, &m, "GET /health HTTP/1.1\r\n\r\n", &len);
    ok(health && strstr(health, "200 OK"), "/health: 200 once a worker serves");
    free(health);
    for (uint32_t i = 0; i < b->h.nslots && i < 8; i++)
        b->slot[i].state = NW_WORKER_STARTING;
    b->h.ready = 1;
    health = page(ro, &m, "GET /health HTTP/1.1\r\n\r\n", &len);
    ok(health && strstr(health, "200 OK") && strstr(health, "\r\n\r\nok\n"),
       "/health: 200 ok once the master said ready, whatever the workers do");
    for (uint32_t i = 0; i < b->h.nslots && i < 8; i++)
        b->slot[i].state = was[i];
    free(health);
    b->h.stopping = 1;
    health = page(ro, &m, "GET /health HTTP/1.1\r\n\r\n", &len);
    ok(health && strstr(health, "503 Service Unavailable"), "/health: 503 once stopping");
    ok(health && strstr(health, "\r\nDate: Tue, 14 Nov 2023 22:13:20 GMT\r\n"), "... with a Date");
    free(health);
    char *missing = page(ro, &m, "GET /x HTTP/1.1\r\n\r\n", &len);
    ok(missing && strstr(missing, "404 Not Found"), "unknown page: 404");
    ok(missing && strstr(missing, "\r\nDate: Tue, 14 Nov 2023 22:13:20 GMT\r\n"), "... with a Date");
    free(missing);
    nw_scoreboard_unmap(ro);
    nw_scoreboard_unmap(b);
    close(fd);
}

/* Totals read while the master folds workers in: never counted twice,
 * never missing (the sequence counter). */
static nw_scoreboard *race_board;
static volatile int race_done, race_reading;

static void *folder(void *arg)
{
    (void)arg;
    while (!race_reading)
        sched_yield();      /* (the reader's loop has begun: a loaded machine may
                             * otherwise run every round before its first read) */
    for (int round = 0; round < 20000; round++) {
        nw_score_slot *s = &race_board->slot[round % 2];
        nw_scoreboard_claim(s, 100 + round, 1, 0, 0);
        s->counts.served = 1;
        nw_scoreboard_fold(race_board, s);
    }
    race_done = 1;
    return NULL;
}

static void test_fold_race(void)
{
    int fd;
    race_board = nw_scoreboard_create(2, &fd);
    pthread_t t;
    pthread_create(&t, NULL, folder, NULL);
    uint64_t last = 0;
    int backwards = 0, reads = 0;
    while (!race_done) {
        nw_score_counts c;
        nw_scoreboard_totals(race_board, &c);
        if (c.served < last)
            backwards++;
        last = c.served;
        reads++;
        race_reading = 1;
    }
    pthread_join(t, NULL);
    if (!ok(backwards == 0, "totals never go backwards while workers are folded in"))
        diag("%d of %d reads went back", backwards, reads);
    nw_score_counts c;
    nw_scoreboard_totals(race_board, &c);
    is(c.served, 20000, "... and end at the sum");
    nw_scoreboard_unmap(race_board);
    close(fd);
}

/* The Date every answer of the server's own carries (the status pages'
 * too): nw_date_field's arithmetic against the C library's calendar, on
 * days that test it (leap days, centuries) and a spread of others. */
static void test_date_field(void)
{
    static const time_t days[] = { 0, 951782399, 951782400, 951868800, 978307199,
                                   1700000000, 2147483647, 4102444799, 4102444800,
                                   4107542400, 253402300799 };
    int bad = 0;
    uint64_t x = 88172645463325252ull;
    for (int i = 0; i < 10000 + (int)(sizeof days / sizeof days[0]); i++) {
        time_t t = i < (int)(sizeof days / sizeof days[0]) ? days[i] : (time_t)(x % 253402300800ull);
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        char got[NW_DATE_FIELD_LEN + 1], want[64];
        struct tm tm;
        gmtime_r(&t, &tm);
        strftime(want, sizeof want, "Date: %a, %d %b %Y %H:%M:%S GMT\r\n", &tm);
        size_t len = nw_date_field(got, t);
        got[len] = '\0';
        if (len != NW_DATE_FIELD_LEN || strcmp(got, want) != 0) {
            if (bad++ < 3)
                diag("%lld: got %s want %s", (long long)t, got, want);
        }
    }
    ok(!bad, "nw_date_field is the C library's IMF-fixdate, 1970 to 9999");
}

int main(void)
{
    test_date_field();
    test_buckets();
    test_routes();
    test_board();
    test_other_idle();
    test_pool_stuck();
    test_standby_unused();
    test_mean_parked();
    test_connection_states();
    test_recycling_turn();
    test_operator_fields();
    test_fold_race();
    done_testing();
    return tap_failed ? 1 : 0;
}
