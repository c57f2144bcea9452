/* One request on a connection the worker holds, from its read to the
 * connection's release: the worker loop's common case in C, with Perl
 * called back only for what is not common ("One request in C" in
 * docs/DESIGN.md). Also what every request's start and end write: the
 * scoreboard and the access log. */
#include "narwhal_xs.h"
#include "nw_log.h"

#include <strings.h>

void nw_xs_worker_leave_on_unwind(pTHX_ void *w)
{
    nw_worker_leave((nw_worker *)w);
}

/* The deferred signals that are pending: the stop signals go into the
 * worker's life (C: nw_worker_deliver_signals); USR1, after a log
 * rotation, reopens the logs (the worker's _reopen_logs). */
int nw_serve_deliver_signals(pTHX_ nw_xs_acceptor *a)
{
    uint64_t others = nw_worker_deliver_signals(a->w);
    if ((others & ((uint64_t)1 << SIGUSR1)) && a->serve.worker) {
        dSP;
        ENTER;
        SAVETMPS;
        PUSHMARK(SP);
        XPUSHs(a->serve.worker);
        PUTBACK;
        call_method("_reopen_logs", G_DISCARD);
        FREETMPS;
        LEAVE;
    }
    return others != 0;
}

/* ---- a request's start and end ----------------------------------------- */

static nw_str header_value(const nw_request *r, const char *name, size_t len)
{
    for (size_t i = 0; i < r->num_headers; i++)
        if (r->headers[i].name_len == len && !strncasecmp(r->headers[i].name, name, len))
            return (nw_str){ r->headers[i].value, r->headers[i].value_len };
    return (nw_str){ NULL, 0 };
}

/* --access-log-client forwarded: whether X-Forwarded-For on this
 * connection comes from a proxy we trust (a unix-socket peer: the socket's
 * mode decides who connects; or an address in --forwarded-from). */
static int forwarded_trusted(const nw_xs_report *rep, const nw_wconn *wc)
{
    if (wc->peer_len == 0 || wc->peer.ss_family == AF_UNIX)
        return 1;
    return rep->forwarded_from_n
        && nw_proxy_cidr_match(rep->forwarded_from, rep->forwarded_from_n,
                               (const struct sockaddr *)&wc->peer);
}

/* One line for the request that ends on xc (parsed: its request line and
 * headers are there to read). */
void nw_serve_log_request(pTHX_ const nw_xs_report *rep, nw_xs_conn *xc, int parsed,
                          uint64_t now_us)
{
    nw_conn *c = xc->c;
    nw_access_entry e;
    STRLEN alen = 0;
    const char *addr = xc->remote_addr ? SvPV(xc->remote_addr, alen) : NULL;
    memset(&e, 0, sizeof e);
    e.remote_addr = (nw_str){ addr, alen };
    e.minor_version = -1;
    char forwarded[64];
    if (rep->access_forwarded && parsed && forwarded_trusted(rep, xc->wc)) {
        nw_str f = nw_access_forwarded_for(header_value(&c->req, "X-Forwarded-For", 15),
                                           forwarded, sizeof forwarded);
        if (f.p)
            e.remote_addr = f;
    }
    if (parsed) {
        e.method = (nw_str){ c->req.method, c->req.method_len };
        e.target = (nw_str){ c->req.target, c->req.target_len };
        e.minor_version = c->req.minor_version;
        e.referer = header_value(&c->req, "Referer", 7);
        e.user_agent = header_value(&c->req, "User-Agent", 10);
        e.duration_us = xc->wc->started_us && now_us > xc->wc->started_us
                      ? now_us - xc->wc->started_us : 0;
    }
    if (c->request_id_len)
        e.request_id = (nw_str){ c->request_id, c->request_id_len };
    e.status = c->status;
    e.bytes = c->body_sent;
    e.pid = rep->access_log_pid;
    nw_access_log_record(rep->access_log, &e, (nw_msec)(now_us / 1000));
}

/* --crash-backoff: the request's route killed workers again and again,
 * and the master says to answer it 503 for a while (a route it watches
 * has its request counted). */
