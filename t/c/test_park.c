/* Unit tests for src/worker/nw_park.c (a worker's parked connections), printing
 * TAP. The "connections" are real non-blocking AF_UNIX socketpairs in a real
 * epoll set: the parked end is watched by the set, and writing a byte on
 * (or closing) the peer end makes it readable. Events are fed to
 * nw_park_event() by poll_events(), as the worker's loop does; one
 * unrelated fd (epoll data 7) shares the set. Deadlines are plain numbers
 * around nw_now_ms(): the module never reads the clock itself. Every
 * epoll_wait is bounded, and an alarm is the backstop. Build and run
 * through t/11-park-unit.t, or by hand:
 *   cc -std=gnu99 -g -O1 -Wall -Wextra -Werror -fsanitize=address,undefined \
 *      -Isrc/shared -Isrc/worker -Isrc/manager -It/c t/c/test_park.c src/worker/nw_park.c src/shared/nw_io.c -o /tmp/test_park \
 *      && /tmp/test_park
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "nw_io.h"
#include "nw_limits.h"
#include "nw_park.h"
#include "tap.h"

#define BASE        1000u   /* event_base of the set under test */
#define OTHER_DATA  7u      /* epoll data of the unrelated fd */
#define QUIET_MS    20      /* how long "no event" is waited for */
#define EVENT_MS    500     /* how long an expected event is waited for, at most */

/* A connection: fd is the parked end, peer the client's; w is the caller's
 * record of its registration in the epoll set, which nw_park_add() keeps. */
typedef struct {
    int fd, peer;
    nw_park_watch w;
} conn;

static int g_epfd = -1;
static nw_park g_park;          /* big (a few KiB); static, not on the stack */
static conn g_other;            /* the unrelated fd, level-triggered, data 7 */

/* What the last poll_events() saw. */
static int g_park_events;       /* events nw_park_event() claimed */
static int g_other_events;      /* events with OTHER_DATA */
static int g_wrong_claims;      /* nw_park_event() said 1 for data 7, or 0 for a slot's */

/* ---------------------------------------------------------------- helpers */

static void die(const char *what)
{
    perror(what);
    exit(2);
}

static void conn_open(conn *c)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0)
        die("socketpair");
    c->fd = sv[0];
    c->peer = sv[1];
    memset(&c->w, 0, sizeof c->w);
}

static void conn_close(conn *c)
{
    if (c->fd >= 0)
        close(c->fd);
    if (c->peer >= 0)
        close(c->peer);
    c->fd = c->peer = -1;
    c->w.registered = 0;
}

/* Make c's parked end readable: one byte from the peer. */
static void poke(conn *c)
{
    if (write(c->peer, "x", 1) != 1)
        die("write");
}

/* Read whatever is pending on c's parked end. */
static void drain(int fd)
{
    char buf[256];
    while (read(fd, buf, sizeof buf) > 0)
        ;
}

/* One epoll_wait (timeout_ms) with every event passed to nw_park_event(),
 * as the worker does; the counts go to g_*. Returns the events claimed. */
static int poll_once(int timeout_ms)
{
    struct epoll_event ev[2 * NW_MAX_PARKED];
    int n = epoll_wait(g_epfd, ev, (int)(sizeof ev / sizeof ev[0]), timeout_ms);
    if (n < 0 && errno != EINTR)
        die("epoll_wait");
    int claimed = 0;
    for (int k = 0; k < n; k++) {
        uint64_t data64 = ev[k].data.u64;
        uint32_t data = (uint32_t)data64;
        int r = nw_park_event(&g_park, data64, ev[k].events);
        if (data == OTHER_DATA) {
            g_other_events++;
            if (r != 0)
                g_wrong_claims++;
        } else if (data >= BASE && data < BASE + NW_MAX_PARKED) {
            if (r != 1)
                g_wrong_claims++;
            claimed += r == 1;
        } else {
            g_wrong_claims++;    /* nothing else was ever registered */
        }
    }
    g_park_events += claimed;
    return claimed;
}

/* Poll until `want` parked-connection events have arrived (or EVENT_MS has
 * passed); then one more quiet poll, to catch any extra ones. Returns the
 * number of parked-connection events seen. */
static int poll_events(int want)
{
    g_park_events = g_other_events = g_wrong_claims = 0;
    nw_msec until = nw_now_ms() + EVENT_MS;
    while (g_park_events < want && nw_now_ms() < until)
        poll_once(10);
    poll_once(want ? 0 : QUIET_MS);
    return g_park_events;
}

