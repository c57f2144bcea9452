/* Adoption (see nw_adopt.h and "Retirement" in docs/DESIGN.md): a
 * leaving worker's parked connections handed to the other workers through
 * the adopt queue, and who takes them and when. */
#include "nw_adopt.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <unistd.h>

#include "nw_frame.h"

/* What the record says is the connection's own, back on the connection:
 * its request count, its keep-alive deadline, its PROXY header's state. */
static void adoptee_restore(nw_conn *c, const nw_frame_adoptee *a, nw_msec now)
{
    c->requests = a->requests;
    c->idle_deadline = now + (a->deadline_ms > 0 ? (nw_msec)a->deadline_ms : 0);
    c->proxy_pending = (a->flags & NW_ADOPT_F_PROXY_PENDING) != 0;
    if (!(a->flags & NW_ADOPT_F_PROXY))
        return;
    c->proxy.local = (a->flags & NW_ADOPT_F_PROXY_LOCAL) != 0;
    if (c->proxy.local)
        return;
    if (a->peer_len <= sizeof a->peer) {
        memcpy(&c->proxy.src, &a->peer, a->peer_len);
        c->proxy.src_len = a->peer_len;
    }
    if (a->local_len <= sizeof a->local) {
        memcpy(&c->proxy.dst, &a->local, a->local_len);
        c->proxy.dst_len = a->local_len;
    }
}

/* Park a connection another worker left, as if this one had just served
 * it: the ADD that registers it reports a request that is there already.
 * What does not fit goes to the manager. */
static void adopt_one(nw_adopt *ad, const nw_frame_adoptee *a, int fd)
{
    struct sockaddr_storage peer;
    socklen_t plen = a->peer_len;
    if (plen > 0 && plen <= sizeof a->peer)
        memcpy(&peer, &a->peer, plen);
    else if (plen = sizeof peer, getpeername(fd, (struct sockaddr *)&peer, &plen) < 0)
        plen = 0;
    nw_wconn *wc = ad->ops.conn_new(ad->ctx, a->listener, fd, &peer, plen);
    if (!wc)
        return;     /* (closed: a listener this worker does not have, or no memory) */
    if (ad->counts)
        ad->counts->adopted++;
    adoptee_restore(wc->c, a, nw_now_ms());
    wc->c->drained = 0;
    if (nw_parking_add(ad->parking, wc) < 0)
        nw_handoff_let_go(ad->handoff, wc);
}

/* Whether a whole batch of descriptors can be installed here now (with
 * the limit nw_worker_adopt_queue asks for, always: a frame must never
 * wait for a worker with room). What does not fit in the parked set goes
 * on to the manager. */
static int adopt_room(const nw_adopt *ad)
{
    return ad->parking->set.count + NW_ADOPT_BATCH <= ad->fd_limit;
}

/* Take one ADOPT frame, if one is waiting and there is room. Returns 1
 * when it took one. */
static int take_adopted(nw_adopt *ad)
{
    nw_frame f;
    int fds[NW_ADOPT_BATCH], nfds;
    ad->seen = 0;
    if (!ad->ready || !adopt_room(ad))
        return 0;
    int r = nw_frame_recv_many(ad->in, &f, ad->frame_data, NW_FRAME_MAX_DATA,
                               fds, NW_ADOPT_BATCH, &nfds);
    if (r <= 0) {
        ad->ready = 0;     /* nothing waiting, another worker took it, or a bad frame */
        return 0;
    }
    const nw_frame_adoptee *a = (const nw_frame_adoptee *)ad->frame_data;
    int records = f.type == NW_FRAME_ADOPT ? (int)(f.data_len / sizeof *a) : 0;
    for (int i = 0; i < nfds; i++) {
        if (i < records)
            adopt_one(ad, &a[i], fds[i]);
        else
            close(fds[i]);
    }
    /* (counted here now, or gone: no longer on their way) */
    nw_scoreboard_queued_add(ad->passing, -(int64_t)(nfds < records ? nfds : records));
    return 1;
}

/* Who adopts a waiting batch. A worker that holds no more parked
 * connections than the pool's workers do on average (the least loaded one
 * always does): at once when it is idle or new, or once the batch has
 * waited NW_ADOPT_BUSY_WAIT_MS when it is busy (its clients must not wait
 * for an idle moment that may not come). So a retiree's replacement, idle
 * and holding nothing, takes back what its predecessor held, and the
 * others keep their share; letting whoever looked first take them left
 * the pool lopsided for good (docs/PERFORMANCE.md, thirteenth round). One
 * over the mean takes it after NW_ADOPT_OVER_MEAN_WAIT_MS, in case the
 * others are held up by the app. */
