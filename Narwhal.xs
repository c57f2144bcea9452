/* Glue between Perl and Narwhal's C: XSUBs that convert arguments and
 * call C, nothing more. Two classes: Narwhal::Acceptor (a worker's
 * scheduling, src/worker/nw_worker.c, and its requests, xs/serve.c) and
 * Narwhal::Conn (one connection: write a response the app returned in
 * any other shape, xs/response.c). Everything protocol-shaped lives in
 * src/. */
#include "xs/narwhal_xs.h"
#include "XSUB.h"

#include <errno.h>
#include <stddef.h>
#include <unistd.h>

#include "src/shared/nw_frame.h"
#include "src/shared/nw_scoreboard.h"
#include "src/worker/nw_accesslog.h"
#include "src/worker/nw_signal.h"
#include "src/shared/nw_log.h"
#include "src/worker/nw_sched.h"
#include <strings.h>

static HV *acceptor_stash;   /* for the typemap's quick check */

/* The access log's buffered lines out now (report: an acceptor's; the
 * request watchdog's last words too). */
static void flush_access_log(void *report)
{
    nw_xs_report *rep = report;
    if (rep->access_log)
        nw_access_log_flush(rep->access_log);
}

/* The master's scoreboard memfd (Narwhal::Scoreboard->fd), for the manager. */
static int scoreboard_fd = -1;

static nw_scoreboard *board_of(pTHX_ SV *self)
{
    if (!SvROK(self))
        croak("not a scoreboard");
    return INT2PTR(nw_scoreboard *, SvIV(SvRV(self)));
}

static nw_score_slot *slot_of(pTHX_ SV *self, unsigned index)
{
    nw_scoreboard *b = board_of(aTHX_ self);
    if (index >= b->h.nslots)
        croak("no scoreboard slot %u", index);
    return &b->slot[index];
}


/* A parked connection's Narwhal::Conn stays alive while the worker holds
 * it: the worker's hold is one reference to the object. */
static void owner_hold(void *owner)
{
    SvREFCNT_inc_simple_void_NN((SV *)owner);
}

static void owner_drop(void *owner)
{
    dTHX;
    SvREFCNT_dec((SV *)owner);
}

static const nw_worker_owner_ops owner_ops = { owner_hold, owner_drop };

static void acceptor_add_listener(pTHX_ nw_xs_acceptor *a, SV *e, SV *io_maker)
{
    if (!SvROK(e) || SvTYPE(SvRV(e)) != SVt_PVHV)
        croak("listener %d is not a hash", a->count);
    HV *l = (HV *)SvRV(e);
    SV **fd = hv_fetchs(l, "fd", 0), **tcp = hv_fetchs(l, "is_tcp", 0),
       **env = hv_fetchs(l, "env", 0);
    if (!fd || !env || !SvROK(*env) || SvTYPE(SvRV(*env)) != SVt_PVHV)
        croak("listener %d needs fd and env", a->count);
    if (nw_worker_listen(a->w, (int)SvIV(*fd), tcp && SvTRUE(*tcp)) < 0)
        croak("listener %d: %s", a->count, strerror(errno));
    a->env[a->count++] = nw_env_recycler_new(aTHX_ (HV *)SvRV(*env), io_maker);
}

static void export_constant(pTHX_ HV *stash, const char *name, IV value)
{
    newCONSTSUB(stash, name, newSViv(value));
}

MODULE = Narwhal    PACKAGE = Narwhal::Acceptor

PROTOTYPES: DISABLE

nw_xs_acceptor *
new(class, listeners, config, serve_queue = -1, handoff_queue = -1, io_maker = &PL_sv_undef)
    const char *class
    AV *listeners
    AV *config
    int serve_queue
    int handoff_queue
    SV *io_maker
  CODE:
    PERL_UNUSED_VAR(class);
    SSize_t n = av_len(listeners) + 1;
    if (n < 1 || n > NW_MAX_LISTENERS)
        croak("Narwhal::Acceptor needs 1 to %d listeners", NW_MAX_LISTENERS);
    nw_worker_config cfg;
    nw_config_from_av(aTHX_ config, &cfg);
    Newxz(RETVAL, 1, nw_xs_acceptor);
    RETVAL->w = nw_worker_new(&cfg.conn, cfg.keepalive_wait, serve_queue, handoff_queue,
                              &owner_ops);
    if (!RETVAL->w)
        croak("cannot set up the worker: %s", strerror(errno));
    for (SSize_t i = 0; i < n; i++) {
        SV **e = av_fetch(listeners, i, 0);
        acceptor_add_listener(aTHX_ RETVAL, e ? *e : &PL_sv_undef, io_maker);
    }
    if (cfg.worker_slice > 0)   /* (before the park watcher starts: it inherits it) */
        (void)nw_sched_set_slice((uint64_t)(cfg.worker_slice * 1e9));
    nw_worker_start(RETVAL->w);
  OUTPUT:
    RETVAL

