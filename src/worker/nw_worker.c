/* A worker's scheduling (see nw_worker.h and "The worker" in
 * docs/DESIGN.md): taking the next connection in turns, waiting, and
 * where a connection goes when let go (park, hand-off, close), with the
 * worker's life (new, start, drain, leave, free). Each part owns its state
 * in its own file, and this one is their only caller: the listeners and
 * the serve queue (nw_sources.c), the parked set (nw_parking.c), custody's
 * wait list (nw_custody_wait.c), adoption (nw_adopt.c), the park watcher
 * thread (nw_watcher.c), the pool place (nw_pool_place.c), the deferred
 * signals and the process's handlers (nw_worker_signals.c), the deadline
 * list (nw_deadlines.c), the connections (nw_wconn.c). */
#include "nw_worker.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "nw_log.h"

/* The epoll data that says which source an event is for. */
#define SIGNAL_EVENT      63    /* the signalfd (listeners are 0..62) */
#define SERVE_QUEUE_EVENT 64    /* the serve queue */
#define ADOPT_QUEUE_EVENT 65    /* the adopt queue */
#define PARKED_EVENT      66    /* parked slot i: PARKED_EVENT + i */
#define EVENTS_MAX (PARKED_EVENT + NW_MAX_PARKED)

/* ---- connections --------------------------------------------------- */

static nw_wconn *wconn_new(nw_worker *w, int index, int fd,
                           const struct sockaddr_storage *peer, socklen_t plen)
{
    nw_wconn *wc = calloc(1, sizeof *wc);
    nw_conn *c = wc ? nw_conn_new(fd, w->sources.listener[index].is_tcp, &w->cfg) : NULL;
    if (!c) {
        free(wc);
        close(fd);
        return NULL;
    }
    c->listener = index;
    if (w->sources.relayed & ((uint64_t)1 << index)) {
        c->cfg.proxy_protocol = 1;  /* a relayed TLS connection: the manager's PROXY header */
        c->proxy_pending = 1;
    }
    c->spares = &w->spares;
    wc->c = c;
    wc->custody = &w->custody;
    wc->custody_forget = nw_custody_wait_forget;
    wc->place = &w->place;
    if (plen > 0 && plen <= sizeof wc->peer) {
        memcpy(&wc->peer, peer, plen);
        wc->peer_len = plen;
    }
    return wc;
}

/* A connection let go: its owner dropped (which frees it), or freed. */
static void drop_owner(nw_worker *w, nw_wconn *wc)
{
    nw_wconn_drop(wc, &w->ops);
}

/* ---- what the sources and the pool place ask of the worker ---------- */

static nw_wconn *sources_conn_new(void *ctx, int listener, int fd,
                                  const struct sockaddr_storage *peer, socklen_t plen)
{
    return wconn_new(ctx, listener, fd, peer, plen);
}

static int sources_defer_accept(void *ctx)
{
    nw_worker *w = ctx;
    return nw_pool_place_defers_accept(&w->place, w->taken_any, (uint32_t)w->parking.set.count,
                                       w->parking.set.ready_count);
}

static void sources_accepted(void *ctx)
{
    nw_worker *w = ctx;
    nw_pool_place_accepted(&w->place);
}

static void sources_let_go(void *ctx, nw_wconn *wc)
{
    nw_worker *w = ctx;
    nw_handoff_let_go(&w->handoff, wc);
}

static const nw_sources_ops sources_ops = {
    .conn_new = sources_conn_new,
    .let_go = sources_let_go,
    .defer_accept = sources_defer_accept,
    .accepted = sources_accepted,
};

/* The listeners in or out of the epoll; back in, each is tried. */
static int place_watch_listeners(void *ctx, int watched)
{
    nw_worker *w = ctx;
    int r = nw_sources_watch_listeners(&w->sources, watched);
    if (watched)
        nw_sources_all_ready(&w->sources);
    return r;
}