static int route_blocked(const nw_xs_report *rep, nw_conn *c)
{
    uint64_t route = nw_route_hash(c->req.method, c->req.method_len, c->req.target, c->req.target_len);
    if (!nw_scoreboard_route_check(rep->header, route, nw_now_ms()))
        return 0;
    if (rep->slot)
        rep->slot->counts.crash_refused++;
    return 1;
}

/* The answer in the app's place: an ordinary response (the body read,
 * keep-alive kept), so that a client of the route costs no more than any
 * other's request. */
static SV *crash_refusal(pTHX)
{
    AV *headers = newAV();
    av_push(headers, newSVpvs("Content-Type"));
    av_push(headers, newSVpvs("text/plain"));
    av_push(headers, newSVpvs("Retry-After"));
    av_push(headers, newSVpvs("1"));
    AV *body = newAV();
    av_push(body, newSVpvs("503 Service Unavailable\n"));
    AV *res = newAV();
    av_push(res, newSViv(503));
    av_push(res, newRV_noinc((SV *)headers));
    av_push(res, newRV_noinc((SV *)body));
    return newRV_noinc((SV *)res);
}

/* narwhal_request_queue_seconds: how long the request's complete head
 * waited before this worker began it. In the manager's queue: from when the
 * manager had it (SERVE's ready_ms). Otherwise, parked here while the worker
 * was busy or in the listen queue: from the kernel's receive time of its
 * last bytes (TCP only; a unix socket gives none, and then nothing is
 * recorded). */
#define WAIT_BEYOND_BELIEF_NS (3600LL * 1000000000)   /* an hour: the clock was set meanwhile */

static void record_queue_wait(nw_score_slot *slot, nw_xs_conn *xc)
{
    nw_wconn *wc = xc->wc;
    if (wc->queued) {
        uint64_t at = wc->started_us;
        uint32_t waited_ms = (uint32_t)(at / 1000) - wc->ready_ms;
        wc->queued = 0;
        if (waited_ms < 0x80000000u)
            nw_scoreboard_queue_wait(slot, (uint64_t)waited_ms * 1000 + at % 1000);
    } else if (xc->c->arrived_ns) {
        int64_t waited_ns = nw_wall_clock_ns() - xc->c->arrived_ns;
        if (waited_ns >= 0 && waited_ns < WAIT_BEYOND_BELIEF_NS)   /* (not across a clock step) */
            nw_scoreboard_queue_wait(slot, (uint64_t)waited_ns / 1000);
    }
}

HV *nw_serve_read(pTHX_ const nw_xs_report *rep, nw_xs_conn *xc, SV *self_rv, double max_wait,
                  int wait_partial, int *result)
{
    nw_score_slot *slot = rep->slot;
    nw_conn *c = xc->c;
    HV *env = NULL;
    int r = c->fd < 0 ? NW_REQ_CLOSED : nw_conn_read_head(c, max_wait, wait_partial);
    if (r == NW_REQ_READY && c->proxy_fresh) {     /* --proxy-protocol: the client's address */
        c->proxy_fresh = 0;
        if (!c->proxy.local && c->proxy.src_len)
            nw_env_peer(aTHX_ xc, &c->proxy.src, c->proxy.src_len);
    }
    xc->crash_refused = r == NW_REQ_READY && rep->header && rep->header->crash_routes
                        && route_blocked(rep, c);    /* --crash-backoff: 503, the app is not run */
    if (r == NW_REQ_READY) {
        env = nw_env_build(aTHX_ xc, self_rv);
        r = nw_conn_read_body(c);
        if (r == NW_REQ_READY) {
            nw_wconn_request_started(xc->wc);
            if (slot) {
                int px = !c->proxy.local && c->proxy.src_len;   /* a PROXY header said */
                nw_scoreboard_request_begin(slot, c->req.method, c->req.method_len,
                                            c->req.target, c->req.target_len, xc->wc->started_us,
                                            px ? (struct sockaddr *)&c->proxy.src
                                               : (struct sockaddr *)&xc->wc->peer,
                                            px ? c->proxy.src_len : xc->wc->peer_len);
                record_queue_wait(slot, xc);
            }
            nw_env_body(aTHX_ env, c);
        } else {
            SvREFCNT_dec((SV *)env);
            env = NULL;
        }
    }
    if (r == NW_REQ_CLOSED && c->proxy_refused) {   /* not a valid PROXY header */
        c->proxy_refused = 0;
        if (slot)
            nw_scoreboard_proxy_rejected(slot, NW_PROXY_REJECT_BAD_HEADER,
                                         (struct sockaddr *)&xc->wc->peer, xc->wc->peer_len,
                                         nw_now_ms());
    }
    if (r == NW_REQ_ERROR) {
        if (slot) {   /* (first: the close lingers) */
            nw_scoreboard_count_error(slot, c->error_status);
            if (c->spool_errno)
                slot->counts.spool_failed++;
        }
        nw_conn_send_error(c, c->error_status);
        if (rep->access_log)
            nw_serve_log_request(aTHX_ rep, xc, c->req.method_len > 0 && c->req.target_len > 0,
                                 nw_now_us());
    }
    *result = r;
    return env;
}