/* nw_park_take_ready, its hangup flag kept in g_hangup. */
static int g_hangup;
static void *take_ready(void)
{
    return nw_park_take_ready(&g_park, &g_hangup);
}

/* The fd parked in slot i, or -1: read from the set's arrays. */
static int parked_fd(int i)
{
    return g_park.item[i] ? g_park.fd[i] : -1;
}

/* The slot fd is parked in, or -1. */
static int slot_of(int fd)
{
    for (int i = 0; i < NW_MAX_PARKED; i++)
        if (parked_fd(i) == fd)
            return i;
    return -1;
}

/* The epoll data of slot i's current registration. */
static uint64_t slot_data(int i)
{
    return (uint64_t)g_park.gen[i] << 32 | (BASE + (uint32_t)i);
}

/* Park c until the deadline, its socket maybe not drained (so the watch is
 * always (re-)registered, which reports data already there); the result
 * of nw_park_add. */
static int park(conn *c, nw_msec until)
{
    return nw_park_add(&g_park, c->fd, c, until, 0, &c->w);
}

/* The same, for a connection whose socket the caller has drained. */
static int park_drained(conn *c, nw_msec until)
{
    return nw_park_add(&g_park, c->fd, c, until, 1, &c->w);
}

/* Take every parked connection out (everything=1); each one's fd leaves the
 * epoll set, so its watch is cleared. Returns how many there were. */
static int empty_set(void)
{
    int n = 0;
    conn *c;
    while ((c = nw_park_take_expired(&g_park, 0, 1)) != NULL) {
        c->w.registered = 0;
        n++;
    }
    return n;
}

static int raise_nofile(rlim_t want)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return 0;
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
        getrlimit(RLIMIT_NOFILE, &rl);
    }
    return rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= want;
}

/* ------------------------------------------------------------------ tests */

static void test_empty(void)
{
    diag("an empty set");
    is(g_park.count, 0, "empty: count 0");
    is(g_park.ready_count, 0, "empty: ready_count 0");
    ok(take_ready() == NULL, "empty: take_ready is NULL");
    ok(nw_park_take_expired(&g_park, nw_now_ms() + 100000, 0) == NULL,
       "empty: take_expired is NULL");
    ok(nw_park_take_expired(&g_park, 0, 1) == NULL,
       "empty: take_expired(everything) is NULL");
    is(nw_park_nearest(&g_park), 0, "empty: nearest is 0");

    int any = 0;
    for (int i = 0; i < NW_MAX_PARKED; i++)
        any |= parked_fd(i) != -1;
    ok(!any, "empty: no slot holds an fd");
}

static void test_event_filter(void)
{
    diag("nw_park_event on data that is not a parked connection's");
    is(nw_park_event(&g_park, OTHER_DATA, EPOLLIN), 0, "event: data 7 (below the base) is not ours");
    is(nw_park_event(&g_park, BASE - 1, EPOLLIN), 0, "event: base - 1 is not ours");
    is(nw_park_event(&g_park, BASE + NW_MAX_PARKED, EPOLLIN), 0, "event: base + NW_MAX_PARKED is not ours");
    is(nw_park_event(&g_park, 0xffffffffu, EPOLLIN), 0, "event: 0xffffffff is not ours");
    is(nw_park_event(&g_park, BASE + 5, EPOLLIN), 1, "event: a free slot's data is ours");
    is(nw_park_event(&g_park, (uint64_t)77 << 32 | (BASE + 5), EPOLLIN), 1,
       "event: ... with any generation");
    is(nw_park_event(&g_park, (uint64_t)77 << 32 | OTHER_DATA, EPOLLIN), 0,
       "event: data 7 with high bits set is still not ours");
    is(g_park.ready_count, 0, "event: ... but a free slot does not become ready");
    is(g_park.count, 0, "event: ... nor in use");

    /* the unrelated fd through real epoll: its event is passed over */
    poke(&g_other);
    is(poll_events(0), 0, "unrelated fd readable: no parked-connection event");
    ok(g_other_events >= 1, "unrelated fd readable: its event (data 7) arrived");
    is(g_wrong_claims, 0, "unrelated fd readable: nw_park_event returned 0 for it");
    drain(g_other.fd);
    poll_events(0);
    is(g_other_events, 0, "unrelated fd drained: quiet again");
}