SV *
next_conn(self, max_wait)
    nw_xs_acceptor *self
    double max_wait
  CODE:
    WORKER_SCOPE(self->w);
    nw_wconn *wc = nw_worker_next(self->w, (int)(max_wait * 1000));
    RETVAL = wc ? nw_serve_conn_object(aTHX_ self, wc) : &PL_sv_undef;
    WORKER_SCOPE_END;
  OUTPUT:
    RETVAL

void
serve_setup(self, worker, app, conn, opts)
    nw_xs_acceptor *self
    SV *worker
    SV *app
    SV *conn
    HV *opts
  CODE:
    /* What serve needs, once: the worker, the app, the worker's scalar
     * for the current connection (by reference), and the option values:
     * limit, replace_at, keepalive, managed, quantum, rss_limit_mb,
     * idle_wait, wake_master_fd, min_lifetime (seconds) (a missing one is
     * 0; wake_master_fd -1). */
    if (!SvROK(conn) || SvTYPE(SvRV(conn)) > SVt_PVMG)
        croak("Narwhal::Acceptor::serve_setup: conn is not a scalar reference");
    static const char *const names[] = { "limit", "replace_at", "keepalive", "managed", "quantum",
                                         "rss_limit_mb", "idle_wait", "wake_master_fd",
                                         "min_lifetime", "recycle_turn_ms" };
    enum { NAMES = sizeof names / sizeof names[0] };
    NV v[NAMES];
    for (int i = 0; i < NAMES; i++) {
        SV **f = hv_fetch(opts, names[i], (I32)strlen(names[i]), 0);
        v[i] = f && SvOK(*f) ? SvNV(*f) : (i == 7 ? -1 : 0);
    }
    for (HE *he = (hv_iterinit(opts), hv_iternext(opts)); he; he = hv_iternext(opts)) {
        I32 len;
        const char *key = hv_iterkey(he, &len);
        int known = 0;
        for (int i = 0; i < NAMES; i++)
            known |= (I32)strlen(names[i]) == len && !memcmp(names[i], key, (size_t)len);
        if (!known)
            croak("Narwhal::Acceptor::serve_setup: unknown option '%.*s'", (int)len, key);
    }
    nw_serve_setup s = {
        .worker = worker, .app = app, .conn = SvRV(conn), .life = &self->w->life,
        .report = &self->report,
        .limit = (IV)v[0], .replace_at = (IV)v[1], .keepalive = (int)v[2], .managed = (int)v[3],
        .quantum = v[4] >= 1 ? (int)v[4] : 1, .rss_limit_mb = v[5], .idle_wait = v[6],
        .wake_master_fd = (int)v[7], .limit_step = (IV)v[0],
        .replace_ahead = v[1] > 0 ? (IV)(v[0] - v[1]) : 0,
        .min_lifetime_ms = v[8] > 0 ? (nw_msec)(v[8] * 1000) : 0, .born_ms = nw_now_ms(),
        .recycle_turn_ms = v[9] > 0 ? (nw_msec)v[9] : NW_RECYCLE_TURN_MAX_MS,
    };
    nw_serve_setup_set(aTHX_ &self->serve, &s);
    self->current_obj = NULL;
    self->current = NULL;

SV *
life(self)
    nw_xs_acceptor *self
  CODE:
    /* The worker's life (nw_worker_life): {stopping, closing, replacing,
     * exit_reason, served}, read when serve returns. */
    const nw_worker_life *l = &self->w->life;
    HV *hv = newHV();
    (void)hv_stores(hv, "stopping", newSViv(l->stopping));
    (void)hv_stores(hv, "closing", newSViv(l->closing));
    (void)hv_stores(hv, "replacing", newSViv(l->replacing));
    (void)hv_stores(hv, "exit_reason", newSViv(l->exit_reason));
    (void)hv_stores(hv, "served", newSVuv((UV)l->served));
    RETVAL = newRV_noinc((SV *)hv);
  OUTPUT:
    RETVAL

void
stop(self, closing, reason = 0)
    nw_xs_acceptor *self
    int closing
    int reason
  CODE:
    /* Perl decided: the worker leaves (closing: the server stops), with
     * reason when none is known yet (an orphaned worker, an app's
     * psgix.harakiri.commit). */
    nw_worker_life_stop(&self->w->life, closing, reason);

int
life_signal(self, sig)
    nw_xs_acceptor *self
    int sig
  CODE:
    /* A stop signal that came before the signals were deferred (or to a
     * thread that did not block it): what it means for the worker's life.
     * 1 when it was one. */
    RETVAL = nw_worker_life_signal(&self->w->life, sig);
  OUTPUT:
    RETVAL

int
serve(self)
    nw_xs_acceptor *self
  CODE:
    /* Requests of the current connection and the next ones, until none
     * comes within the wait or the worker must leave ("One request in C"
     * in docs/DESIGN.md): SERVE_IDLE or SERVE_LEAVING. */
    if (!self->serve.app)
        croak("Narwhal::Acceptor::serve before serve_setup");
    RETVAL = nw_serve_run(aTHX_ self);
  OUTPUT:
    RETVAL

