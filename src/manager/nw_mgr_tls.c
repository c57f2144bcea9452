/* See nw_mgr_tls.h. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE     /* accept4 */
#endif
#include "nw_mgr_tls.h"
#include "nw_proxy.h"

#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define NW_MGR_TLS_LISTENER 1
#define NW_MGR_TLS_TCP      2
#define NW_MGR_TLS_PAIR     3
#define NW_MGR_TLS_POOL     4

#define TLS_EVENTS          64          /* its events taken per run */
#define TLS_ACCEPT_BATCH    16          /* connections taken per listener event */
#define TLS_LINGER_MS       2000        /* a client has this long to close after our close_notify */
#define TLS_PAUSE_MS        100         /* out of descriptors: no accept for this long */
#define TLS_ROTATE_MS       (3600 * 1000)  /* a new ticket key every hour */

/* Where a connection is in its life. */
enum { SHAKING, RELAYING, CLOSING };

struct nw_mgr_tls_conn {
    struct nw_tls_conn *tls;
    int fd;                         /* the client's TCP socket */
    int pair;                       /* our end of the socketpair; -1 before it */
    int listener;                   /* the app's listener index */
    int state;
    int tcp_events, pair_events;    /* what each is in the set for (0: not in it) */
    int plain;                      /* a plain-HTTP client, answered 400, lingering */
    int in_pool;                    /* a handshake thread runs its step: hands off */
    int proxy_wait;                 /* --proxy-protocol: its header is still being read */
    char *proxy_buf;                /* ...what came of it so far (NW_PROXY_V2_MAX bytes) */
    size_t proxy_len;
    nw_proxy_info addrs;            /* the header's addresses (addrs_given) */
    int addrs_given;
    nw_tls_job job;
    nw_msec deadline;
    nw_mgr_tls_list *list;
    struct nw_mgr_tls_conn *prev, *next;
    nw_mgr_tls_ref tcp_ref, pair_ref;
};

/* ------------------------------------------------------------ lists */

static void list_add(nw_mgr_tls_list *l, struct nw_mgr_tls_conn *c)
{
    c->list = l;
    c->next = NULL;
    c->prev = l->tail;
    if (l->tail)
        l->tail->next = c;
    else
        l->head = c;
    l->tail = c;
    l->n++;
}

static void list_del(struct nw_mgr_tls_conn *c)
{
    nw_mgr_tls_list *l = c->list;
    if (!l)
        return;
    if (c->prev)
        c->prev->next = c->next;
    else
        l->head = c->next;
    if (c->next)
        c->next->prev = c->prev;
    else
        l->tail = c->prev;
    l->n--;
    c->list = NULL;
    c->prev = c->next = NULL;
}

static void move_to(struct nw_mgr_tls_conn *c, nw_mgr_tls_list *l, int state, nw_msec deadline)
{
    list_del(c);
    c->state = state;
    c->deadline = deadline;
    list_add(l, c);
}

/* ------------------------------------------------------------ the set */

/* fd in the set for events (EPOLLIN/EPOLLOUT), or out of it for none:
 * an end we wait nothing from must not wake us with its hang-up. */
static int set_events(nw_mgr_tls *t, int fd, int *now, int want, nw_mgr_tls_ref *ref)
{
    struct epoll_event ev = { .events = (uint32_t)want, .data.ptr = ref };
    int r = 0;
    if (want == *now)
        return 0;
    if (!want)
        r = epoll_ctl(t->ep, EPOLL_CTL_DEL, fd, NULL);
    else
        r = epoll_ctl(t->ep, *now ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, fd, &ev);
    *now = want;
    return r;
}

static void watch_listeners(nw_mgr_tls *t, int on)
{
    for (int i = 0; i < t->n; i++) {
        struct epoll_event ev = { .events = EPOLLIN, .data.ptr = &t->lref[i] };
        epoll_ctl(t->ep, on ? EPOLL_CTL_ADD : EPOLL_CTL_DEL, t->fds[i], &ev);
    }
    t->accepting = on;
}

/* ------------------------------------------------------------ closing */

/* Closed now, freed after this batch of events (one of them may name it). */
static void conn_close(nw_mgr_tls *t, struct nw_mgr_tls_conn *c)
{
    list_del(c);
    nw_mgr_table_hold_outside(t->table, -1);
    set_events(t, c->fd, &c->tcp_events, 0, NULL);
    close(c->fd);
    if (c->pair >= 0) {
        set_events(t, c->pair, &c->pair_events, 0, NULL);
        close(c->pair);
    }
    nw_tls_conn_free(c->tls);
    c->tls = NULL;
    free(c->proxy_buf);
    c->proxy_buf = NULL;
    c->next = t->dead;
    t->dead = c;
}