/* 1 and 2: add/take_ready, and edge-triggered watching. */
static conn a, b, c;
static nw_msec g_c_until;       /* #3's deadline (it stays parked for a while) */

static void test_add_take_ready(void)
{
    diag("add and take_ready");
    nw_msec now = nw_now_ms();
    conn_open(&a);
    conn_open(&b);
    conn_open(&c);

    nw_park_watch w0 = { 0, 0, 0 };
    is(nw_park_add(&g_park, a.fd, NULL, now + 1000, 1, &w0), -1, "add: a NULL item is refused");
    is(w0.registered, 0, "add: ... and the watch is left alone");
    is(g_park.count, 0, "add: ... and nothing is parked");

    is(park(&a, now + 1000), 0, "add #1");
    is(a.w.registered, 1, "add #1: registered set to 1");
    is(a.w.slot, slot_of(a.fd), "add #1: the watch names its slot");
    ok(a.w.gen == g_park.gen[a.w.slot] && a.w.gen != 0, "add #1: ... and the slot's new generation");
    is(park(&b, now + 1001), 0, "add #2");
    g_c_until = now + 1002;
    is(park(&c, g_c_until), 0, "add #3");
    is(g_park.count, 3, "three parked: count 3");
    is(g_park.ready_count, 0, "three parked: ready_count 0");
    ok(slot_of(a.fd) >= 0 && slot_of(b.fd) >= 0 && slot_of(c.fd) >= 0
       && slot_of(a.fd) != slot_of(b.fd) && slot_of(b.fd) != slot_of(c.fd)
       && slot_of(a.fd) != slot_of(c.fd),
       "three parked: each in its own slot");
    is(nw_park_nearest(&g_park), now + 1000, "three parked: nearest is #1's deadline");

    is(poll_events(0), 0, "nothing written: no events");
    ok(take_ready() == NULL, "nothing written: take_ready is NULL");

    poke(&b);
    is(poll_events(1), 1, "#2 readable: one event");
    is(g_wrong_claims, 0, "#2 readable: nw_park_event claimed it");
    is(g_park.ready_count, 1, "#2 readable: ready_count 1");
    is(g_park.count, 3, "#2 readable: count still 3");
    is(nw_park_nearest(&g_park), now + 1000, "#2 readable: nearest still #1's");

    /* a repeated event does not count twice */
    int slot_b = slot_of(b.fd);
    is(nw_park_event(&g_park, slot_data(slot_b), EPOLLIN), 1, "#2 event again: claimed");
    is(g_park.ready_count, 1, "#2 event again: ready_count still 1");

    ok(take_ready() == &b, "take_ready returns #2");
    is(g_hangup, 0, "... data only: no hangup");
    is(g_park.count, 2, "after take: count 2");
    is(g_park.ready_count, 0, "after take: ready_count 0");
    is(slot_of(b.fd), -1, "after take: #2's slot is free");
    is(parked_fd(slot_b), -1, "after take: that slot holds no fd");
    ok(slot_of(a.fd) >= 0 && slot_of(c.fd) >= 0, "after take: #1 and #3 stay parked");
    ok(take_ready() == NULL, "after take: take_ready is NULL again");
    /* an event for an earlier generation of the slot */
    is(nw_park_event(&g_park, (uint64_t)(g_park.gen[slot_b] - 1) << 32 | (BASE + (uint32_t)slot_b),
                     EPOLLIN),
       1, "old-generation event for the freed slot: claimed");
    is(g_park.pending[slot_b], 0, "old-generation event: not pending");
    /* an event for the slot just freed (the connection is away) */
    is(nw_park_event(&g_park, slot_data(slot_b), EPOLLIN), 1, "event for the freed slot: claimed");
    is(g_park.pending[slot_b], 1, "event for the freed slot: pending for its connection");
    is(g_park.ready_count, 0, "event for the freed slot: ready_count still 0");
    ok(take_ready() == NULL, "event for the freed slot: take_ready still NULL");
    is(g_park.count, 2, "event for the freed slot: count still 2");
    is(b.w.registered, 1, "after take: #2 is still registered (left in place)");
    is(b.w.slot, slot_b, "after take: #2's watch still names its slot");
}