void
release_parked(self, reason)
    nw_xs_acceptor *self
    int reason
  CODE:
    if (reason != NW_RELEASE_RETIRE && reason != NW_RELEASE_STOP)
        croak("Narwhal::Acceptor::release_parked: RETIRE or STOP, not %d", reason);
    WORKER_SCOPE(self->w);
    nw_worker_release_parked(self->w, (nw_release_reason)reason);
    WORKER_SCOPE_END;

void
leave_process()
  CODE:
    /* From an END block, whatever way the worker exits (the app calling
     * exit included): the park watcher stops before global destruction
     * frees what it reads, and parked connections go to the manager. */
    nw_worker_leave_process(nw_worker_of_process());

void
note_stop_sender(self, ...)
    nw_xs_acceptor *self
  CODE:
    /* After $SIG{...} is set for these signals: a C handler goes in front
     * of Perl's and notes who sent each (stop_sender). */
    PERL_UNUSED_VAR(self);
    for (int i = 1; i < items; i++)
        nw_worker_note_stop_sender((int)SvIV(ST(i)));

long
stop_sender()
  CODE:
    RETVAL = nw_worker_stop_sender();
  OUTPUT:
    RETVAL

void
adopt_queue(self, in_fd, out_fd)
    nw_xs_acceptor *self
    int in_fd
    int out_fd
  CODE:
    if (nw_worker_adopt_queue(self->w, in_fd, out_fd) < 0)
        croak("adopt queue: %s\n", strerror(errno));

void
count_in_scoreboard(self, board, index)
    nw_xs_acceptor *self
    SV *board
    unsigned index
  CODE:
    /* (after the scoreboard's attach: the slot this worker writes, on
     * every request from now on, and its board) */
    nw_xs_report *rep = &self->report;
    rep->board = board_of(aTHX_ board);
    rep->slot = slot_of(aTHX_ board, index);
    rep->header = &rep->board->h;
    nw_worker_count_in(self->w, rep->board, rep->slot);

void
standby(self)
    nw_xs_acceptor *self
  CODE:
    /* --accepting-workers: this worker leaves new clients to the others */
    if (nw_worker_standby(self->w) < 0)
        croak("standby: %s", strerror(errno));

void
hand_off_on_crash(self)
    nw_xs_acceptor *self
  CODE:
    PERL_UNUSED_VAR(self);
    nw_worker_hand_off_on_crash();

void
drain(self, serve_ms = NW_STOP_SERVE_MS)
    nw_xs_acceptor *self
    int serve_ms
  CODE:
    nw_worker_drain(self->w, serve_ms);

void
defer_signals(self, ...)
    nw_xs_acceptor *self
  CODE:
    /* The signal numbers to defer until the worker is between requests
     * (see nw_worker_defer_signals). */
    int sigs[32], n = 0;
    for (int i = 1; i < items && n < 32; i++)
        sigs[n++] = (int)SvIV(ST(i));
    if (nw_worker_defer_signals(self->w, sigs, n) < 0)
        croak("cannot defer signals: %s", strerror(errno));

int
deliver_signals(self)
    nw_xs_acceptor *self
  CODE:
    /* Take what is pending now: a stop signal goes into the worker's
     * life (life() says it at once), USR1 reopens the logs. */
    RETVAL = nw_serve_deliver_signals(aTHX_ self);
  OUTPUT:
    RETVAL

void
config_fields()
  PPCODE:
    /* The names of the values new() wants, in its order. */
    size_t n = nw_config_field_count();
    EXTEND(SP, (SSize_t)n);
    for (size_t i = 0; i < n; i++)
        mPUSHp(nw_config_field_name(i), strlen(nw_config_field_name(i)));

int
has_manager(self)
    nw_xs_acceptor *self
  CODE:
    RETVAL = nw_worker_has_manager(self->w);
  OUTPUT:
    RETVAL

void
DESTROY(self)
    nw_xs_acceptor *self
  CODE:
    nw_serve_setup_clear(aTHX_ &self->serve);
    nw_worker_free(self->w);
    nw_serve_report_clear(&self->report);
    for (int i = 0; i < self->count; i++)
        nw_env_recycler_unref(aTHX_ self->env[i]);
    Safefree(self);

void
arm_watchdog(self, sig)
    nw_xs_acceptor *self
    int sig
  CODE:
    /* After $SIG{sig} is set: a C handler goes in front of Perl's. */
    PERL_UNUSED_VAR(self);
    nw_worker_watchdog_arm(sig, self->report.slot, flush_access_log, &self->report);

void
proxy_from(self, cidr)
    nw_xs_acceptor *self
    const char *cidr
  CODE:
    if (nw_worker_proxy_from(self->w, cidr) < 0)
        croak("--proxy-from: not an address or CIDR: '%s'\n", cidr);