static void free_dead(nw_mgr_tls *t)
{
    while (t->dead) {
        struct nw_mgr_tls_conn *c = t->dead;
        t->dead = c->next;
        free(c);
    }
}

static void refused(nw_mgr_tls *t, struct nw_mgr_tls_conn *c, enum nw_tls_reason r)
{
    t->refused[r > NW_TLS_R_NONE && r < NW_TLS_R_COUNT ? r : NW_TLS_R_OTHER]++;
    nw_log_limited(&t->refused_said, nw_mgr_now(t->clock), "info",
                   "TLS connection refused: %s", nw_tls_reason_name(r));
    conn_close(t, c);
}

/* Plain HTTP on a TLS port: what it sent is read and dropped (a close
 * with unread bytes would reset the 400 away), the 400 sent, and the
 * client given TLS_LINGER_MS to read it and close. */
static void answer_plain(nw_mgr_tls *t, struct nw_mgr_tls_conn *c)
{
    char sink[4096];
    size_t len;
    const char *msg = nw_tls_plain_400(&len);
    t->refused[NW_TLS_R_PLAIN]++;
    while (recv(c->fd, sink, sizeof sink, MSG_DONTWAIT) > 0)
        continue;
    if (send(c->fd, msg, len, MSG_DONTWAIT | MSG_NOSIGNAL) < 0 || shutdown(c->fd, SHUT_WR) < 0
        || set_events(t, c->fd, &c->tcp_events, EPOLLIN, &c->tcp_ref) < 0) {
        conn_close(t, c);
        return;
    }
    c->plain = 1;
    move_to(c, &t->closing, CLOSING, nw_mgr_now(t->clock) + TLS_LINGER_MS);
}

/* A plain client after its 400: read and dropped until it closes. */
static void plain_readable(nw_mgr_tls *t, struct nw_mgr_tls_conn *c)
{
    char sink[4096];
    ssize_t n = recv(c->fd, sink, sizeof sink, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
        conn_close(t, c);
}

/* ------------------------------------------------------------ relaying */

static int events_of(int mask, int read_bit, int write_bit)
{
    return ((mask & read_bit) ? EPOLLIN : 0) | ((mask & write_bit) ? EPOLLOUT : 0);
}

/* Copy what can be copied both ways; watch what it then waits for. Once
 * all it waits for is the client's read side, the worker's side is over
 * (close_notify sent): the client has TLS_LINGER_MS to close. */
static void relay(nw_mgr_tls *t, struct nw_mgr_tls_conn *c, int ready)
{
    int mask = nw_tls_relay(c->tls, c->pair, ready);
    if (!mask) {
        conn_close(t, c);
        return;
    }
    if (set_events(t, c->fd, &c->tcp_events,
                   events_of(mask, NW_TLS_WAIT_TCP_READ, NW_TLS_WAIT_TCP_WRITE), &c->tcp_ref) < 0
        || set_events(t, c->pair, &c->pair_events,
                      events_of(mask, NW_TLS_WAIT_PAIR_READ, NW_TLS_WAIT_PAIR_WRITE),
                      &c->pair_ref) < 0) {
        conn_close(t, c);
        return;
    }
    if (mask == NW_TLS_WAIT_TCP_READ && c->state == RELAYING)
        move_to(c, &t->closing, CLOSING, nw_mgr_now(t->clock) + TLS_LINGER_MS);
}

/* The PROXY v2 header the plain stream begins with: the client's address
 * and the one it reached (the balancer's header's, under --proxy-protocol). */
static int send_addresses(const struct nw_mgr_tls_conn *c, int to)
{
    struct sockaddr_storage peer, local;
    socklen_t plen = sizeof peer, llen = sizeof local;
    char hdr[NW_PROXY_V2_ROOM];
    size_t len;
    if (c->addrs_given) {
        len = nw_proxy_encode_v2(hdr, (const struct sockaddr *)&c->addrs.src, c->addrs.src_len,
                                 (const struct sockaddr *)&c->addrs.dst, c->addrs.dst_len);
    } else {
        if (getpeername(c->fd, (struct sockaddr *)&peer, &plen) < 0)
            plen = 0;
        if (getsockname(c->fd, (struct sockaddr *)&local, &llen) < 0)
            llen = 0;
        len = nw_proxy_encode_v2(hdr, (struct sockaddr *)&peer, plen, (struct sockaddr *)&local, llen);
    }
    return send(to, hdr, len, MSG_DONTWAIT | MSG_NOSIGNAL) == (ssize_t)len ? 0 : -1;
}

/* Shaken hands: a socketpair, our end relayed, the other end to the
 * manager's ordinary path as a new connection of the listener. */
static void established(nw_mgr_tls *t, struct nw_mgr_tls_conn *c)
{
    int sv[2];
    t->established++;
    t->resumed += nw_tls_conn_resumed(c->tls);
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) < 0) {
        refused(t, c, NW_TLS_R_OTHER);
        return;
    }
    c->pair = sv[1];
    if (send_addresses(c, c->pair) < 0) {
        close(sv[0]);
        refused(t, c, NW_TLS_R_OTHER);
        return;
    }
    move_to(c, &t->relaying, RELAYING, 0);
    relay(t, c, NW_TLS_READY_ALL);  /* (the request may have come with the handshake's end) */
    nw_mgr_heads_accepted(t->heads, sv[0], c->listener, 1);
}