static int adopt_may_take(nw_adopt *ad, nw_msec now, nw_msec waited)
{
    nw_adopt_standing standing = ad->ops.standing(ad->ctx);
    if (standing == NW_ADOPT_STANDBY)   /* (as one over the mean: the accepting workers first) */
        return waited >= NW_ADOPT_OVER_MEAN_WAIT_MS;
    if (standing == NW_ADOPT_NEW || waited >= NW_ADOPT_OVER_MEAN_WAIT_MS || !ad->board)
        return 1;
    return ad->ops.within_share(ad->ctx, now);
}

static nw_msec adopt_waited(nw_adopt *ad, nw_msec now)
{
    if (!ad->seen)
        ad->seen = now ? now : 1;
    return now - ad->seen;
}

/* Whether frames wait in the adopt queue. */
static int frames_waiting(const nw_adopt *ad)
{
    int waiting = 0;
    return ad->in >= 0 && ioctl(ad->in, FIONREAD, &waiting) == 0 && waiting > 0;
}

/* This worker may not take the waiting batches yet: the adopt queue
 * leaves its epoll set for a while (the queue, level-triggered, would
 * wake it again at once), and it sends the waiting frames to the back of
 * the queue, which tells the next worker: EPOLLEXCLUSIVE tells the
 * workers in the order they registered (oldest first) up to the first
 * one asleep in epoll_wait, so one that does not take a batch would keep
 * the others from hearing of it. A standby worker stays aside until the
 * batches have waited the longer wait (then it may take them); one over
 * the mean looks again after NW_ADOPT_LOOK_AGAIN_MS, since the mean moves
 * as the others take (a replacement that took its share leaves the rest
 * to it: docs/PERFORMANCE.md, nineteenth round). */
static void step_aside(nw_adopt *ad, nw_msec now)
{
    if (epoll_ctl(ad->epfd, EPOLL_CTL_DEL, ad->in, NULL) == 0) {
        nw_msec longer = (ad->seen ? ad->seen : now) + NW_ADOPT_OVER_MEAN_WAIT_MS;
        nw_msec again = now + NW_ADOPT_LOOK_AGAIN_MS;
        ad->ready = 0;
        int standby = ad->ops.standing(ad->ctx) == NW_ADOPT_STANDBY;
        ad->aside_until = standby || longer < again ? longer : again;
        nw_deadlines_set(ad->deadlines, NW_DEADLINE_ADOPT_ASIDE, ad->aside_until);
        nw_adopt_pass_on(ad, 0);  /* (a full queue: adopted here at once) */
    }
}

/* After a batch taken within its share, the batches waiting behind it
 * too, while this worker still holds no more than the mean (looked at
 * afresh each time): a leaving worker's replacement takes back all its
 * predecessor held in one look. One batch a look left most of them to
 * the busy workers over the mean: on two cores a look comes once a time
 * slice, 15 to 20 ms apart, and after 50 ms those take what waits. Over
 * the mean with batches left, it steps aside: they are the others'
 * (docs/PERFORMANCE.md, nineteenth round: left here, they waited for
 * NW_ADOPT_OVER_MEAN_WAIT_MS). */
static void take_within_share(nw_adopt *ad, nw_msec now)
{
    for (int i = 1; i < NW_PASS_ON_MAX && ad->board && ad->ready
                    && ad->ops.standing(ad->ctx) != NW_ADOPT_STANDBY; i++) {
        if (!nw_scoreboard_at_most_mean_parked(ad->board, (uint32_t)ad->parking->set.count)) {
            if (frames_waiting(ad))
                step_aside(ad, now);
            return;
        }
        if (!take_adopted(ad))
            return;
    }
}

/* Take a batch that adopt_may_take allowed. One taken because the
 * batches have waited NW_ADOPT_OVER_MEAN_WAIT_MS leaves the wait as it
 * was: the batches behind it have waited as long (a leaving worker sends
 * about NW_ADOPT_FRAMES at once), and are taken at the next looks until
 * the queue is empty, not 50 ms later each. */
static int adopt_take(nw_adopt *ad, nw_msec now, nw_msec waited)
{
    nw_msec seen = ad->seen;
    if (!take_adopted(ad))
        return 0;
    if (waited >= NW_ADOPT_OVER_MEAN_WAIT_MS)
        ad->seen = seen;
    else
        take_within_share(ad, now);
    return 1;
}