void
watchdog_rearm()
  CODE:
    /* The Perl handler let a late signal go: the next one is a first one. */
    nw_worker_watchdog_rearm();

int
watchdog_end(self, conn = NULL)
    nw_xs_acceptor *self
    SV *conn
  CODE:
    /* The watchdog's Perl handler: 504 unless the response began; the
     * slot says why the worker leaves; the access log has its line, and is
     * flushed. Returns 1 when the 504 went out. */
    RETVAL = nw_worker_watchdog_reply();
    if (self->report.access_log && conn && nw_serve_is_conn(aTHX_ conn)) {
        nw_xs_conn *xc = INT2PTR(nw_xs_conn *, SvIV(SvRV(conn)));
        if (RETVAL)
            xc->c->status = 504;
        nw_serve_log_request(aTHX_ &self->report, xc, 1, nw_now_us());
    }
    flush_access_log(&self->report);
  OUTPUT:
    RETVAL

MODULE = Narwhal    PACKAGE = Narwhal::Conn

int
write_response(self, status, headers, body, may_keep_alive)
    nw_xs_conn *self
    int status
    SV *headers
    AV *body
    int may_keep_alive
  CODE:
    RETVAL = nw_response_write_array(aTHX_ self->c, status, headers, body, may_keep_alive);
  OUTPUT:
    RETVAL

int
start_response(self, status, headers, known_length, may_keep_alive)
    nw_xs_conn *self
    int status
    SV *headers
    double known_length
    int may_keep_alive
  CODE:
    RETVAL = nw_response_start(aTHX_ self->c, status, headers, (int64_t)known_length,
                               may_keep_alive);
  OUTPUT:
    RETVAL

int
write_body(self, data)
    nw_xs_conn *self
    SV *data
  CODE:
    STRLEN len;
    struct iovec v;
    v.iov_base = (void *)SvPV(data, len);
    v.iov_len = len;
    RETVAL = nw_conn_write_body(self->c, &v, len ? 1 : 0) == NW_IO_OK;
  OUTPUT:
    RETVAL

void
sendfile_source(body)
    SV *body
  PPCODE:
    /* (fd, offset, bytes left) when body may be sent with sendfile; an
     * empty list when it must be read through getline. */
    int fd;
    off_t offset;
    int64_t left;
    if (nw_response_file_source(aTHX_ body, &fd, &offset, &left)) {
        EXTEND(SP, 3);
        mPUSHi(fd);
        mPUSHn((NV)offset);
        mPUSHn((NV)left);
    }

int
send_file(self, fd, offset, len)
    nw_xs_conn *self
    int fd
    double offset
    double len
  CODE:
    RETVAL = nw_conn_send_file(self->c, fd, (off_t)offset, (size_t)len) == NW_IO_OK;
  OUTPUT:
    RETVAL

int
end_body(self)
    nw_xs_conn *self
  CODE:
    RETVAL = nw_conn_end_body(self->c);
  OUTPUT:
    RETVAL

int
informational(self, status, headers)
    nw_xs_conn *self
    int status
    SV *headers
  CODE:
    RETVAL = nw_response_informational(aTHX_ self->c, status, headers);
  OUTPUT:
    RETVAL

void
abandon(self)
    nw_xs_conn *self
  CODE:
    nw_conn_abandon(self->c);

int
response_started(self)
    nw_xs_conn *self
  CODE:
    RETVAL = self->c->responded;
  OUTPUT:
    RETVAL

int
fd(self)
    nw_xs_conn *self
  CODE:
    RETVAL = self->c->fd;
  OUTPUT:
    RETVAL

void
DESTROY(self)
    nw_xs_conn *self
  CODE:
    nw_wconn_free(self->wc);
    nw_env_recycler_unref(aTHX_ self->env);
    SvREFCNT_dec(self->remote_addr);
    SvREFCNT_dec(self->remote_port);
    SvREFCNT_dec(self->io);
    Safefree(self);

MODULE = Narwhal    PACKAGE = Narwhal::Scoreboard

SV *
new(class, nslots)
    const char *class
    unsigned nslots
  CODE:
    /* Mapped by the master before the first fork: every worker shares it,
     * and the manager maps it from the memfd (fd). */
    int fd;
    nw_scoreboard *b = nw_scoreboard_create(nslots, &fd);
    if (!b)
        croak("cannot map the scoreboard: %s", strerror(errno));
    b->h.master_pid = (int32_t)getpid();
    b->h.started_unix = (int64_t)time(NULL);
    {   /* narwhal_build_info's labels */
        SV *v = get_sv("Narwhal::VERSION", 0);
        const char *vs = v && SvOK(v) ? SvPV_nolen(v) : "";
        strncpy(b->h.version, vs, sizeof b->h.version - 1);
        strncpy(b->h.perl_version, PERL_VERSION_STRING, sizeof b->h.perl_version - 1);
    }
    scoreboard_fd = fd;
    RETVAL = newSV(0);
    sv_setref_pv(RETVAL, class, (void *)b);
  OUTPUT:
    RETVAL