/* ------------------------------------------------------------ handshakes */

/* What a handshake step came to. */
static void shaken(nw_mgr_tls *t, struct nw_mgr_tls_conn *c, enum nw_tls_step s)
{
    if (s == NW_TLS_DONE)
        established(t, c);
    else if (s == NW_TLS_PLAIN)
        answer_plain(t, c);
    else if (s == NW_TLS_FAILED)
        refused(t, c, nw_tls_conn_reason(c->tls));
    else if (set_events(t, c->fd, &c->tcp_events, s == NW_TLS_WANT_WRITE ? EPOLLOUT : EPOLLIN,
                        &c->tcp_ref) < 0)
        refused(t, c, NW_TLS_R_OTHER);
}

/* The next step. The one that takes the client's hello (the key
 * exchange and the signature: nearly all of a handshake's CPU) runs in a
 * handshake thread, the socket out of the set until it is back
 * (take_done); the light ones after it run here. */
static void shake(nw_mgr_tls *t, struct nw_mgr_tls_conn *c)
{
    if (nw_tls_conn_begun(c->tls)) {
        shaken(t, c, nw_tls_handshake(c->tls));
        return;
    }
    if (set_events(t, c->fd, &c->tcp_events, 0, NULL) < 0) {
        refused(t, c, NW_TLS_R_OTHER);
        return;
    }
    c->in_pool = 1;
    c->job.tls = c->tls;
    nw_tls_pool_submit(t->pool, &c->job);
}

static void take_done(nw_mgr_tls *t)
{
    nw_tls_job *j = nw_tls_pool_done(t->pool), *next;
    for (; j; j = next) {
        next = j->next;
        struct nw_mgr_tls_conn *c =
            (struct nw_mgr_tls_conn *)((char *)j - offsetof(struct nw_mgr_tls_conn, job));
        c->in_pool = 0;
        if (c->list == &t->late)
            refused(t, c, NW_TLS_R_TIMEOUT);
        else
            shaken(t, c, j->step);
    }
}

/* ------------------------------------------------------------ PROXY */

static const char *const proxy_why[NW_PROXY_REJECTS] = {
    "no valid PROXY header", "its address is not in --proxy-from"
};

static void proxy_refused(nw_mgr_tls *t, struct nw_mgr_tls_conn *c, int reason)
{
    struct sockaddr_storage peer;
    socklen_t plen = sizeof peer;
    char where[NW_SCOREBOARD_PEER] = "?";
    if (getpeername(c->fd, (struct sockaddr *)&peer, &plen) == 0)
        nw_format_address((struct sockaddr *)&peer, plen, where, sizeof where);
    t->proxy_rejected[reason]++;
    nw_log_limited(&t->proxy_said[reason], nw_mgr_now(t->clock), "warn",
                   "refused a TLS connection under --proxy-protocol from %s: %s",
                   where, proxy_why[reason]);
    conn_close(t, c);
}

/* The header, before the hello: what is there is looked at (MSG_PEEK)
 * and only the header's bytes are taken, so the hello stays for the
 * handshake. Bytes of an unfinished header are taken and kept (the
 * socket would read ready forever otherwise). */