void nw_serve_end(pTHX_ const nw_xs_report *rep, nw_xs_conn *xc, SV *env_rv, int finish_conn)
{
    uint64_t now = nw_now_us();     /* (the one reading: the next deadlines use it too) */
    nw_wconn_request_ended(xc->wc, now);
    if (rep->slot)
        nw_scoreboard_request_end(rep->slot, xc->c->status, xc->c->body_sent, now);
    if (rep->access_log)
        nw_serve_log_request(aTHX_ rep, xc, 1, now);
    if (finish_conn)
        nw_conn_finish_request(xc->c, (nw_msec)(now / 1000));
    if (env_rv && SvROK(env_rv) && SvTYPE(SvRV(env_rv)) == SVt_PVHV)
        nw_env_recycle(aTHX_ xc->env, (HV *)SvRV(env_rv));
}

/* ---- calls into Perl ------------------------------------------------- */

/* The app's response to env_rv, owned by the caller; the app's error, if
 * it died, is in $@ (ERRSV), as after eval { $app->($env) }. */
static SV *call_app(pTHX_ SV *app, SV *env_rv)
{
    dSP;
    SV *res = NULL;
    ENTER;
    SAVETMPS;
    PUSHMARK(SP);
    XPUSHs(env_rv);
    PUTBACK;
    int n = call_sv(app, G_SCALAR | G_EVAL);
    SPAGAIN;
    if (n == 1) {
        SV *got = POPs;
        /* a temporary nothing else holds is taken as it is (no copy) */
        res = SvTEMP(got) && SvREFCNT(got) == 1 ? SvREFCNT_inc_simple_NN(got) : newSVsv(got);
    }
    PUTBACK;
    FREETMPS;
    LEAVE;
    return res ? res : newSV(0);
}

/* $worker->method(args): its scalar result's truth. A method that dies
 * takes the worker with it, as it did when the Perl loop called it. */
static int call_worker(pTHX_ const nw_serve_setup *s, const char *method, int nargs, ...)
{
    dSP;
    va_list ap;
    ENTER;
    SAVETMPS;
    PUSHMARK(SP);
    EXTEND(SP, nargs + 1);
    PUSHs(s->worker);
    va_start(ap, nargs);
    for (int i = 0; i < nargs; i++)
        PUSHs(va_arg(ap, SV *));
    va_end(ap);
    PUTBACK;
    int n = call_method(method, G_SCALAR);
    SPAGAIN;
    int truth = n == 1 ? SvTRUE(POPs) : 0;
    PUTBACK;
    FREETMPS;
    LEAVE;
    return truth;
}

/* ---- the sequence ------------------------------------------------------ */

/* What serving one request came to (besides a read's NW_REQ_* result
 * when no request came). */
#define SERVED_KEPT    2     /* the worker serves the connection on */
#define SERVED_LET_GO  3     /* the connection was parked, handed off or closed */