int
fd(self)
    SV *self
  CODE:
    PERL_UNUSED_VAR(self);
    RETVAL = scoreboard_fd;
  OUTPUT:
    RETVAL

unsigned
slots(self)
    SV *self
  CODE:
    RETVAL = board_of(aTHX_ self)->h.nslots;
  OUTPUT:
    RETVAL

void
claim(self, index, pid, generation = 0, standby = 0)
    SV *self
    unsigned index
    int pid
    int generation
    int standby
  CODE:
    nw_scoreboard_claim(slot_of(aTHX_ self, index), pid, generation, standby, nw_now_ms());

void
attach(self, index)
    SV *self
    unsigned index
  CODE:
    /* In a worker: its slot, which its acceptor writes on every request
     * (count_in_scoreboard), and the board's words its connections read. */
    nw_score_slot *slot = slot_of(aTHX_ self, index);
    slot->pid = (int32_t)getpid();
    slot->state = NW_WORKER_IDLE;
    nw_conn_watch_closing(&board_of(aTHX_ self)->h.stopping);
    nw_conn_watch_offload(&board_of(aTHX_ self)->h.offload_bytes);
    nw_conn_count_handoffs(&board_of(aTHX_ self)->h.handoff_queued);
    nw_conn_count_held(&slot->conns);

void
leaving(self, index, reason = 0)
    SV *self
    unsigned index
    int reason
  CODE:
    /* In a worker: it is on its way out, and why (enum nw_exit_reason). */
    nw_score_slot *slot = slot_of(aTHX_ self, index);
    if (reason)
        slot->exit_reason = reason;
    slot->state = NW_WORKER_STOPPING;

SV *
slot(self, index)
    SV *self
    unsigned index
  CODE:
    /* What the master knows of a worker: {pid, state, started, served,
     * standby, request (its current or last "METHOD target"),
     * running_ms, exit_reason, since_us}. */
    const nw_score_slot *s = slot_of(aTHX_ self, index);
    static const char *const state_name[] = { "free", "starting", "idle", "busy", "stopping" };
    static const char *const reason_name[] = { "", "max-requests", "memory", "watchdog", "retired",
                                                "stopped" };
    HV *hv = newHV();
    uint32_t len = s->request_len < sizeof s->request ? s->request_len : sizeof s->request;
    int state = s->state, reason = s->exit_reason;
    (void)hv_stores(hv, "pid", newSViv(s->pid));
    (void)hv_stores(hv, "state", newSVpv(state >= 0 && state <= NW_WORKER_STOPPING
                                         ? state_name[state] : "free", 0));
    (void)hv_stores(hv, "started", newSVuv(s->started));
    (void)hv_stores(hv, "served", newSVuv(s->counts.served));
    (void)hv_stores(hv, "standby", newSViv(s->standby));
    (void)hv_stores(hv, "blocking", newSViv(s->blocking));
    (void)hv_stores(hv, "request", newSVpvn(s->request, len));
    (void)hv_stores(hv, "since_us", newSVnv((NV)s->since_us));
    (void)hv_stores(hv, "running_ms", newSViv(state == NW_WORKER_BUSY
                                              ? (IV)((nw_now_us() - s->since_us) / 1000) : 0));
    (void)hv_stores(hv, "idle_ms", newSViv(state == NW_WORKER_IDLE   /* since its last request,
                                                                     * or since it was born */
        ? (s->last_end_us ? (IV)((nw_now_us() - s->last_end_us) / 1000) : (IV)(nw_now_ms() - s->born))
        : 0));
    (void)hv_stores(hv, "exit_reason", newSVpv(reason > 0 && reason <= NW_EXIT_STOPPED
                                               ? reason_name[reason] : "", 0));
    RETVAL = newRV_noinc((SV *)hv);
  OUTPUT:
    RETVAL

void
release(self, index)
    SV *self
    unsigned index
  CODE:
    /* A reaped worker: its counts join the totals, its slot is free. */
    nw_scoreboard_fold(board_of(aTHX_ self), slot_of(aTHX_ self, index));

int
pool_stuck(self, ms)
    SV *self
    unsigned ms
  CODE:
    RETVAL = nw_scoreboard_pool_stuck(board_of(aTHX_ self), nw_now_us(), (uint64_t)ms * 1000, 0, NULL);
  OUTPUT:
    RETVAL

void
waits(self, over_ms)
    SV *self
    unsigned over_ms
  PPCODE:
    /* (all, over): queue waits recorded, and how many were longer */
    uint64_t all, over;
    nw_scoreboard_waits(board_of(aTHX_ self), (uint64_t)over_ms * 1000, &all, &over);
    EXTEND(SP, 2);
    mPUSHn((NV)all);
    mPUSHn((NV)over);

void
set_pool(self, min, max)
    SV *self
    int min
    int max
  CODE:
    board_of(aTHX_ self)->h.workers_min = min;
    board_of(aTHX_ self)->h.workers_max = max;