/* New: see nw_adopt.h, and look_busy in nw_worker.c for why. */
int nw_adopt_when_new(nw_adopt *ad, nw_msec now)
{
    if (!take_adopted(ad))
        return 0;
    take_within_share(ad, now);
    return 1;
}

/* Busy. One that may not take the batch steps aside, as an idle one
 * does. Returns 1 when it took a batch. */
int nw_adopt_when_busy(nw_adopt *ad, nw_msec now)
{
    nw_msec waited = adopt_waited(ad, now);
    if (waited < NW_ADOPT_BUSY_WAIT_MS)
        return 0;
    if (adopt_may_take(ad, now, waited))
        return adopt_take(ad, now, waited);
    step_aside(ad, now);
    return 0;
}

/* Idle. One that may not take the batch steps aside: the adopt queue
 * leaves its epoll set until the batch has waited the longer wait (the
 * queue, level-triggered, would wake it again at once), and it sends the
 * waiting frames to the back of the queue, which wakes the next worker
 * waiting in epoll_wait: EPOLLEXCLUSIVE wakes the first one, in the order
 * they registered (oldest first), so without that the wake-up would stop
 * here and a new worker asleep would never hear of it. Returns 1 when it
 * took a batch. */
int nw_adopt_when_idle(nw_adopt *ad, nw_msec now)
{
    nw_msec waited = adopt_waited(ad, now);
    if (adopt_may_take(ad, now, waited))
        return adopt_take(ad, now, waited);
    step_aside(ad, now);
    return 0;
}

/* Back in the adopt queue's wake-ups after stepping aside; a batch still
 * waiting is taken at the next look. */
void nw_adopt_step_back(nw_adopt *ad)
{
    struct epoll_event ev = { .events = EPOLLIN | EPOLLEXCLUSIVE, .data.u64 = ad->event };
    if (epoll_ctl(ad->epfd, EPOLL_CTL_ADD, ad->in, &ev) < 0 && errno != EEXIST)
        return;                 /* (tried again at the next look) */
    ad->aside_until = 0;
    nw_deadlines_set(ad->deadlines, NW_DEADLINE_ADOPT_ASIDE, 0);
    ad->ready = 1;
}

/* The record that carries a connection to another worker. Returns 0, or
 * -1 when what is its own does not fit one (a PROXY header's unix-socket
 * addresses): it goes to the manager instead, whose hand-off carries any. */
static int adoptee_record(const nw_wconn *wc, nw_frame_adoptee *a, nw_msec now)
{
    const nw_conn *c = wc->c;
    memset(a, 0, sizeof *a);
    a->listener = (uint16_t)c->listener;
    a->requests = c->requests;
    a->deadline_ms = c->idle_deadline > now ? (int32_t)(c->idle_deadline - now) : 0;
    /* the address $env shows: a PROXY header's, else the socket's (a unix
     * socket's does not fit and is asked for again) */
    const void *peer = &wc->peer;
    size_t plen = wc->peer_len;
    if (c->cfg.proxy_protocol && c->proxy_pending) {
        a->flags = NW_ADOPT_F_PROXY_PENDING;
    } else if (c->cfg.proxy_protocol) {
        a->flags = NW_ADOPT_F_PROXY | (c->proxy.local ? NW_ADOPT_F_PROXY_LOCAL : 0);
        if (!c->proxy.local && c->proxy.src_len) {
            if (c->proxy.src_len > sizeof a->peer || c->proxy.dst_len > sizeof a->local)
                return -1;
            peer = &c->proxy.src;
            plen = c->proxy.src_len;
            memcpy(&a->local, &c->proxy.dst, c->proxy.dst_len);
            a->local_len = (uint16_t)c->proxy.dst_len;
        }
    }
    if (plen <= sizeof a->peer) {
        memcpy(&a->peer, peer, plen);
        a->peer_len = (uint16_t)plen;
    }
    return 0;
}

/* Send n records and their sockets as one ADOPT frame. Returns 0 (the
 * other workers have them; ours are still open), or -1. */