static int release(pTHX_ nw_xs_acceptor *a, nw_xs_conn *xc, nw_release_reason why)
{
    WORKER_SCOPE(a->w);
    int let_go = nw_worker_release(a->w, xc->wc, why);
    WORKER_SCOPE_END;
    if (let_go)
        xc->turn = 0;
    return let_go;
}

/* --min-worker-lifetime: a worker at its count, or at the request after
 * which it would ask for its replacement, that is younger than that is
 * given its own count again (limit_step: --max-reqs-per-child as drawn
 * for it), as often as it takes, so that heavy load does not replace
 * workers several times a second. */
static void extend_if_young(nw_serve_setup *s)
{
    if (s->min_lifetime_ms && nw_now_ms() - s->born_ms < s->min_lifetime_ms) {
        s->limit += s->limit_step;
        if (s->replace_at)
            s->replace_at += s->limit_step;
    }
}

/* Workers started together reach their counts together. One at the
 * request after which it would ask for its replacement asks only with
 * the board's recycling turn; while another worker holds it, it serves
 * its last twentieth again (replace_ahead requests) and tries again then
 * (a turn held NW_RECYCLE_TURN_MAX_MS is free: its holder is stuck).
 * Recycled one after the other, each leaving worker's connections go to
 * its own replacement, idle and ready, instead of four workers' at once
 * to whoever is there. */
static void wait_turn_if_other_recycling(nw_serve_setup *s)
{
    const nw_xs_report *rep = s->report;
    if ((IV)s->life->served != s->replace_at || !rep->slot || !rep->board)
        return;
    if (nw_scoreboard_take_recycle_turn(rep->board, rep->slot->pid, nw_now_ms(),
                                        s->recycle_turn_ms))
        return;
    s->limit += s->replace_ahead;
    s->replace_at += s->replace_ahead;
}

/* A worker at its count that asked for its replacement leaves once the
 * replacement is ready to take its connections: until a worker of its
 * generation forked since it asked is idle or busy (the master may not
 * even have forked it yet: on a busy machine it answers the ask some
 * milliseconds later, and forking and loading take tens of them, more
 * than the last twentieth), it serves on, a little at a time,
 * NW_RECYCLE_SUCCESSOR_WAIT_MS at most. Leaving before, its connections
 * went to the busy workers over the pool's mean, 50 ms later, and stayed
 * there. */
static void wait_for_successor(nw_serve_setup *s)
{
    const nw_xs_report *rep = s->report;
    if (!s->asked_ms || !rep->slot || !rep->board)
        return;
    if (nw_now_ms() - s->asked_ms >= NW_RECYCLE_SUCCESSOR_WAIT_MS
        || nw_scoreboard_ready_since(rep->board, rep->slot->generation, s->asked_ms))
        return;
    s->limit += s->replace_ahead / 8 + 1;
}

/* Whether n requests are --max-reqs-per-child (as extended). */
static int limit_reached(nw_serve_setup *s, IV n)
{
    if (!s->limit || n < s->limit)
        return 0;
    extend_if_young(s);
    if (n >= s->limit)
        wait_for_successor(s);
    return n >= s->limit;
}

/* Whether the worker leaves now: stopping, or at its count (which is then
 * its exit reason: the count it reached, not the one it was first given,
 * is what --min-worker-lifetime makes of it). */
static int leaving_now(nw_serve_setup *s)
{
    if (!s->life->stopping && limit_reached(s, (IV)s->life->served))
        nw_worker_life_stop(s->life, 0, NW_EXIT_MAX_REQUESTS);
    return s->life->stopping;
}

/* Whether the response may keep the connection: keep-alive is on and the
 * worker is not closing; without a manager also not stopping and not at
 * its last request (a worker with a manager leaves it to the manager). */
static int may_keep_alive(pTHX_ nw_serve_setup *s)
{
    if (!s->keepalive)
        return 0;
    if (s->managed)
        return !s->life->closing;
    return !s->life->stopping && !limit_reached(s, (IV)s->life->served + 1);
}