static void test_edge(void)
{
    diag("edge-triggered: a connection away being served keeps its watch");
    nw_msec now = nw_now_ms();
    int slot_b = b.w.slot;
    uint32_t gen_b = b.w.gen;

    /* #2 is away (taken) with one byte unread and an event pending */
    is(park_drained(&b, now + 2000), 0, "back to its slot (drained)");
    is(slot_of(b.fd), slot_b, "... the same slot");
    is(g_park.gen[slot_b], gen_b, "... under the same generation (no re-registration)");
    is(g_park.ready_count, 1, "... and ready at once: the pending event");
    ok(take_ready() == &b, "take_ready returns #2");
    drain(b.fd);

    is(park_drained(&b, now + 2000), 0, "back again, nothing pending");
    is(g_park.gen[slot_b], gen_b, "... still the same generation");
    is(g_park.ready_count, 0, "... not ready");
    is(poll_events(0), 0, "... and quiet");
    poke(&b);
    is(poll_events(1), 1, "written: an event (the watch was never re-armed)");
    ok(take_ready() == &b, "... take_ready returns #2");
    poke(&b);
    is(poll_events(1), 1, "written while away: an event");
    is(g_park.pending[slot_b], 1, "... kept as pending");
    ok(take_ready() == NULL, "... nothing ready meanwhile");
    is(park_drained(&b, now + 2000), 0, "back in its slot");
    ok(take_ready() == &b, "... ready at once (the pending event)");
    drain(b.fd);

    /* Not drained: data already there raises no edge of its own, so the
     * watch is re-armed (MOD) in its slot, which reports it. */
    poke(&b);
    poll_events(1);
    g_park.pending[slot_b] = 0;     /* as if the event had come before the read */
    is(park(&b, now + 2000), 0, "back, not drained, data unread");
    is(slot_of(b.fd), slot_b, "... the same slot");
    ok(g_park.gen[slot_b] == gen_b + 1 && b.w.gen == gen_b + 1, "... re-registered: a new generation");
    is(poll_events(1), 1, "... and the unread data is reported");
    ok(take_ready() == &b, "... take_ready returns #2");

    /* Its slot taken by another meanwhile: a new slot, re-registered with
     * MOD, which reports the unread byte; the old registration's events
     * are stale and touch nobody. */
    uint64_t old_data = slot_data(slot_b);
    conn y;
    conn_open(&y);
    is(park_drained(&y, now + 2000), 0, "another connection parked while #2 is away");
    is(slot_of(y.fd), slot_b, "... it gets #2's slot (the top of the free stack)");
    ok(g_park.gen[slot_b] != b.w.gen, "... under a new generation");
    is(park_drained(&b, now + 2000), 0, "#2 back (drained): its slot is taken");
    ok(slot_of(b.fd) >= 0 && slot_of(b.fd) != slot_b, "... so it goes to another slot");
    ok(b.w.slot == slot_of(b.fd) && b.w.gen == g_park.gen[b.w.slot], "... and its watch says so");
    is(poll_events(1), 1, "... MOD reports its unread byte");
    ok(take_ready() == &b, "... take_ready returns #2");
    is(nw_park_event(&g_park, old_data, EPOLLIN), 1, "an event with #2's old data: claimed");
    is(g_park.ready_count, 0, "... but the slot's new owner is not made ready");
    ok(take_ready() == NULL, "... nothing ready");
    poke(&y);
    is(poll_events(1), 1, "the new owner written: its event");
    ok(take_ready() == &y, "... take_ready returns it");
    epoll_ctl(g_epfd, EPOLL_CTL_DEL, y.fd, NULL);
    conn_close(&y);
    drain(b.fd);

    /* A stale "not registered" (ADD meets EEXIST) falls back to MOD. */
    nw_park_watch w0 = { 0, 0, 0 };
    poke(&b);
    is(nw_park_add(&g_park, b.fd, &b, now + 2000, 1, &w0), 0,
       "re-park #2 with a stale registered=0: ADD fails, MOD re-arms it");
    is(w0.registered, 1, "... registered is now 1");
    is(g_park.count, 3, "... count 3");
    is(poll_events(1), 1, "re-armed with data pending: reported");
    ok(take_ready() == &b, "... take_ready returns #2");
    b.w = w0;
    drain(b.fd);
    is(poll_events(0), 0, "after the take: quiet");
    is(g_park.count, 2, "after the take: count 2");

    /* A stale "registered" (MOD meets ENOENT) falls back to ADD. */
    conn z;
    conn_open(&z);
    nw_park_watch w1 = { 1, -1, 0 };
    is(nw_park_add(&g_park, z.fd, &z, now + 2000, 1, &w1), 0,
       "park a new fd with a stale registered=1: MOD fails, ADD watches it");
    poke(&z);
    is(poll_events(1), 1, "... and it is reported");
    ok(take_ready() == &z, "... take_ready returns it");
    epoll_ctl(g_epfd, EPOLL_CTL_DEL, z.fd, NULL);
    conn_close(&z);
}