void
count_pool_change(self, reason)
    SV *self
    unsigned reason
  CODE:
    if (reason < NW_POOL_CHANGES)
        board_of(aTHX_ self)->h.pool_changes[reason]++;

void
set_stopping(self, on)
    SV *self
    int on
  CODE:
    board_of(aTHX_ self)->h.stopping = on;

void
set_ready(self)
    SV *self
  CODE:
    board_of(aTHX_ self)->h.ready = 1;

int
stopping(self)
    SV *self
  CODE:
    /* Whether the master has begun a stop (or a drain). */
    RETVAL = board_of(aTHX_ self)->h.stopping != 0;
  OUTPUT:
    RETVAL

void
set_workers_wanted(self, n)
    SV *self
    int n
  CODE:
    board_of(aTHX_ self)->h.workers_wanted = n;

void
count_restart(self, reason)
    SV *self
    int reason
  CODE:
    if (reason >= 0 && reason < NW_RESTART_REASONS)
        board_of(aTHX_ self)->h.restarts[reason]++;

int
watch_route(self, request)
    SV *self
    SV *request
  CODE:
    /* --crash-backoff: the entry of the route of request ("METHOD
     * target"), watched from now on; -1 when every entry is taken. */
    STRLEN len;
    const char *p = SvPV(request, len);
    RETVAL = nw_scoreboard_watch_route(board_of(aTHX_ self), nw_route_hash_request(p, len));
  OUTPUT:
    RETVAL

UV
route_started(self, entry)
    SV *self
    int entry
  CODE:
    RETVAL = entry >= 0 && entry < NW_CRASH_ROUTES
           ? __atomic_load_n(&board_of(aTHX_ self)->h.crash_route[entry].started, __ATOMIC_RELAXED) : 0;
  OUTPUT:
    RETVAL

void
block_route(self, entry, ms)
    SV *self
    int entry
    double ms
  CODE:
    nw_scoreboard_block_route(board_of(aTHX_ self), entry, nw_now_ms() + (nw_msec)ms);

void
unwatch_route(self, entry)
    SV *self
    int entry
  CODE:
    nw_scoreboard_unwatch_route(board_of(aTHX_ self), entry);

void
count_manager_restart(self)
    SV *self
  CODE:
    board_of(aTHX_ self)->h.manager_restarts++;

SV *
totals(self)
    SV *self
  CODE:
    nw_score_counts t;
    nw_scoreboard_totals(board_of(aTHX_ self), &t);
    HV *hv = newHV();
    AV *cl = newAV();
    for (int i = 0; i < NW_SCORE_CLASSES; i++)
        av_push(cl, newSVnv((NV)t.by_class[i]));
    (void)hv_stores(hv, "served", newSVnv((NV)t.served));
    (void)hv_stores(hv, "by_class", newRV_noinc((SV *)cl));
    (void)hv_stores(hv, "proxy_bad_header", newSVnv((NV)t.proxy_rejected[NW_PROXY_REJECT_BAD_HEADER]));
    (void)hv_stores(hv, "proxy_not_allowed", newSVnv((NV)t.proxy_rejected[NW_PROXY_REJECT_NOT_ALLOWED]));
    RETVAL = newRV_noinc((SV *)hv);
  OUTPUT:
    RETVAL

SV *
proxy_last(self)
    SV *self
  CODE:
    /* The latest connection a live worker refused under --proxy-protocol:
     * [peer, reason ("bad_header" or "not_allowed")], or undef. */
    const nw_scoreboard *b = board_of(aTHX_ self);
    const nw_score_slot *last = NULL;
    nw_msec at = 0;
    for (uint32_t i = 0; i < b->h.nslots; i++) {
        nw_msec t = __atomic_load_n(&b->slot[i].proxy_last_ms, __ATOMIC_ACQUIRE);
        if (b->slot[i].pid && t > at) {
            at = t;
            last = &b->slot[i];
        }
    }
    if (last) {
        char peer[NW_SCOREBOARD_PEER];
        memcpy(peer, last->proxy_last_peer, sizeof peer);
        peer[sizeof peer - 1] = 0;
        AV *av = newAV();
        av_push(av, newSVpv(peer, 0));
        av_push(av, newSVpv(last->proxy_last_reason == NW_PROXY_REJECT_NOT_ALLOWED
                            ? "not_allowed" : "bad_header", 0));
        RETVAL = newRV_noinc((SV *)av);
    } else {
        RETVAL = &PL_sv_undef;
    }
  OUTPUT:
    RETVAL

MODULE = Narwhal    PACKAGE = Narwhal::Proxy

int
cidr_ok(text)
    const char *text
  CODE:
    nw_proxy_cidr c;
    RETVAL = nw_proxy_cidr_parse(text, &c) == 0;
  OUTPUT:
    RETVAL

MODULE = Narwhal    PACKAGE = Narwhal::Acceptor