/* --max-worker-rss, looked at before the response is written: a worker
 * without a manager must say Connection: close when it leaves. */
static int over_memory(pTHX_ const nw_serve_setup *s)
{
    if (s->rss_limit_mb <= 0 || s->life->exit_reason)
        return 0;
    uint64_t kib = nw_worker_rss_over((uint64_t)(s->rss_limit_mb * 1024));
    if (!kib)
        return 0;
    nw_log("warn", "resident size %.0f MiB is over --max-worker-rss %.0f after %llu requests; "
           "it is replaced", (double)kib / 1024.0, s->rss_limit_mb,
           (unsigned long long)s->life->served);
    nw_worker_life_stop(s->life, 0, NW_EXIT_MEMORY);
    return 1;
}

/* --max-reqs-per-child, near the limit: the master forks the replacement
 * now (the slot says why this worker will leave; a byte wakes the
 * master), so that it is ready, idle, to adopt this worker's connections
 * when it leaves ("Retirement" in docs/DESIGN.md). */
static void want_replacement(nw_serve_setup *s)
{
    s->life->replacing = 1;
    s->asked_ms = nw_now_ms();
    if (s->report->slot)
        s->report->slot->exit_reason = NW_EXIT_MAX_REQUESTS;
    if (s->wake_master_fd >= 0 && write(s->wake_master_fd, "r", 1) < 0) {
        /* (a full pipe: the master is awake already) */
    }
}

/* The app's response written: the common shape in C, any other through
 * the worker's respond (which also answers 500 to an app that died).
 * Returns whether the connection may serve another request. */
static int write_response(pTHX_ const nw_serve_setup *s, nw_xs_conn *xc, SV *conn_rv,
                          SV *env_rv, SV *res, int may_keep)
{
    int kept = nw_response_write_common(aTHX_ xc->c, res, may_keep);
    if (kept >= 0)
        return kept;
    return call_worker(aTHX_ s, "respond", 5, conn_rv, env_rv, res,
                       may_keep ? &PL_sv_yes : &PL_sv_no, ERRSV);
}

/* What becomes of a connection whose response kept it alive. */
static int after_kept(pTHX_ nw_xs_acceptor *a, nw_xs_conn *xc)
{
    nw_serve_setup *s = &a->serve;
    if (leaving_now(s)) {
        /* leaving: when the worker is recycled or retired the manager
         * takes it over; when the server stops it is closed */
        release(aTHX_ a, xc, s->managed && !s->life->closing ? NW_RELEASE_RETIRE
                                                           : NW_RELEASE_STOP);
        return SERVED_LET_GO;
    }
    if (!s->managed) {      /* a kept connection holds this worker: look at signals now and then */
        nw_serve_deliver_signals(aTHX_ a);
        return SERVED_KEPT;
    }
    /* A client that waits for each response has not sent its next request
     * yet: it is parked now rather than read first. Pipelined requests are
     * served a few in a row, then others get their turn. */
    if (release(aTHX_ a, xc, NW_RELEASE_KEEPALIVE))
        return SERVED_LET_GO;
    if (++xc->turn < s->quantum)
        return SERVED_KEPT;
    xc->turn = 0;
    return release(aTHX_ a, xc, NW_RELEASE_QUANTUM) ? SERVED_LET_GO : SERVED_KEPT;
}

/* One request on xc, read to release: SERVED_LET_GO, SERVED_KEPT, or the
 * read's result when no request came (NW_REQ_AGAIN, CLOSED, TIMEOUT,
 * ERROR). */