static const nw_pool_place_ops place_ops = {
    .watch_listeners = place_watch_listeners,
};

/* ---- waiting ------------------------------------------------------- */

/* Wait up to timeout_ms for events and note which parked connections
 * became readable. Returns how many events were work for this worker (a
 * listener, the queue, a parked connection now readable; not an event for
 * a connection away being served), or -1 with errno. */
static int poll_events(nw_worker *w, int timeout_ms)
{
    struct epoll_event ev[EVENTS_MAX];
    int n = epoll_wait(w->epfd, ev, EVENTS_MAX, timeout_ms);
    int ready_before = w->parking.set.ready_count, sources = 0;
    for (int k = 0; k < n; k++) {
        uint64_t data = ev[k].data.u64;
        if (data < NW_MAX_LISTENERS) {
            w->sources.listener_ready |= (uint64_t)1 << data;
            sources++;
        } else if (data == SERVE_QUEUE_EVENT) {
            w->sources.serve_queue_ready = 1;
            sources++;
        } else if (data == ADOPT_QUEUE_EVENT) {
            w->adopt.ready = 1;
            sources++;
        } else if (data == SIGNAL_EVENT) {
            w->signals.ready = 1;
            sources++;
        } else {
            nw_park_event(&w->parking.set, data, ev[k].events);
        }
    }
    w->last_poll = w->looked = nw_now_ms();
    return n < 0 ? -1 : sources + (w->parking.set.ready_count - ready_before);
}

static int sources_ready(const nw_worker *w)
{
    return nw_sources_ready(&w->sources) || w->adopt.ready;
}

/* ---- leaving ------------------------------------------------------- */

/* Whether anything but the connection being served waits for this
 * worker. Through poll_events, which notes the parked connections' events
 * (they would be lost otherwise) and does not count this connection's own. */
static int others_waiting(nw_worker *w)
{
    return w->parking.set.ready_count || poll_events(w, 0) > 0;
}

/* A leaving worker hands the wake-ups it may have taken to the manager
 * (nw_sources_pass_on_waiting). */
static void pass_on_waiting(nw_worker *w)
{
    if (w->handoff.queue >= 0)
        nw_sources_pass_on_waiting(&w->sources, w->place.standby);
}

/* A connection the watcher kept for the main thread (pass_on_one), when
 * the worker leaves without having taken it: to the manager, as
 * pass_on_waiting does, or closed gently. */
static void kept_let_go(nw_worker *w)
{
    nw_wconn *wc = w->watcher.kept;
    if (!wc)
        return;
    w->watcher.kept = NULL;
    if (nw_conn_server_closing()) {
        nw_conn_close_gently(wc->c);
        nw_wconn_free(wc);
    } else {
        nw_handoff_let_go(&w->handoff, wc);
    }
}

/* ---- the public verbs ---------------------------------------------- */

/* Before the turns: a standby worker follows its requests (DESIGN.md,
 * "Requests that block"); a draining one sees what has arrived, parked
 * connections included. Returns 0 when a deferred signal is pending. */
static int look_first(nw_worker *w, nw_msec now)
{
    if (w->place.chosen && !w->draining)
        nw_pool_place_follow(&w->place, now);
    if (w->draining)
        poll_events(w, 0);
    else if (nw_deferred_signals_pending(&w->signals, now))
        return 0;
    return 1;
}

/* What a busy worker looks at before each connection it takes: adoption
 * and the parked connections whose time is up. A new worker, until it has
 * taken its first connection, takes one waiting batch at each look before
 * it accepts or reads the serve queue: what a worker that left (a crash
 * too) held, with the requests that came meanwhile, is older than what
 * waits to be accepted, and a worker that dies young (a URL that crashes
 * every worker) would otherwise never take it. */