void
access_log_open(self, path, json)
    nw_xs_acceptor *self
    const char *path
    int json
  CODE:
    /* In a worker, as its user: --access-log. */
    nw_xs_report *rep = &self->report;
    if (rep->access_log)
        nw_access_log_close(rep->access_log);
    rep->access_log = nw_access_log_open(path, json ? NW_ACCESS_JSON : NW_ACCESS_COMBINED);
    if (!rep->access_log)
        croak("cannot open the access log %s: %s\n", path, strerror(errno));
    rep->access_log_pid = (int)getpid();

void
access_log_forwarded(self, ...)
    nw_xs_acceptor *self
  CODE:
    /* --access-log-client forwarded: the client field from the last
     * X-Forwarded-For address when a trusted proxy sent it (unix-socket
     * peers, and the --forwarded-from addresses given here). */
    nw_xs_report *rep = &self->report;
    int n = items - 1;
    rep->access_forwarded = 1;
    free(rep->forwarded_from);
    rep->forwarded_from = n ? calloc((size_t)n, sizeof *rep->forwarded_from) : NULL;
    rep->forwarded_from_n = 0;
    for (int i = 1; i < items && rep->forwarded_from; i++) {
        if (nw_proxy_cidr_parse(SvPV_nolen(ST(i)), &rep->forwarded_from[rep->forwarded_from_n]) < 0)
            croak("--forwarded-from: not an address or CIDR: '%s'\n", SvPV_nolen(ST(i)));
        rep->forwarded_from_n++;
    }

int
access_log_reopen(self)
    nw_xs_acceptor *self
  CODE:
    RETVAL = !self->report.access_log || nw_access_log_reopen(self->report.access_log) == 0;
  OUTPUT:
    RETVAL

void
access_log_tick(self)
    nw_xs_acceptor *self
  CODE:
    if (self->report.access_log)
        nw_access_log_tick(self->report.access_log, nw_now_ms());

void
access_log_close(self)
    nw_xs_acceptor *self
  CODE:
    nw_access_log_close(self->report.access_log);
    self->report.access_log = NULL;

double
access_log_lost(self)
    nw_xs_acceptor *self
  CODE:
    RETVAL = self->report.access_log ? (double)nw_access_log_lost(self->report.access_log) : 0;
  OUTPUT:
    RETVAL

MODULE = Narwhal    PACKAGE = Narwhal::Channel

SV *
recv_stats(control)
    int control
  CODE:
    nw_frame f;
    nw_manager_stats st;
    int fd, got = 0;
    while (nw_frame_recv(control, &f, &st, sizeof st, &fd) == 1) {
        if (fd >= 0)
            close(fd);
        if (f.type == NW_FRAME_STATS && f.data_len == sizeof st)
            got = 1;
    }
    RETVAL = &PL_sv_undef;
    if (got) {
        HV *hv = newHV();
        (void)hv_stores(hv, "idle", newSVuv(st.idle));
        (void)hv_stores(hv, "queued", newSVuv(st.queued));
        (void)hv_stores(hv, "handed_off", newSVuv(st.handed_off));
        (void)hv_stores(hv, "received", newSVuv(st.received));
        (void)hv_stores(hv, "closed_timeout", newSVuv(st.closed_timeout));
        (void)hv_stores(hv, "closed_full", newSVuv(st.closed_full));
        (void)hv_stores(hv, "closed_peer", newSVuv(st.closed_peer));
        (void)hv_stores(hv, "serve_queue_full", newSVuv(st.serve_queue_full));
        (void)hv_stores(hv, "shed", newSVuv(st.shed));
        (void)hv_stores(hv, "writing", newSVuv(st.writing));
        (void)hv_stores(hv, "offloaded", newSVuv(st.offloaded));
        (void)hv_stores(hv, "accepted", newSVuv(st.accepted));
        RETVAL = newRV_noinc((SV *)hv);
    }
  OUTPUT:
    RETVAL

MODULE = Narwhal    PACKAGE = Narwhal::Listener

int
refuse_new_connections(fd)
    int fd
  CODE:
    RETVAL = nw_io_refuse_new_connections(fd);   /* 0, 1 (the queue shortened), -1 */
  OUTPUT:
    RETVAL

int
accept_queue(fd)
    int fd
  CODE:
    RETVAL = nw_io_accept_queue(fd);
  OUTPUT:
    RETVAL

int
stamp_arrivals(fd)
    int fd
  CODE:
    RETVAL = nw_io_stamp_arrivals(fd);
  OUTPUT:
    RETVAL

MODULE = Narwhal    PACKAGE = Narwhal::Master

int
wake_on_signals(fd, ...)
    int fd
  CODE:
    /* Each signal given also writes a byte to fd (the manage loop's wake
     * pipe), in front of the handler Perl has for it (src/worker/nw_signal.h). */
    RETVAL = 1;
    for (int i = 1; i < items; i++)
        if (nw_signal_wake((int)SvIV(ST(i)), fd) < 0)
            RETVAL = 0;
  OUTPUT:
    RETVAL