static void test_round_robin(void)
{
    diag("round robin over several ready connections");
    nw_msec now = nw_now_ms();
    conn d, e;
    conn_open(&d);
    conn_open(&e);
    /* a and c are parked; b (registered, away) is re-parked with MOD */
    is(park(&b, now + 3000), 0, "rr: re-park #2 (MOD)");
    is(park(&d, now + 3001), 0, "rr: park #4");
    is(park(&e, now + 3002), 0, "rr: park #5");
    is(g_park.count, 5, "rr: five parked");

    conn *want[4] = { &a, &b, &d, &e };
    for (int k = 0; k < 4; k++)
        poke(want[k]);
    is(poll_events(4), 4, "rr: four made readable, four events");
    is(g_park.ready_count, 4, "rr: ready_count 4");
    is(nw_park_nearest(&g_park), g_c_until, "rr: nearest is #3's (the only one not ready)");

    for (int k = 0; k < 4; k++)     /* (what the worker sets: its nw_conn) */
        g_park.warm[slot_of(want[k]->fd)][0] = &want[k]->fd;
    int seen[4] = { 0, 0, 0, 0 }, nulls = 0, strays = 0, peeked_right = 0, warm_right = 0;
    for (int k = 0; k < 4; k++) {
        const void *const *warm;
        void *next = nw_park_peek_ready(&g_park, &warm);
        const void *warm0 = warm ? warm[0] : NULL;     /* (the take clears the slot's) */
        conn *got = take_ready();
        peeked_right += next == got;
        warm_right += got && warm0 == &got->fd;
        int hit = 0;
        for (int j = 0; j < 4; j++)
            if (got == want[j]) {
                seen[j]++;
                hit = 1;
            }
        nulls += got == NULL;
        strays += got != NULL && !hit;
    }
    is(peeked_right, 4, "rr: peek_ready names the one taken next, each time");
    is(warm_right, 4, "rr: ... with its warm pointer");
    {
        const void *const *warm = g_park.warm[0];
        ok(nw_park_peek_ready(&g_park, &warm) == NULL && warm == NULL,
           "rr: with none ready, peek_ready gives NULL, and no warm pointer");
    }
    is(nulls, 0, "rr: no NULL before all four are taken");
    is(strays, 0, "rr: only readable ones taken");
    ok(seen[0] == 1 && seen[1] == 1 && seen[2] == 1 && seen[3] == 1,
       "rr: each readable one taken exactly once");
    ok(take_ready() == NULL, "rr: then NULL");
    is(g_park.count, 1, "rr: count 1 (#3 left)");
    is(g_park.ready_count, 0, "rr: ready_count 0");
    is(slot_of(c.fd) >= 0, 1, "rr: #3 still parked");

    /* No starvation: one that is ready again at once (re-parked into the
     * slot it just left, data still pending) must not be taken twice in a
     * row while another waits. */
    for (int k = 0; k < 4; k++)
        drain(want[k]->fd);
    is(park(&a, now + 4000), 0, "starve: re-park #1");
    is(park(&b, now + 4001), 0, "starve: re-park #2");
    poke(&a);
    poke(&b);
    is(poll_events(2), 2, "starve: both readable");
    conn *first = take_ready();
    ok(first == &a || first == &b, "starve: one of them taken");
    conn *other = first == &a ? &b : &a;
    is(park(first, now + 4002), 0, "starve: the taken one re-parked at once");
    is(poll_events(1), 1, "starve: ... and readable again (data pending)");
    is(g_park.ready_count, 2, "starve: two ready");
    ok(take_ready() == other, "starve: the other one comes next");
    ok(take_ready() == first, "starve: then the first again");
    ok(take_ready() == NULL, "starve: then NULL");
    drain(a.fd);
    drain(b.fd);

    is(empty_set(), 1, "rr: emptied (#3 was left)");
    conn_close(&d);
    conn_close(&e);
}