static void read_proxy(nw_mgr_tls *t, struct nw_mgr_tls_conn *c)
{
    char buf[NW_PROXY_V2_MAX];
    size_t have = c->proxy_len, used = 0;
    nw_proxy_info info;
    if (have)
        memcpy(buf, c->proxy_buf, have);
    ssize_t n = recv(c->fd, buf + have, sizeof buf - have, MSG_PEEK | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
        if (set_events(t, c->fd, &c->tcp_events, EPOLLIN, &c->tcp_ref) < 0)
            refused(t, c, NW_TLS_R_OTHER);
        return;
    }
    if (n <= 0) {
        refused(t, c, NW_TLS_R_CLOSED);
        return;
    }
    int r = nw_proxy_parse(buf, have + (size_t)n, &info, &used);
    if (r == NW_PROXY_BAD || (r == NW_PROXY_MORE && have + (size_t)n == sizeof buf)) {
        proxy_refused(t, c, NW_PROXY_REJECT_BAD_HEADER);
        return;
    }
    size_t take = r == NW_PROXY_DONE ? used - have : (size_t)n;
    if (recv(c->fd, buf + have, take, MSG_DONTWAIT) != (ssize_t)take) {
        refused(t, c, NW_TLS_R_OTHER);
        return;
    }
    if (r == NW_PROXY_MORE) {
        if (!c->proxy_buf && !(c->proxy_buf = malloc(NW_PROXY_V2_MAX))) {
            refused(t, c, NW_TLS_R_OTHER);
            return;
        }
        memcpy(c->proxy_buf + have, buf + have, take);
        c->proxy_len = have + take;
        if (set_events(t, c->fd, &c->tcp_events, EPOLLIN, &c->tcp_ref) < 0)
            refused(t, c, NW_TLS_R_OTHER);
        return;
    }
    free(c->proxy_buf);
    c->proxy_buf = NULL;
    c->proxy_wait = 0;
    c->addrs = info;
    c->addrs_given = !info.local;   /* (LOCAL, a health check: the socket's own) */
    shake(t, c);
}

/* --proxy-from: the peers that may send a header (none given: any); -1
 * when the peer is gone. */
static int proxy_peer_allowed(const nw_mgr_tls *t, int fd)
{
    struct sockaddr_storage peer;
    socklen_t plen = sizeof peer;
    if (!t->proxy_from_n)
        return 1;
    if (getpeername(fd, (struct sockaddr *)&peer, &plen) < 0)
        return -1;      /* (gone already: a reset) */
    return nw_proxy_cidr_match(t->proxy_from, t->proxy_from_n, (struct sockaddr *)&peer);
}

void nw_mgr_tls_proxy(nw_mgr_tls *t, const nw_proxy_cidr *from, size_t n)
{
    t->proxy = 1;
    t->proxy_from = from;
    t->proxy_from_n = n;
}

static void conn_new(nw_mgr_tls *t, int fd, int i)
{
    struct nw_mgr_tls_conn *c = calloc(1, sizeof *c);
    if (c && !(c->tls = nw_tls_conn_new(t->ctx, fd))) {
        free(c);
        c = NULL;
    }
    if (!c) {
        close(fd);
        return;
    }
    nw_mgr_table_hold_outside(t->table, 1);
    c->fd = fd;
    c->pair = -1;
    c->listener = t->index[i];
    c->tcp_ref = (nw_mgr_tls_ref){ NW_MGR_TLS_TCP, i, c };
    c->pair_ref = (nw_mgr_tls_ref){ NW_MGR_TLS_PAIR, i, c };
    list_add(&t->shaking, c);
    c->state = SHAKING;
    c->deadline = nw_mgr_now(t->clock) + t->handshake_ms;
    int allowed = t->proxy ? proxy_peer_allowed(t, fd) : 1;
    if (allowed < 0) {
        refused(t, c, NW_TLS_R_CLOSED);
    } else if (!allowed) {
        proxy_refused(t, c, NW_PROXY_REJECT_NOT_ALLOWED);
    } else if (t->proxy) {
        c->proxy_wait = 1;      /* (its deadline is the handshake's) */
        read_proxy(t, c);
    } else {
        shake(t, c);    /* (the hello is usually there: TCP_DEFER_ACCEPT) */
    }
}

static void pause_accepting(nw_mgr_tls *t)
{
    watch_listeners(t, 0);
    t->paused_until = nw_mgr_now(t->clock) + TLS_PAUSE_MS;
}

/* Each TLS connection counts against --max-connections: when it is
 * reached, the longest-idle connection is closed to make room, as for a
 * plain one; with none idle, new clients wait in the listen queue. */