static int send_adopt_batch(nw_adopt *ad, const nw_frame_adoptee *a, const int *fds, int n,
                            int patience_ms)
{
    nw_frame f;
    nw_frame_init(&f, NW_FRAME_ADOPT);
    f.data_len = (uint32_t)(n * sizeof a[0]);
    /* A full queue (the others have not read the batches before yet) is
     * waited for patience_ms, as a hand-off to the manager would be. */
    nw_msec until = nw_now_ms() + (nw_msec)patience_ms;
    /* on their way to another worker (narwhal_connections) until one takes them */
    nw_scoreboard_queued_add(ad->passing, n);
    while (nw_frame_send_fds(ad->out, &f, NULL, 0, a, fds, n) < 0) {
        if ((errno != EAGAIN && errno != EWOULDBLOCK) || nw_now_ms() >= until) {
            int e = errno;
            nw_scoreboard_queued_add(ad->passing, -n);
            errno = e;
            return -1;
        }
        nw_io_wait(ad->out, POLLOUT, until);
    }
    return 0;
}

/* One connection to the manager (closed gently when it cannot take it);
 * crashing: nothing is closed or freed (see nw_adopt_give_away). */
static void give_to_manager(nw_adopt *ad, nw_wconn *wc, int crashing)
{
    if (nw_handoff_give(ad->handoff, wc, NW_HANDOFF_PATIENCE_MS) < 0 && !crashing) {
        if (ad->handoff->queue >= 0)
            nw_handoff_refused(ad->handoff, errno, 0);
        nw_conn_close_gently(wc->c);
    }
    if (!crashing)
        nw_wconn_drop(wc, ad->owner);
}

/* A leaving worker's parked connections: to the other workers, a batch a
 * frame; a batch the adopt queue refuses goes to the manager, one by one.
 * crashing: called from the crash handler, so only async-signal-safe
 * calls (sendmsg, poll, clock_gettime): nothing is freed or closed, the
 * process dies right after. */
void nw_adopt_give_away(nw_adopt *ad, int crashing)
{
    nw_wconn *batch[NW_ADOPT_BATCH], *wc;
    nw_frame_adoptee records[NW_ADOPT_BATCH];
    int fds[NW_ADOPT_BATCH];
    int n = 0, adopting = ad->out >= 0;
    nw_msec now = nw_now_ms();
    /* about NW_ADOPT_FRAMES batches, so that several workers share them;
     * never more than the queue holds without waiting (about ten) */
    int size = (ad->parking->set.count + NW_ADOPT_FRAMES - 1) / NW_ADOPT_FRAMES;
    if (size > NW_ADOPT_BATCH)
        size = NW_ADOPT_BATCH;
    for (;;) {
        wc = nw_parking_take_any(ad->parking);
        if (wc) {
            if (wc->c->fd >= 0 && adopting && adoptee_record(wc, &records[n], now) == 0) {
                fds[n] = wc->c->fd;
                batch[n++] = wc;
            } else if (wc->c->fd >= 0) {
                give_to_manager(ad, wc, crashing);   /* its record would not say it all */
            } else if (!crashing) {
                nw_wconn_drop(wc, ad->owner);
            }
        }
        if (n == 0 && !wc)
            return;
        if (wc && n < size)
            continue;
        if (adopting && send_adopt_batch(ad, records, fds, n, NW_HANDOFF_PATIENCE_MS) == 0) {
            for (int i = 0; !crashing && i < n; i++) {
                close(batch[i]->c->fd);  /* our copy; the socket lives on elsewhere */
                batch[i]->c->fd = -1;
                nw_conn_fd_gone(batch[i]->c);
                nw_wconn_drop(batch[i], ad->owner);
            }
        } else {
            adopting = 0;               /* the rest go to the manager too */
            for (int i = 0; i < n; i++)
                give_to_manager(ad, batch[i], crashing);
        }
        n = 0;
    }
}

/* The frames waiting in the adopt queue as a worker leaves go to the back
 * of the queue again, each once (the bytes queued when it began): each
 * send wakes a worker. The queue is in every worker's epoll with
 * EPOLLEXCLUSIVE, so a frame wakes the first worker waiting in epoll_wait
 * and no other: the kernel puts the queue on that epoll's ready list
 * only, and level-triggering does not tell the others later. A worker
 * that leaves after such a wake-up (its stop signal came in the same
 * epoll_wait, as with HUP under load) would leave the frame there, its
 * clients' requests unanswered, until another frame woke someone. A frame
 * the queue refuses now (after patience_ms) is adopted here, and given
 * away with the parked set (to the manager, then). A worker that steps
 * aside (nw_adopt_when_idle) does not wait: a queue full enough to refuse
 * says it has room only when three quarters of it are free, and it would
 * sit idle NW_HANDOFF_PATIENCE_MS a frame with those clients unanswered. */