static int serve_request(pTHX_ nw_xs_acceptor *a, nw_xs_conn *xc, SV *conn_rv, double wait)
{
    nw_serve_setup *s = &a->serve;
    int r, outcome;
    ENTER;
    SAVETMPS;
    HV *env = nw_serve_read(aTHX_ s->report, xc, conn_rv, wait, s->managed, &r);
    if (!env) {
        FREETMPS;
        LEAVE;
        return r;
    }
    SV *env_rv = sv_2mortal(newRV_noinc((SV *)env));
    int may_keep = may_keep_alive(aTHX_ s);
    SV *res = xc->crash_refused ? crash_refusal(aTHX) : call_app(aTHX_ s->app, env_rv);
    if (over_memory(aTHX_ s) && !s->managed)
        may_keep = 0;
    int kept = write_response(aTHX_ s, xc, conn_rv, env_rv, res, may_keep);
    SvREFCNT_dec(res);      /* the response goes first, as it always did */
    s->life->served++;
    if (s->replace_at && (IV)s->life->served == s->replace_at) {
        extend_if_young(s);
        wait_turn_if_other_recycling(s);
        if ((IV)s->life->served == s->replace_at)
            want_replacement(s);    /* recycled soon */
    }
    /* C answers whether there may be anything to do after the response:
     * nothing, usually. A rest of the response that a slow client is
     * still reading goes to the manager first: that work must not hold
     * it back. */
    if (nw_env_needs_after(aTHX_ env_rv)) {
        if (s->managed) {
            WORKER_SCOPE(a->w);
            nw_worker_hand_off_rest(a->w, xc->wc, kept);
            WORKER_SCOPE_END;
        }
        call_worker(aTHX_ s, "_after_request", 1, env_rv);
    }
    if (!kept) {
        nw_serve_end(aTHX_ s->report, xc, env_rv, 0);
        release(aTHX_ a, xc, NW_RELEASE_CLOSE);
        outcome = SERVED_LET_GO;
    } else {
        nw_serve_end(aTHX_ s->report, xc, env_rv, 1);
        outcome = after_kept(aTHX_ a, xc);
    }
    FREETMPS;
    LEAVE;
    return outcome;
}

/* ---- the current connection -------------------------------------------- */

static HV *conn_stash;      /* Narwhal::Conn's, for a quick check */

void nw_serve_boot(pTHX)
{
    conn_stash = gv_stashpvs("Narwhal::Conn", GV_ADD);
}

int nw_serve_is_conn(pTHX_ SV *sv)
{
    return SvROK(sv) && SvOBJECT(SvRV(sv))
        && (SvSTASH(SvRV(sv)) == conn_stash || sv_derived_from(sv, "Narwhal::Conn"));
}

SV *nw_serve_conn_object(pTHX_ nw_xs_acceptor *a, nw_wconn *wc)
{
    if (wc->owner)
        return newRV_noinc((SV *)wc->owner);
    nw_xs_conn *xc;
    Newxz(xc, 1, nw_xs_conn);
    xc->wc = wc;
    xc->c = wc->c;
    xc->env = a->env[wc->c->listener];
    nw_env_recycler_ref(xc->env);
    nw_env_peer(aTHX_ xc, &wc->peer, wc->peer_len);
    SV *rv = newSV(0);
    sv_setref_pv(rv, "Narwhal::Conn", (void *)xc);
    wc->owner = SvRV(rv);
    wc->owner_mem = xc;
    return rv;
}

/* The connection in serve.conn, or NULL. One the loop put there (the
 * drain) starts its turn as a connection just taken does. */
static nw_xs_conn *current(pTHX_ nw_xs_acceptor *a)
{
    SV *slot = a->serve.conn;
    if (!SvROK(slot))
        return NULL;
    SV *obj = SvRV(slot);
    if (obj != a->current_obj) {
        if (!(SvOBJECT(obj) && SvSTASH(obj) == conn_stash) && !sv_derived_from(slot, "Narwhal::Conn"))
            croak("the worker's current connection is not a Narwhal::Conn");
        a->current_obj = obj;
        a->current = INT2PTR(nw_xs_conn *, SvIV(obj));
        a->current->turn = 0;
        a->wait = a->serve.managed ? 0 : a->serve.idle_wait;
    }
    return a->current;
}