static void look_busy(nw_worker *w, nw_msec now)
{
    if (w->adopt.ready && !w->taken_any && !w->place.standby
        && nw_adopt_when_new(&w->adopt, now))
        poll_events(w, 0);
    if (nw_deadlines_passed(&w->deadlines, NW_DEADLINE_ADOPT_ASIDE, now))
        nw_adopt_step_back(&w->adopt);
    nw_sources_serve_queue_due(&w->sources, now);
    if (w->adopt.ready)
        nw_adopt_when_busy(&w->adopt, now); /* a leaving worker's parked connections */
    if (w->parking.set.count && !w->draining) {
        nw_parking_expire(&w->parking, now, 0);    /* even when there is work to do */
        if (!w->parking.set.ready_count && sources_ready(w))
            poll_events(w, 0);      /* so that parked connections get their turn */
    }
}

/* One turn: readable parked connections take turns with the rest (the
 * serve queue and the listeners). NULL: nothing to take. */
static nw_wconn *take_turn(nw_worker *w)
{
    nw_wconn *wc;
    if (w->parking.set.ready_count && !w->took_parked) {
        w->took_parked = 1;
        return nw_parking_take_ready(&w->parking);
    }
    /* The rest's turn, but epoll has not reported them lately: ask again
     * (one call for all of them), at most once per millisecond while
     * parked connections keep the worker busy. */
    if (!sources_ready(w) && w->parking.set.ready_count && w->looked != w->last_poll)
        poll_events(w, 0);
    if ((wc = nw_sources_take_new(&w->sources))) {
        w->took_parked = 0;
        return wc;
    }
    w->took_parked = 1;
    return nw_parking_take_ready(&w->parking);
}

/* Nothing to take: what is due is done (expired parked connections,
 * adoption's step back, custody's copies). Returns 1 when an idle worker
 * adopted a batch: any of them with a request is taken at the next turn. */
static int look_idle(nw_worker *w, nw_msec now)
{
    if (!w->draining)
        nw_parking_expire(&w->parking, now, 0);
    if (nw_deadlines_passed(&w->deadlines, NW_DEADLINE_ADOPT_ASIDE, now))
        nw_adopt_step_back(&w->adopt);
    if (w->adopt.ready && nw_adopt_when_idle(&w->adopt, now)) {
        poll_events(w, 0);
        return 1;
    }
    if (nw_deadlines_passed(&w->deadlines, NW_DEADLINE_CUSTODY, now))
        nw_custody_wait_flush(&w->custody);
    nw_sources_serve_queue_due(&w->sources, now);
    return 0;
}

/* Wait in epoll until something comes, the nearest deadline of the
 * worker's parts or until. The parked set's is registered here, when it
 * is ahead (while the server closes, at the keep-alive timeout: see
 * nw_parking_expire).
 * Returns -1 (errno EINTR) for a signal: the caller looks at its flags. */
static int wait_events(nw_worker *w, nw_msec now, nw_msec until)
{
    nw_msec parked = w->draining ? 0 : nw_parking_next(&w->parking);
    nw_deadlines_set(&w->deadlines, NW_DEADLINE_PARKED, parked > now ? parked : 0);
    nw_deadlines_set(&w->deadlines, NW_DEADLINE_FD_ROOM, w->sources.serve_paused_until);
    int wait_ms = nw_deadlines_wait_ms(&w->deadlines, now, until);
    if ((poll_events(w, wait_ms) < 0 && errno == EINTR) || w->signals.ready) {
        errno = EINTR;
        return -1;
    }
    nw_deferred_signals_waited(&w->signals, w->last_poll);
    return 0;
}

/* The end of next_conn's wait: wait_ms from now, or, draining, the
 * drain's end. The listeners too are watched until then: a handshake
 * that completed as the stop began may bring its request a little later
 * (TCP_DEFER_ACCEPT queues it only then), and once every worker is gone
 * it would be reset. */
static nw_msec wait_end(const nw_worker *w, nw_msec now, int wait_ms)
{
    if (w->draining)
        return w->drain_until > now ? w->drain_until : now;
    return now + (wait_ms > 0 ? wait_ms : 0);
}