static void test_expiry(void)
{
    diag("expiry in deadline order");
    nw_msec t = nw_now_ms();
    conn x[5];
    for (int k = 0; k < 5; k++) {
        conn_open(&x[k]);
        is(park(&x[k], t + 10 * (k + 1)), 0, "expiry: park one, deadline +10 each");
    }
    poke(&x[1]);                    /* the second oldest is readable */
    is(poll_events(1), 1, "expiry: #2 readable");
    is(nw_park_nearest(&g_park), t + 10, "expiry: nearest is #1's");

    ok(nw_park_take_expired(&g_park, t + 5, 0) == NULL, "expiry: none expired at t+5");
    ok(nw_park_take_expired(&g_park, t + 9, 0) == NULL, "expiry: none expired at t+9");
    ok(nw_park_take_expired(&g_park, t + 25, 0) == &x[0], "expiry: t+25 gives #1");
    x[0].w.registered = 0;
    ok(nw_park_take_expired(&g_park, t + 25, 0) == NULL,
       "expiry: t+25 again: NULL (#2 expired but readable, #3 not expired)");
    is(g_park.count, 4, "expiry: count 4");
    is(nw_park_nearest(&g_park), t + 30, "expiry: nearest skips readable #2: #3's");

    ok(nw_park_take_expired(&g_park, t + 30, 0) == &x[2],
       "expiry: a deadline equal to now has passed (#3 at t+30)");
    x[2].w.registered = 0;
    ok(nw_park_take_expired(&g_park, t + 1000, 0) == &x[3], "expiry: t+1000 gives #4");
    x[3].w.registered = 0;
    ok(nw_park_take_expired(&g_park, t + 1000, 0) == &x[4], "expiry: then #5");
    x[4].w.registered = 0;
    ok(nw_park_take_expired(&g_park, t + 1000, 0) == NULL,
       "expiry: then NULL (only readable #2 left)");
    is(g_park.count, 1, "expiry: count 1");
    is(g_park.ready_count, 1, "expiry: ready_count 1");
    is(nw_park_nearest(&g_park), 0, "expiry: all left are readable: nearest 0");

    /* the expired ones left the epoll set */
    poke(&x[0]);
    poke(&x[2]);
    poke(&x[3]);
    is(poll_events(0), 0, "expiry: written after expiring: no events");
    is(g_other_events, 0, "expiry: ... none at all");
    nw_park_watch w0 = { 0, 0, 0 };
    is(nw_park_add(&g_park, x[0].fd, &x[0], t + 2000, 1, &w0), 0,
       "expiry: re-park #1 with registered=0 (ADD) works: it had been removed");
    x[0].w = w0;
    is(park(&x[2], t + 2001), 0, "expiry: re-park #3 with ADD works too");
    is(poll_events(2), 2, "expiry: both re-added, data pending: two events");

    ok(take_ready() != NULL, "expiry: take_ready gives one");
    ok(take_ready() != NULL, "expiry: and another");
    ok(take_ready() != NULL, "expiry: and the third (#2)");
    ok(take_ready() == NULL, "expiry: then none");
    is(g_park.count, 0, "expiry: empty");
    for (int k = 0; k < 5; k++)
        conn_close(&x[k]);
}

static void test_nearest(void)
{
    diag("nearest");
    nw_msec t = nw_now_ms();
    conn p, q;
    conn_open(&p);
    conn_open(&q);
    is(nw_park_nearest(&g_park), 0, "nearest: empty: 0");
    is(park(&p, t + 100), 0, "nearest: park one");
    is(nw_park_nearest(&g_park), t + 100, "nearest: its deadline");
    is(park(&q, t + 200), 0, "nearest: park another, later");
    is(nw_park_nearest(&g_park), t + 100, "nearest: still the older one's");
    poke(&p);
    is(poll_events(1), 1, "nearest: the older one readable");
    is(nw_park_nearest(&g_park), t + 200, "nearest: skips it");
    poke(&q);
    is(poll_events(1), 1, "nearest: both readable");
    is(nw_park_nearest(&g_park), 0, "nearest: all ready: 0");
    ok(take_ready() != NULL && take_ready() != NULL,
       "nearest: both taken");
    is(nw_park_nearest(&g_park), 0, "nearest: empty again: 0");
    conn_close(&p);
    conn_close(&q);
}