/* The next connection (up to the idle wait) as the current one, or NULL. */
static nw_xs_conn *take_next(pTHX_ nw_xs_acceptor *a)
{
    WORKER_SCOPE(a->w);
    nw_wconn *wc = nw_worker_next(a->w, (int)(a->serve.idle_wait * 1000));
    SV *rv = wc ? nw_serve_conn_object(aTHX_ a, wc) : NULL;
    WORKER_SCOPE_END;
    if (!rv)
        return NULL;
    sv_setsv(a->serve.conn, rv);
    SvREFCNT_dec(rv);
    return current(aTHX_ a);
}

/* The current connection was let go: the worker has none. */
static void let_go(pTHX_ nw_xs_acceptor *a)
{
    a->current_obj = NULL;
    a->current = NULL;
    sv_setsv(a->serve.conn, &PL_sv_undef);
}

/* No request came on xc (what reading gave is r). With a manager, an idle
 * connection goes back (parked, or to the manager); when it will not, or
 * without a manager, the worker waits on it and looks at its signals
 * meanwhile. A closed, timed-out or refused one goes. */
static void no_request(pTHX_ nw_xs_acceptor *a, nw_xs_conn *xc, int r)
{
    const nw_serve_setup *s = &a->serve;
    if (r == NW_REQ_AGAIN) {
        if (s->managed && release(aTHX_ a, xc, NW_RELEASE_IDLE)) {
            let_go(aTHX_ a);
            return;
        }
        a->wait = s->idle_wait;
        nw_serve_deliver_signals(aTHX_ a);
        if (!s->life->stopping)
            return;
        release(aTHX_ a, xc, NW_RELEASE_STOP);
    } else {
        release(aTHX_ a, xc, NW_RELEASE_CLOSE);
    }
    let_go(aTHX_ a);
}

int nw_serve_next(pTHX_ nw_xs_acceptor *a)
{
    nw_serve_setup *s = &a->serve;
    nw_xs_conn *xc = current(aTHX_ a);
    if (!xc) {
        if (leaving_now(s))
            return NW_SERVE_LEAVING;
        if (!(xc = take_next(aTHX_ a)))
            return NW_SERVE_IDLE;
    }
    int r = serve_request(aTHX_ a, xc, s->conn, a->wait);
    if (r == SERVED_LET_GO)
        let_go(aTHX_ a);
    else if (r == SERVED_KEPT)
        a->wait = s->managed ? 0 : s->idle_wait;
    else
        no_request(aTHX_ a, xc, r);
    return NW_SERVE_ON;
}

/* Requests one after the other until no connection comes within the wait
 * or the worker must leave: the worker loop's busy turns, without a Perl
 * call and its argument checks per request (860 instructions of a hello
 * request). What the loop's statements did between two requests is done
 * here: temporaries freed, the signals Perl has taken run. */
int nw_serve_run(pTHX_ nw_xs_acceptor *a)
{
    int r;
    ENTER;
    SAVETMPS;
    while ((r = nw_serve_next(aTHX_ a)) == NW_SERVE_ON) {
        FREETMPS;
        PERL_ASYNC_CHECK();
    }
    FREETMPS;
    LEAVE;
    return r;
}

/* ---- setup ------------------------------------------------------------- */

/* The setup's references, listed once: taken by set, given back by clear. */
#define SETUP_REFS(s) { (s)->worker, (s)->app, (s)->conn }

void nw_serve_setup_set(pTHX_ nw_serve_setup *s, const nw_serve_setup *from)
{
    nw_serve_setup_clear(aTHX_ s);
    *s = *from;
    SV *refs[] = SETUP_REFS(s);
    for (size_t i = 0; i < sizeof refs / sizeof refs[0]; i++)
        SvREFCNT_inc_simple_void(refs[i]);
}

void nw_serve_setup_clear(pTHX_ nw_serve_setup *s)
{
    SV *refs[] = SETUP_REFS(s);
    for (size_t i = 0; i < sizeof refs / sizeof refs[0]; i++)
        SvREFCNT_dec(refs[i]);
    memset(s, 0, sizeof *s);
}

void nw_serve_report_clear(nw_xs_report *r)
{
    nw_access_log_close(r->access_log);
    free(r->forwarded_from);
    memset(r, 0, sizeof *r);
}