static nw_wconn *next_conn(nw_worker *w, int wait_ms)
{
    nw_msec now = w->looked = nw_now_ms(), until = wait_end(w, now, wait_ms);
    nw_wconn *wc;
    if (!look_first(w, now)) {
        errno = EINTR;
        return NULL;
    }
    if ((wc = w->watcher.kept)) {
        w->watcher.kept = NULL;     /* (the watcher took it for the manager, which refused it) */
        return wc;
    }
    look_busy(w, now);
    for (;;) {
        if ((wc = take_turn(w)))
            return wc;
        if (look_idle(w, now))
            continue;
        if (now >= until || wait_events(w, now, until) < 0)
            return NULL;
        now = w->last_poll;         /* (poll_events read the clock) */
    }
}

nw_wconn *nw_worker_next(nw_worker *w, int wait_ms)
{
    nw_wconn *wc = next_conn(w, wait_ms);
    if (wc)
        w->taken_any = 1;
    if (nw_deadlines_passed(&w->deadlines, NW_DEADLINE_CUSTODY, w->looked))
        nw_custody_wait_flush(&w->custody);
    if (wc && w->slot)  /* custody: the manager closes this one if we die now */
        w->slot->serving_cookie = wc->c->custody ? wc->c->cookie : 0;
    return wc;
}

/* FIN, a brief drain, close: a request crossing our close meets
 * end-of-stream rather than a reset. Its buffers then go to the spares,
 * as a plain close's do (the main thread's: only release calls this). */
static nw_release_result close_gently(nw_worker *w, nw_wconn *wc)
{
    nw_wconn_unwatch(wc, w->epfd);
    nw_conn_close_gently(wc->c);
    nw_conn_shed_buffers(wc->c);
    return NW_RELEASE_CLOSED;
}

/* Park it, or else hand it to the manager. */
static nw_release_result park_or_hand_off(nw_worker *w, nw_wconn *wc)
{
    if (nw_parking_add(&w->parking, wc) == 0)
        return NW_RELEASE_PARKED;
    if (nw_conn_server_closing())
        return NW_RELEASE_KEPT;     /* (see nw_parking_expire) the worker waits for it itself */
    if (nw_handoff_give(&w->handoff, wc, NW_HANDOFF_PATIENCE_MS) == 0)
        return NW_RELEASE_HANDED_OFF;
    return NW_RELEASE_KEPT;
}

int nw_worker_hand_off_rest(nw_worker *w, nw_wconn *wc, int keep_alive)
{
    if (wc->c->rest_fd < 0 || wc->handed_off)
        return 0;
    return wc->handed_off = nw_handoff_rest(&w->handoff, wc, keep_alive);
}

/* A leaving worker's connection: parked, it goes to the other workers
 * with the rest (adoption); else to the manager; else closed. */
static nw_release_result release_retiring(nw_worker *w, nw_wconn *wc)
{
    if (w->adopt.out >= 0 && !nw_conn_server_closing() && nw_parking_add(&w->parking, wc) == 0)
        return NW_RELEASE_PARKED;
    if (nw_handoff_give(&w->handoff, wc, NW_HANDOFF_PATIENCE_MS) == 0)
        return NW_RELEASE_HANDED_OFF;
    if (wc->c->fd >= 0 && w->handoff.queue >= 0)
        nw_handoff_refused(&w->handoff, errno, 0);
    return close_gently(w, wc);     /* nobody to take it */
}

/* Done with it. Requests the client sent that were not read (pipelined
 * past --max-keepalive-reqs): a plain close would reset the connection
 * and destroy responses it has not read yet. Half-close and drain
 * (bounded) instead: a lingering close. Nothing left unread (the last
 * read was short and used up): a plain close, at no cost. */