int
signal_sender(sig)
    int sig
  CODE:
    /* The pid of the process that sent the last sig (0: the kernel, or
     * none yet), as the handler wake_on_signals put in front saw it. */
    RETVAL = (int)nw_signal_sender(sig);
  OUTPUT:
    RETVAL

int
cpu_count(quota = 0)
    double quota
  CODE:
    /* The CPUs the master may run on, within a CPU quota (cpu_quota):
     * --accepting-workers' default. */
    RETVAL = nw_sched_cpus_within(quota);
  OUTPUT:
    RETVAL

void
cpu_quota()
  PREINIT:
    double cpus = 0;
    char bad[4200] = "";
  PPCODE:
    /* (the cgroup's CPU quota or undef, and the file that could not be
     * parsed or undef) */
    int r = nw_sched_cpu_quota("/sys/fs/cgroup", "/proc/self/cgroup", &cpus, bad, sizeof bad);
    EXTEND(SP, 2);
    PUSHs(r > 0 ? sv_2mortal(newSVnv(cpus)) : &PL_sv_undef);
    PUSHs(r < 0 ? sv_2mortal(newSVpv(bad, 0)) : &PL_sv_undef);

MODULE = Narwhal    PACKAGE = Narwhal::Log

void
flush_limited()
  CODE:
    /* The counts of rate-limited lines not written yet (a worker's spool
     * failures, say), written now: the process is about to exit. */
    nw_log_limited_flush_all(nw_now_ms(), 1);

void
set_role(role)
    const char *role
  CODE:
    /* kept for the life of the process: nw_log_set_role keeps the pointer */
    nw_log_set_role(savepv(role));

SV *
format(level, text)
    const char *level
    SV *text
  CODE:
    /* Narwhal's own lines, from Perl: the C formatter (src/shared/nw_log.c) */
    STRLEN len, lines = 1;
    const char *p = SvPVbyte(text, len);
    for (STRLEN i = 0; i < len; i++)
        lines += p[i] == '\n';
    STRLEN cap = len + lines * (NW_LOG_PREFIX_MAX + 1) + 1;
    RETVAL = newSV(cap);
    SvPOK_only(RETVAL);
    SvCUR_set(RETVAL, nw_log_format(SvPVX(RETVAL), cap, level, p, len));
    *SvEND(RETVAL) = 0;
  OUTPUT:
    RETVAL

MODULE = Narwhal    PACKAGE = Narwhal

BOOT:
    nw_env_boot(aTHX);
    nw_config_export_limits(aTHX);
    nw_serve_boot(aTHX);
    acceptor_stash = gv_stashpvs("Narwhal::Acceptor", GV_ADD);
    {
        /* Why a worker leaves (Narwhal::Scoreboard->leaving) and why the
         * master started another (->count_restart). */
        HV *sb = gv_stashpvs("Narwhal::Scoreboard", GV_ADD);
        export_constant(aTHX_ sb, "EXIT_MAX_REQUESTS", NW_EXIT_MAX_REQUESTS);
        export_constant(aTHX_ sb, "EXIT_MEMORY", NW_EXIT_MEMORY);
        export_constant(aTHX_ sb, "EXIT_WATCHDOG", NW_EXIT_WATCHDOG);
        export_constant(aTHX_ sb, "EXIT_RETIRED", NW_EXIT_RETIRED);
        export_constant(aTHX_ sb, "EXIT_STOPPED", NW_EXIT_STOPPED);
        export_constant(aTHX_ sb, "RESTART_MAX_REQUESTS", NW_RESTART_MAX_REQUESTS);
        export_constant(aTHX_ sb, "RESTART_CRASH", NW_RESTART_CRASH);
        export_constant(aTHX_ sb, "RESTART_WATCHDOG", NW_RESTART_WATCHDOG);
        export_constant(aTHX_ sb, "RESTART_MEMORY", NW_RESTART_MEMORY);
        export_constant(aTHX_ sb, "RESTART_SIGNAL", NW_RESTART_SIGNAL);
        export_constant(aTHX_ sb, "RESTART_LIFETIME", NW_RESTART_LIFETIME);
        export_constant(aTHX_ sb, "RESTART_EXIT", NW_RESTART_EXIT);
        export_constant(aTHX_ sb, "WORKER_EXIT_WATCHDOG", NW_WORKER_EXIT_WATCHDOG);
    }
    /* What serve answers, and how release_parked lets parked connections go. */
    export_constant(aTHX_ acceptor_stash, "RETIRE", NW_RELEASE_RETIRE);
    export_constant(aTHX_ acceptor_stash, "STOP", NW_RELEASE_STOP);
    export_constant(aTHX_ acceptor_stash, "SERVE_IDLE", NW_SERVE_IDLE);
    export_constant(aTHX_ acceptor_stash, "SERVE_LEAVING", NW_SERVE_LEAVING);