static void accept_from(nw_mgr_tls *t, int i)
{
    for (int n = 0; t->accepting && n < TLS_ACCEPT_BATCH; n++) {
        if (!nw_mgr_table_make_room(t->table)) {
            nw_log_limited(&t->full_said, nw_mgr_now(t->clock), "warn",
                           "the manager holds --max-connections, none idle: "
                           "TLS clients wait in the listen queue");
            pause_accepting(t);
            return;
        }
        int fd = accept4(t->fds[i], NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) {
            conn_new(t, fd, i);
            continue;
        }
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
            nw_log_limited(&t->fd_limit_said, nw_mgr_now(t->clock), "warn",
                           "the manager cannot take a TLS connection: %s", strerror(errno));
            pause_accepting(t);
        }
        return;
    }
}

/* ------------------------------------------------------------ events */

static void conn_event(nw_mgr_tls *t, const nw_mgr_tls_ref *r)
{
    struct nw_mgr_tls_conn *c = r->conn;
    if (!c->tls || c->in_pool)
        return;     /* closed earlier in this batch, or a thread's for now */
    if (c->plain)
        plain_readable(t, c);
    else if (c->proxy_wait)
        read_proxy(t, c);
    else if (c->state == SHAKING)
        shake(t, c);
    else
        relay(t, c, r->kind == NW_MGR_TLS_TCP ? NW_TLS_READY_TCP : NW_TLS_READY_PAIR);
}

void nw_mgr_tls_run(nw_mgr_tls *t, int wait_ms)
{
    struct epoll_event ev[TLS_EVENTS];
    if (t->ep < 0)
        return;
    int n = epoll_wait(t->ep, ev, TLS_EVENTS, wait_ms);
    for (int i = 0; i < n; i++) {
        nw_mgr_tls_ref *r = ev[i].data.ptr;
        if (r->kind == NW_MGR_TLS_LISTENER)
            accept_from(t, r->index);
        else if (r->kind == NW_MGR_TLS_POOL)
            take_done(t);
        else
            conn_event(t, r);
    }
    free_dead(t);
}

/* ------------------------------------------------------------ time */

/* (a handshake whose step a thread runs waits on the late list) */
static void expire_list(nw_mgr_tls *t, nw_mgr_tls_list *l, nw_msec now)
{
    while (l->head && l->head->deadline <= now) {
        struct nw_mgr_tls_conn *c = l->head;
        if (c->in_pool)
            move_to(c, &t->late, SHAKING, 0);
        else if (c->state == SHAKING)
            refused(t, c, NW_TLS_R_TIMEOUT);
        else
            conn_close(t, c);
    }
}

static void rotate(nw_mgr_tls *t, nw_msec now)
{
    if (now < t->next_rotation)
        return;
    t->next_rotation = now + TLS_ROTATE_MS;
    if (nw_tls_ctx_rotate_ticket_key(t->ctx) < 0)
        nw_log("error", "cannot make a new TLS ticket key: the old one stays");
}

void nw_mgr_tls_expire(nw_mgr_tls *t)
{
    if (t->ep < 0)
        return;
    nw_msec now = nw_mgr_now(t->clock);
    expire_list(t, &t->shaking, now);
    expire_list(t, &t->closing, now);
    free_dead(t);
    rotate(t, now);
    if (t->paused_until && now >= t->paused_until) {
        t->paused_until = 0;
        watch_listeners(t, 1);
    }
}

static nw_msec sooner(nw_msec a, nw_msec b)
{
    return b && b < a ? b : a;
}

nw_msec nw_mgr_tls_next(const nw_mgr_tls *t, nw_msec next)
{
    if (t->ep < 0)
        return next;
    next = sooner(next, t->shaking.head ? t->shaking.head->deadline : 0);
    next = sooner(next, t->closing.head ? t->closing.head->deadline : 0);
    next = sooner(next, t->paused_until);
    return sooner(next, t->next_rotation);
}

/* ------------------------------------------------------------ the part */