static void test_everything(void)
{
    diag("take_expired(everything) empties the set");
    nw_msec t = nw_now_ms();
    enum { N = 6 };
    conn x[N];
    for (int k = 0; k < N; k++) {
        conn_open(&x[k]);
        is(park(&x[k], t + 100000 + k), 0, "everything: park one (far deadline)");
    }
    poke(&x[1]);
    poke(&x[4]);
    is(poll_events(2), 2, "everything: two readable");
    ok(nw_park_take_expired(&g_park, t, 0) == NULL, "everything: nothing expired yet");

    int seen[N] = { 0 }, strays = 0, n = 0;
    conn *got;
    while (n <= N && (got = nw_park_take_expired(&g_park, t, 1)) != NULL) {
        n++;
        if (got >= x && got < x + N)
            seen[got - x]++;
        else
            strays++;
        got->w.registered = 0;
    }
    is(n, N, "everything: returns as many as parked");
    is(strays, 0, "everything: only parked items");
    int once = 1;
    for (int k = 0; k < N; k++)
        once &= seen[k] == 1;
    ok(once, "everything: each item exactly once (readable ones included)");
    is(g_park.count, 0, "everything: count 0");
    is(g_park.ready_count, 0, "everything: ready_count 0");
    is(nw_park_nearest(&g_park), 0, "everything: nearest 0");
    ok(take_ready() == NULL, "everything: take_ready NULL");

    for (int k = 0; k < N; k++)
        poke(&x[k]);
    is(poll_events(0), 0, "everything: all left the epoll set (writes: no events)");
    int added = 0;
    for (int k = 0; k < N; k++)
        added += park(&x[k], t + 200000) == 0;
    is(added, N, "everything: each can be ADDed again");
    is(poll_events(N), N, "everything: ... and is watched again");
    is(empty_set(), N, "everything: emptied again");
    for (int k = 0; k < N; k++)
        conn_close(&x[k]);
}

static void test_full(void)
{
    diag("a full set");
    if (!raise_nofile(2 * NW_MAX_PARKED + 64)) {
        ok(1, "# SKIP RLIMIT_NOFILE too low for the full-set test");
        return;
    }
    static conn m[NW_MAX_PARKED];
    conn extra;
    nw_msec t = nw_now_ms();
    int added = 0;
    for (int k = 0; k < NW_MAX_PARKED; k++) {
        conn_open(&m[k]);
        added += park(&m[k], t + 1000 + k) == 0;
    }
    is(added, NW_MAX_PARKED, "full: NW_MAX_PARKED adds succeed");
    is(g_park.count, NW_MAX_PARKED, "full: count NW_MAX_PARKED");
    int used = 0;
    for (int i = 0; i < NW_MAX_PARKED; i++)
        used += parked_fd(i) >= 0;
    is(used, NW_MAX_PARKED, "full: every slot holds an fd");

    conn_open(&extra);
    is(park(&extra, t + 5000), -1, "full: one more add is refused");
    is(extra.w.registered, 0, "full: ... the watch (not registered) left alone");
    nw_park_watch w1 = { 1, 3, 99 };
    is(nw_park_add(&g_park, extra.fd, &extra, t + 5000, 1, &w1), -1,
       "full: refused with registered=1 too");
    ok(w1.registered == 1 && w1.slot == 3 && w1.gen == 99, "full: ... the watch (registered) left alone");
    is(g_park.count, NW_MAX_PARKED, "full: count unchanged");
    is(slot_of(extra.fd), -1, "full: the extra fd is not parked");

    /* readiness still works when full */
    poke(&m[100]);
    is(poll_events(1), 1, "full: one readable");
    int slot = slot_of(m[100].fd);
    ok(take_ready() == &m[100], "full: take_ready gives it");
    drain(m[100].fd);
    is(park(&extra, t + 5000), 0, "full: after a take, the extra one can be ADDed");
    is(extra.w.registered, 1, "full: ... registered set");
    is(slot_of(extra.fd), slot, "full: ... into the slot just freed");
    is(park(&m[100], t + 5001), -1, "full again: the taken one cannot come back");

    ok(nw_park_take_expired(&g_park, t + 1000, 0) == &m[0], "full: the oldest expires");
    m[0].w.registered = 0;
    is(park(&m[100], t + 5001), 0, "full: after an expiry, re-park (MOD) works");
    is(g_park.count, NW_MAX_PARKED, "full: count NW_MAX_PARKED again");

    /* everything comes out once, oldest first among the not-ready */
    poke(&m[5]);
    is(poll_events(1), 1, "full: one more readable");
    ok(nw_park_take_expired(&g_park, t + 1000 + 10, 0) == &m[1], "full: expiry order: #2");
    m[1].w.registered = 0;
    int in_order = 1;
    for (int k = 2; k <= 10; k++) {
        if (k == 5)
            continue;               /* readable: skipped */
        conn *got = nw_park_take_expired(&g_park, t + 1000 + 10, 0);
        in_order &= got == &m[k];
        if (got)
            got->w.registered = 0;
    }
    ok(in_order, "full: then #3..#11 in order, readable #6 skipped");
    ok(nw_park_take_expired(&g_park, t + 1000 + 10, 0) == NULL, "full: then none expired");
    ok(take_ready() == &m[5], "full: readable #6 by take_ready");

    int rest = g_park.count;
    is(empty_set(), rest, "full: everything takes the rest");
    is(g_park.count, 0, "full: empty");
    for (int k = 0; k < NW_MAX_PARKED; k++)
        conn_close(&m[k]);
    conn_close(&extra);
}