static nw_release_result release_closing(nw_worker *w, nw_wconn *wc)
{
    nw_conn *c = wc->c;
    if (c->fd >= 0 && !c->lent && (c->in.len > c->consumed || (c->responded && !c->drained)))
        return close_gently(w, wc);   /* (an idle timeout has nothing unread) */
    nw_wconn_unwatch(wc, w->epfd);
    nw_conn_close_fd(c);
    nw_conn_shed_buffers(c);    /* (for the next connection) */
    return NW_RELEASE_CLOSED;
}

static nw_release_result release(nw_worker *w, nw_wconn *wc, nw_release_reason why)
{
    nw_conn *c = wc->c;
    nw_wconn_not_serving(wc);
    if (wc->handed_off)
        return NW_RELEASE_HANDED_OFF;   /* (nw_worker_hand_off_rest) */
    if (c->rest_fd >= 0) {
        if (why == NW_RELEASE_STOP)
            nw_conn_finish_rest(c);         /* the server stops: finish it here */
        else if (nw_handoff_rest(&w->handoff, wc, why != NW_RELEASE_CLOSE))
            return NW_RELEASE_HANDED_OFF;
        if (c->broken)
            why = NW_RELEASE_CLOSE;
    }
    switch (why) {
    case NW_RELEASE_KEEPALIVE:
        /* A client that waits for each response has not sent its next
         * request yet: park now rather than try a read first. */
        if (c->in.len > 0)
            return NW_RELEASE_KEPT;
        return park_or_hand_off(w, wc);
    case NW_RELEASE_IDLE:
        return park_or_hand_off(w, wc);
    case NW_RELEASE_QUANTUM:
        return others_waiting(w) ? park_or_hand_off(w, wc) : NW_RELEASE_KEPT;
    case NW_RELEASE_RETIRE:
        return release_retiring(w, wc);
    case NW_RELEASE_STOP:
        return close_gently(w, wc);
    case NW_RELEASE_CLOSE:
        return release_closing(w, wc);
    }
    return NW_RELEASE_KEPT;
}

nw_release_result nw_worker_release(nw_worker *w, nw_wconn *wc, nw_release_reason why)
{
    nw_release_result r = release(w, wc, why);
    if (r != NW_RELEASE_KEPT && w->slot)
        w->slot->serving_cookie = 0;    /* (custody: not the one in flight any more) */
    return r;
}

/* Custody: the copies the manager holds of our parked connections are not
 * for it to take over from here on, whatever becomes of this process. */
static void parked_released(nw_worker *w)
{
    if (w->slot)
        w->slot->parked_released = 1;
}

void nw_worker_release_parked(nw_worker *w, nw_release_reason why)
{
    parked_released(w);
    nw_custody_wait_drop(&w->custody);
    kept_let_go(w);
    if (why == NW_RELEASE_RETIRE && !nw_conn_server_closing()) {
        /* (a wake-up for a frame may have been ours) */
        nw_adopt_pass_on(&w->adopt, NW_HANDOFF_PATIENCE_MS);
        pass_on_waiting(w);     /* (or one for a request or a new connection) */
        nw_adopt_give_away(&w->adopt, 0);
    } else if (why == NW_RELEASE_RETIRE) {
        nw_parking_expire(&w->parking, nw_now_ms(), 1);
    } else {
        nw_parking_close_all(&w->parking);
    }
}

void nw_worker_drain(nw_worker *w, int serve_ms)
{
    int enter = nw_watcher_main_outside(&w->watcher);   /* (the watcher reads the flags) */
    if (enter)
        nw_worker_enter(w);
    w->draining = 1;
    if (w->place.standby)
        nw_pool_place_accept(&w->place);   /* (the listeners are watched until drain_until) */
    w->drain_until = nw_now_ms() + serve_ms;
    nw_sources_all_ready(&w->sources);
    w->sources.serve_queue_ready = 1;
    w->adopt.ready = w->adopt.in >= 0;
    if (enter)
        nw_worker_leave(w);
}