void nw_adopt_pass_on(nw_adopt *ad, int patience_ms)
{
    int waiting = 0;
    if (ad->in < 0 || ad->out < 0 || ioctl(ad->in, FIONREAD, &waiting) < 0)
        return;
    for (int i = 0; waiting > 0 && i < NW_PASS_ON_MAX && adopt_room(ad); i++) {
        nw_frame f;
        int fds[NW_ADOPT_BATCH], nfds;
        if (nw_frame_recv_many(ad->in, &f, ad->frame_data, NW_FRAME_MAX_DATA,
                               fds, NW_ADOPT_BATCH, &nfds) <= 0)
            return;     /* nothing waiting any more (another worker took it), or a bad frame */
        waiting -= (int)(sizeof f + f.data_len);
        const nw_frame_adoptee *a = (const nw_frame_adoptee *)ad->frame_data;
        int records = f.type == NW_FRAME_ADOPT ? (int)(f.data_len / sizeof *a) : 0;
        int n = nfds < records ? nfds : records;
        for (int k = n; k < nfds; k++)
            close(fds[k]);      /* (as take_adopted does) */
        if (n > 0 && send_adopt_batch(ad, a, fds, n, patience_ms) == 0) {
            for (int k = 0; k < n; k++)
                close(fds[k]);  /* our copies: the sockets are in the queue again */
        } else {
            for (int k = 0; k < n; k++)
                adopt_one(ad, &a[k], fds[k]);
        }
        nw_scoreboard_queued_add(ad->passing, -(int64_t)n);  /* (taken off once: sent again, or ours) */
    }
}

void nw_adopt_init(nw_adopt *ad, const nw_adopt_ops *ops, void *ctx,
                   const nw_adopt_shared *shared)
{
    memset(ad, 0, sizeof *ad);
    ad->ops = *ops;
    ad->ctx = ctx;
    ad->in = ad->out = -1;
    ad->epfd = shared->epfd;
    ad->event = shared->event;
    ad->parking = shared->parking;
    ad->handoff = shared->handoff;
    ad->owner = shared->owner;
    ad->deadlines = shared->deadlines;
}

void nw_adopt_count_in(nw_adopt *ad, const nw_scoreboard *board, nw_score_counts *counts,
                       volatile int64_t *passing)
{
    ad->board = board;
    ad->counts = counts;
    ad->passing = passing;
}

void nw_adopt_close(nw_adopt *ad)
{
    if (ad->in >= 0)
        close(ad->in);
    if (ad->out >= 0)
        close(ad->out);
    ad->in = ad->out = -1;
}

int nw_adopt_open(nw_adopt *ad, int in_fd, int out_fd, char *frame_data)
{
    struct rlimit rl;
    if (in_fd < 0 || out_fd < 0 || !frame_data)
        return 0;
    if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
        return -1;
    /* Raise the soft limit as far as adoption needs, when the hard one
     * allows (never lower it): a soft limit of 1,024 would cap the parked
     * set at about a thousand anyway. */
    rlim_t want = (rlim_t)NW_MAX_PARKED + NW_ADOPT_BATCH + NW_ADOPT_FD_RESERVE;
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < want) {
        rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > want ? want : rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
            getrlimit(RLIMIT_NOFILE, &rl);
    }
    long limit = rl.rlim_cur == RLIM_INFINITY ? (long)NW_MAX_PARKED + NW_ADOPT_FD_RESERVE
                                              : (long)rl.rlim_cur;
    /* Every worker must be able to take a batch whatever it holds, or a
     * frame could wait for ever: below that, the manager it is. */
    if (limit - NW_ADOPT_FD_RESERVE < NW_MAX_PARKED + NW_ADOPT_BATCH)
        return 0;
    ad->in = fcntl(in_fd, F_DUPFD_CLOEXEC, 3);
    ad->out = fcntl(out_fd, F_DUPFD_CLOEXEC, 3);
    struct epoll_event ev = { .events = EPOLLIN | EPOLLEXCLUSIVE, .data.u64 = ad->event };
    if (ad->in < 0 || ad->out < 0
        || epoll_ctl(ad->epfd, EPOLL_CTL_ADD, ad->in, &ev) < 0) {
        int e = errno;
        if (ad->in >= 0)
            close(ad->in);
        if (ad->out >= 0)
            close(ad->out);
        ad->in = ad->out = -1;
        errno = e;
        return -1;
    }
    ad->fd_limit = limit - NW_ADOPT_FD_RESERVE;
    ad->frame_data = frame_data;
    ad->ready = 1;
    return 0;
}