static void test_eof(void)
{
    diag("EOF counts as readable");
    nw_msec t = nw_now_ms();
    conn p, q, r;
    conn_open(&p);
    conn_open(&q);
    conn_open(&r);
    is(park(&p, t + 1000), 0, "eof: park #1");
    is(park(&q, t + 1001), 0, "eof: park #2");
    is(poll_events(0), 0, "eof: quiet");

    close(p.peer);
    p.peer = -1;
    is(poll_events(1), 1, "eof: peer closed: an event");
    is(g_park.ready_count, 1, "eof: ready_count 1");
    ok(take_ready() == &p, "eof: take_ready gives it");
    is(g_hangup, 1, "eof: ... with hangup");

    poke(&q);
    shutdown(q.peer, SHUT_WR);
    is(poll_events(1), 1, "eof: a byte, then the peer half-closed (SHUT_WR): an event");
    ok(take_ready() == &q, "eof: take_ready gives it");
    is(g_hangup, 1, "eof: ... with hangup (the FIN came with the byte: one edge)");

    /* A FIN while the connection is away: pending, and reported when it
     * comes back to its slot. */
    conn s;
    conn_open(&s);
    is(park_drained(&s, t + 1003), 0, "eof: park one more");
    poke(&s);
    is(poll_events(1), 1, "eof: it is written");
    ok(take_ready() == &s, "eof: taken");
    is(g_hangup, 0, "eof: ... no hangup yet");
    drain(s.fd);
    close(s.peer);
    s.peer = -1;
    is(poll_events(1), 1, "eof: its peer closes while it is away: an event");
    is(park_drained(&s, t + 1004), 0, "eof: back in its slot");
    ok(take_ready() == &s, "eof: ... ready at once");
    is(g_hangup, 1, "eof: ... with hangup");
    conn_close(&s);

    close(r.peer);
    r.peer = -1;
    is(park(&r, t + 1002), 0, "eof: park one whose peer is gone already");
    is(poll_events(1), 1, "eof: ... reported at once");
    ok(take_ready() == &r, "eof: ... and taken");
    is(g_park.count, 0, "eof: empty");
    conn_close(&p);
    conn_close(&q);
    conn_close(&r);
}

int main(void)
{
    alarm(20);      /* a hang is a failure, not a stuck test run */
    g_epfd = epoll_create1(EPOLL_CLOEXEC);
    if (g_epfd < 0)
        die("epoll_create1");
    conn_open(&g_other);
    struct epoll_event ev = { .events = EPOLLIN, .data.u32 = OTHER_DATA };
    if (epoll_ctl(g_epfd, EPOLL_CTL_ADD, g_other.fd, &ev) != 0)
        die("epoll_ctl");

    nw_park_init(&g_park, g_epfd, BASE);
    test_empty();
    test_event_filter();
    test_add_take_ready();
    test_edge();
    test_round_robin();
    test_expiry();
    test_nearest();
    test_everything();
    test_full();
    test_eof();

    is(g_park.count, 0, "at the end: the set is empty");
    conn_close(&a);
    conn_close(&b);
    conn_close(&c);
    conn_close(&g_other);
    close(g_epfd);
    return done_testing();
}