void nw_worker_lend_socket(nw_wconn *wc)
{
    nw_worker *w = nw_worker_of_process();
    if (wc->custody_wait)
        nw_custody_wait_forget(wc->custody, wc);  /* (its copy is not to be sent now) */
    if (!w || !wc->c->custody || w->handoff.queue < 0)
        return;
    nw_msec until = nw_now_ms() + NW_HANDOFF_PATIENCE_MS;
    while (nw_conn_custody_release(wc->c, w->handoff.queue, w->pid) < 0
           && (errno == EAGAIN || errno == EWOULDBLOCK) && nw_now_ms() < until)
        nw_io_wait(w->handoff.queue, POLLOUT, until);
}

int nw_worker_has_manager(const nw_worker *w)
{
    return w->sources.serve_queue >= 0 && w->handoff.queue >= 0;
}

/* ---- the park watcher thread --------------------------------------- */

static nw_worker *process_worker;   /* this process's, for exit and crash hooks */
static pid_t process_pid;           /* the process it belongs to */

/* A child of the app's is not the worker. */
static void worker_after_fork_child(void)
{
    process_worker = NULL;
}

/* What the signal handlers (nw_worker_signals.h) ask of this process's
 * worker. */
static nw_conn *serving_conn(void)
{
    nw_wconn *wc = nw_wconn_serving();
    return wc ? wc->c : NULL;
}

static const nw_worker_signal_ops signal_ops = {
    .serving = serving_conn,
    .hand_off_parked = nw_worker_hand_off_parked_from_handler,
};

void nw_worker_start(nw_worker *w)
{
    static int atfork_done;
    if (!atfork_done && pthread_atfork(NULL, NULL, worker_after_fork_child) == 0)
        atfork_done = 1;
    process_worker = w;
    process_pid = w->pid = w->custody.pid = getpid();
    nw_worker_signals_attach(&signal_ops);
    if (w->handoff.queue >= 0 && !w->watcher.running) {
        nw_watcher_start(&w->watcher);
        nw_worker_leave(w);
    }
}

nw_worker *nw_worker_of_process(void)
{
    return process_worker && process_pid == getpid() ? process_worker : NULL;
}

void nw_worker_leave_process(nw_worker *w)
{
    if (!w)
        return;
    nw_worker_enter(w);
    nw_worker_stop_watcher(w);
    kept_let_go(w);
    if (!nw_conn_server_closing()) {
        /* (an app's exit too may end a worker after a wake-up) */
        nw_adopt_pass_on(&w->adopt, NW_HANDOFF_PATIENCE_MS);
        pass_on_waiting(w);
    }
    if (w->parking.set.count)
        nw_worker_release_parked(w, NW_RELEASE_RETIRE);
    process_worker = NULL;
}

/* ---- the parked set from a signal handler ---------------------------- */

/* Runs in the crashing thread, with only async-signal-safe calls on the
 * parked set's C side (nw_adopt_give_away's crashing mode: to the other
 * workers in a few ADOPT frames, else the manager). The set is touched
 * only when nobody is changing it: the lock is free (the main thread is
 * out serving, the watcher asleep), or there is no watcher and the main
 * thread was not inside. */
void nw_worker_hand_off_parked_from_handler(void)
{
    nw_worker *w = process_worker;
    if (w && process_pid == getpid() && w->handoff.queue >= 0 && w->parking.set.count > 0) {
        if (nw_watcher_lock_from_handler(&w->watcher)) {
            parked_released(w);
            nw_adopt_give_away(&w->adopt, 1);
        }
    }
}

int nw_worker_proxy_from(nw_worker *w, const char *cidr)
{
    return nw_sources_proxy_from(&w->sources, cidr);
}