int nw_mgr_tls_init(nw_mgr_tls *t, nw_mgr_heads *heads, nw_mgr_table *table,
                    const nw_mgr_clock *clock,
                    const char *cert, const char *key, const int *fds, const int *index,
                    int n, double read_timeout, int threads, char *err, size_t errlen)
{
    memset(t, 0, sizeof *t);
    t->ep = -1;
    if (n <= 0)
        return 0;
    t->heads = heads;
    t->table = table;
    t->clock = clock;
    t->cert = cert;
    t->key = key;
    t->handshake_ms = (nw_msec)(read_timeout * 1000.0 + 0.5);
    t->next_rotation = nw_mgr_now(clock) + TLS_ROTATE_MS;
    if (!(t->ctx = nw_tls_ctx_new(cert, key, err, errlen)))
        return -1;
    if ((t->ep = epoll_create1(EPOLL_CLOEXEC)) < 0) {
        snprintf(err, errlen, "epoll_create1: %s", strerror(errno));
        return -1;
    }
    if (!(t->pool = nw_tls_pool_new(threads, err, errlen)))
        return -1;
    t->pool_ref = (nw_mgr_tls_ref){ NW_MGR_TLS_POOL, 0, NULL };
    struct epoll_event pev = { .events = EPOLLIN, .data.ptr = &t->pool_ref };
    if (epoll_ctl(t->ep, EPOLL_CTL_ADD, nw_tls_pool_fd(t->pool), &pev) < 0) {
        snprintf(err, errlen, "epoll_ctl: %s", strerror(errno));
        return -1;
    }
    for (int i = 0; i < n && i < NW_MAX_LISTENERS; i++) {
        t->fds[i] = fds[i];
        fcntl(fds[i], F_SETFL, fcntl(fds[i], F_GETFL) | O_NONBLOCK);  /* (the workers do not) */
        t->index[i] = index[i];
        t->lref[i] = (nw_mgr_tls_ref){ NW_MGR_TLS_LISTENER, i, NULL };
        t->n++;
    }
    watch_listeners(t, 1);
    return 0;
}

int nw_mgr_tls_fd(const nw_mgr_tls *t)
{
    return t->ep;
}

void nw_mgr_tls_stop_accepting(nw_mgr_tls *t)
{
    if (t->ep >= 0 && t->accepting)
        watch_listeners(t, 0);
    t->paused_until = 0;
}

size_t nw_mgr_tls_open(const nw_mgr_tls *t)
{
    return t->shaking.n + t->late.n + t->relaying.n + t->closing.n;
}

_Static_assert(NW_TLS_R_COUNT - 1 <= NW_STATUS_TLS_REASONS, "NW_STATUS_TLS_REASONS is too small");

/* Every reason but NW_TLS_R_NONE (never counted: refused() says other). */
void nw_mgr_tls_numbers(const nw_mgr_tls *t, nw_status_manager *sm)
{
    if (!t->ctx)
        return;
    sm->tls_handshakes[0] = t->established - t->resumed;
    sm->tls_handshakes[1] = t->resumed;
    sm->tls_open[0] = t->shaking.n + t->late.n;
    sm->tls_open[1] = t->relaying.n;
    sm->tls_open[2] = t->closing.n;
    for (int r = NW_TLS_R_NONE + 1; r < NW_TLS_R_COUNT; r++) {
        sm->tls_reason[sm->tls_reasons] = nw_tls_reason_name(r);
        sm->tls_refused[sm->tls_reasons++] = t->refused[r];
    }
    for (int r = 0; r < NW_PROXY_REJECTS; r++)
        sm->proxy_rejected[r] = t->proxy_rejected[r];
}

void nw_mgr_tls_reload(nw_mgr_tls *t)
{
    char err[512];
    if (!t->ctx)
        return;
    if (nw_tls_ctx_reload(t->ctx, t->cert, t->key, err, sizeof err) < 0)
        nw_log("error", "TLS certificate not reloaded (the old one stays): %s", err);
    else
        nw_log("info", "TLS certificate reloaded from %s", t->cert);
}

static void close_list(nw_mgr_tls *t, nw_mgr_tls_list *l)
{
    while (l->head)
        conn_close(t, l->head);
}

void nw_mgr_tls_close(nw_mgr_tls *t)
{
    nw_tls_pool_free(t->pool);  /* (first: its threads hold connections) */
    t->pool = NULL;
    close_list(t, &t->shaking);
    close_list(t, &t->late);
    close_list(t, &t->relaying);
    close_list(t, &t->closing);
    free_dead(t);
    if (t->ep >= 0)
        close(t->ep);
    t->ep = -1;
    nw_tls_ctx_free(t->ctx);
    t->ctx = NULL;
    nw_log_limited_unlist(&t->refused_said);
    nw_log_limited_unlist(&t->fd_limit_said);
    nw_log_limited_unlist(&t->full_said);
    for (int r = 0; r < NW_PROXY_REJECTS; r++)
        nw_log_limited_unlist(&t->proxy_said[r]);
}