void nw_worker_enter(nw_worker *w)
{
    nw_wconn *wc;
    if (!nw_watcher_enter(&w->watcher))
        return;
    while ((wc = nw_watcher_take_evicted(&w->watcher)))
        drop_owner(w, wc);    /* its socket went to the manager */
}

void nw_worker_leave(nw_worker *w)
{
    nw_watcher_leave(&w->watcher);
}

/* With the main thread inside (or no watcher). */
void nw_worker_stop_watcher(nw_worker *w)
{
    if (w)
        nw_watcher_stop(&w->watcher);
}

/* ---- deferred signals, and the handlers' view of the worker --------- */

int nw_worker_defer_signals(nw_worker *w, const int *signals, int n)
{
    return nw_deferred_signals_start(&w->signals, signals, n, w->epfd, SIGNAL_EVENT);
}

uint64_t nw_worker_deliver_signals(nw_worker *w)
{
    return nw_deferred_signals_deliver(&w->signals, &w->life);
}

/* ---- what adoption asks of the worker (nw_adopt.h) ------------------- */

static nw_wconn *adopt_conn_new(void *ctx, int listener, int fd,
                                const struct sockaddr_storage *peer, socklen_t plen)
{
    nw_worker *w = ctx;
    if (listener < 0 || listener >= w->sources.count) {
        close(fd);
        return NULL;
    }
    return wconn_new(w, listener, fd, peer, plen);
}

static nw_adopt_standing adopt_standing(void *ctx)
{
    const nw_worker *w = ctx;
    if (w->place.standby)
        return NW_ADOPT_STANDBY;
    return w->taken_any ? NW_ADOPT_SERVING : NW_ADOPT_NEW;
}

static int adopt_within_share(void *ctx, nw_msec now)
{
    nw_worker *w = ctx;
    return nw_pool_place_within_share(&w->place, now, (uint32_t)w->parking.set.count);
}

static const nw_adopt_ops adopt_ops = {
    .conn_new = adopt_conn_new,
    .standing = adopt_standing,
    .within_share = adopt_within_share,
};

/* Adoption needs a manager (what does not fit goes there). */
int nw_worker_adopt_queue(nw_worker *w, int in_fd, int out_fd)
{
    if (w->sources.serve_queue < 0 || w->handoff.queue < 0)
        return 0;
    return nw_adopt_open(&w->adopt, in_fd, out_fd, w->sources.frame_data);
}

/* ---- life ---------------------------------------------------------- */

/* How long a connection stays parked: --keepalive-wait, and, as a parked
 * connection is an idle one, let go (to the manager, which closes what is
 * past its time) by --keepalive-timeout at the latest. */
static nw_msec park_ms(const nw_conn_config *cfg, double park_seconds)
{
    if (cfg->keepalive_timeout > 0 && park_seconds > cfg->keepalive_timeout)
        park_seconds = cfg->keepalive_timeout;
    return park_seconds > 0 ? (nw_msec)(park_seconds * 1000 + 0.5) : 0;
}

/* The parts, each given the pieces it works on and its call-backs here. */
static void parts_init(nw_worker *w, nw_msec keep_ms, nw_msec idle_ms, int with_serve_queue)
{
    nw_deferred_signals_init(&w->signals);
    nw_pool_place_init(&w->place, &place_ops, w);
    nw_sources_init(&w->sources, &sources_ops, w, w->epfd);
    nw_deadlines_init(&w->deadlines);
    nw_adopt_shared adopt_shared = { w->epfd, ADOPT_QUEUE_EVENT, &w->parking, &w->handoff,
                                     &w->ops, &w->deadlines };
    nw_adopt_init(&w->adopt, &adopt_ops, w, &adopt_shared);
    nw_custody_wait_init(&w->custody, w->cfg.custody && with_serve_queue
                         && w->handoff.queue >= 0 ? w->handoff.queue : -1, &w->deadlines);
    nw_parking_shared parking_with = { &w->ops, &w->handoff, &w->custody, &w->place };
    nw_parking_init(&w->parking, &parking_with, w->epfd, PARKED_EVENT, keep_ms, idle_ms);
    nw_watcher_shared watched = { &w->parking, &w->sources, &w->handoff };
    nw_watcher_init(&w->watcher, &watched);
}

nw_worker *nw_worker_new(const nw_conn_config *cfg, double park_seconds,
                         int serve_queue, int handoff_queue, const nw_worker_owner_ops *ops)
{
    nw_worker *w = calloc(1, sizeof *w);
    if (!w)
        return NULL;
    w->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (w->epfd < 0) {
        free(w);
        return NULL;
    }
    w->cfg = *cfg;
    w->cfg.offload = handoff_queue >= 0;    /* a manager can finish responses */
    if (ops)
        w->ops = *ops;
    /* Copies of our own: the caller's handles on the queues may be closed
     * while the worker still needs them (an app's exit unwinds Perl's
     * scopes before the exit hook hands the parked connections over). */
    nw_handoff_init(&w->handoff, handoff_queue, w->epfd);
    parts_init(w, park_ms(cfg, park_seconds), park_ms(cfg, cfg->keepalive_timeout), serve_queue >= 0);
    if (serve_queue >= 0
        && nw_sources_open_serve_queue(&w->sources, serve_queue, SERVE_QUEUE_EVENT) < 0) {
        int e = errno;
        nw_worker_free(w);
        errno = e;
        return NULL;
    }
    return w;
}

int nw_worker_listen(nw_worker *w, int fd, int is_tcp)
{
    return nw_sources_listen(&w->sources, fd, is_tcp);
}

int nw_worker_standby(nw_worker *w)
{
    if (w->sources.serve_queue < 0) {
        errno = EINVAL;
        return -1;
    }
    /* (the park watcher runs already, and reads listener_ready: with its lock) */
    int enter = nw_watcher_main_outside(&w->watcher);
    if (enter)
        nw_worker_enter(w);
    int r = nw_pool_place_stand_by(&w->place, 1);
    if (enter)
        nw_worker_leave(w);
    return r;
}

void nw_worker_count_in(nw_worker *w, const nw_scoreboard *board, nw_score_slot *slot)
{
    w->board = slot ? board : NULL;
    w->slot = slot;
    w->counts = slot ? &slot->counts : NULL;
    /* (the worker's mapping of the board is writable: this word and its slot are its to write) */
    nw_handoff_count_in(&w->handoff, w->counts);
    nw_sources_count_in(&w->sources, slot, w->counts,
                        slot && board ? (volatile int64_t *)&board->h.serve_queued : NULL);
    nw_pool_place_count_in(&w->place, w->board, slot);
    nw_watcher_count_in(&w->watcher, w->board, slot);
    nw_adopt_count_in(&w->adopt, w->board, w->counts,
                      slot && board ? (volatile int64_t *)&board->h.handoff_queued : NULL);
    nw_park_publish(&w->parking.set, slot ? &slot->parked : NULL);
}

void nw_worker_free(nw_worker *w)
{
    nw_wconn *wc;
    if (!w)
        return;
    nw_custody_wait_drop(&w->custody);
    if (w->watcher.running) {
        nw_worker_enter(w);
        nw_worker_stop_watcher(w);
    }
    while ((wc = nw_watcher_take_evicted(&w->watcher)))
        drop_owner(w, wc);
    nw_wconn_free(w->watcher.kept);
    w->watcher.kept = NULL;
    while ((wc = nw_parking_take_any(&w->parking)))
        drop_owner(w, wc);
    nw_deferred_signals_close(&w->signals);
    nw_sources_close(&w->sources);  /* (after the watcher: its accepts read it) */
    nw_handoff_close(&w->handoff);
    nw_adopt_close(&w->adopt);
    close(w->epfd);
    nw_pool_place_close(&w->place);
    nw_conn_spares_free(&w->spares);
    free(w);
}
