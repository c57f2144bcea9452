/* The connection manager's event loop. See nw_manager.h for the contract,
 * docs/DESIGN.md and docs/PROTOCOL.md for why it exists and what it says.
 *
 * The manager is made of parts, each owning its state in its own struct
 * and file; this file holds them, opens and closes them, and sends each
 * epoll event to the part whose descriptor it is:
 *   nw_mgr_clock     the time of a wake (or a test's clock)
 *   nw_mgr_table     every fd's record, and the deadline lists
 *   nw_mgr_heads     idle connections and the heads arriving on them
 *   nw_mgr_handover  the serve queue to the workers: retries, refusals
 *   nw_mgr_shed      --max-queue-wait
 *   nw_mgr_offload   responses written for the workers, half-closes
 *   nw_mgr_custody   copies of the workers' parked connections
 *   nw_mgr_channels  the master's control socket and the handoff queue
 *   nw_mgr_accept    the listeners, taken from while the pool is stuck
 *   nw_mgr_tls       the TLS listeners and connections (relayed), in a set
 *                    of their own
 *
 * Choices worth knowing:
 *  - epoll is level-triggered everywhere. A client connection gets one read
 *    (at most NW_READ_CHUNK bytes) per wake-up and a channel at most
 *    NW_MANAGER_FRAMES_PER_WAKE frames, and level triggering brings us back
 *    for the rest; so one fast client or one chatty worker cannot starve the
 *    others, and nothing is lost if we stop early.
 *  - Events are acted on by trying the operation (recv with MSG_DONTWAIT),
 *    never by trusting the event flags alone, so a stale event for an fd
 *    number reused within one epoll_wait batch costs one EAGAIN.
 *  - Signals come through a signalfd, so there is no handler and no race
 *    with epoll_wait. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "nw_manager.h"
#include "nw_mgr_accept.h"
#include "nw_mgr_channels.h"
#include "nw_mgr_clock.h"
#include "nw_mgr_custody.h"
#include "nw_mgr_handover.h"
#include "nw_mgr_heads.h"
#include "nw_mgr_offload.h"
#include "nw_mgr_shed.h"
#include "nw_mgr_table.h"
#include "nw_mgr_tls.h"
#include "nw_log.h"
#include "nw_scoreboard.h"
#include "nw_status_server.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <unistd.h>

#define EVENTS      256     /* epoll events taken per wake */
#define STATS_MS    1000    /* STATS to the master this often, unless told */

typedef struct {
    int     ep, sigfd;
    nw_mgr_clock clock;
    nw_mgr_table table;             /* every fd's record, and the client connections' lists */
    nw_mgr_heads heads;             /* idle connections and heads arriving */
    nw_mgr_handover handover;       /* to the workers through the serve queue */
    nw_mgr_shed shed;               /* --max-queue-wait */
    nw_mgr_offload offload;         /* responses written for the workers */
    nw_mgr_custody custody;         /* copies of the workers' parked connections */
    nw_mgr_channels channels;       /* the master's and the workers' frames */
    nw_mgr_accept accept;           /* the listeners, while the pool is stuck */
    nw_mgr_tls tls;                 /* the TLS listeners and connections */
    nw_status_server status;        /* --status-listen and its clients */
    const nw_scoreboard *board;     /* read-only; NULL when the master gave none */
    nw_score_header *shared;        /* the board's words the manager writes, or NULL */
    char   *frame_data;             /* NW_FRAME_MAX_DATA bytes for incoming frames */
    nw_msec next_stats, stats_ms;
    nw_msec stop_serve_ms;          /* a stop signal: serve this long (NW_STOP_SERVE_MS) */
    nw_msec serve_until;            /* a stop signal came: serve until then, then close (0: none) */
    nw_msec foreign_stop_at;        /* a stop signal not from the master came: unless the master
                                     * has begun a stop by then, the manager's own stop begins
                                     * then (0: none) */
    int     stop;                   /* the master is gone */
    const char *error_log;          /* --error-log (USR1 reopens it), or NULL */
} nw_manager;

/* ------------------------------------------------------------ numbers */

/* The running totals of every part; the gauges are left 0. */
static void gather_counts(const nw_manager *m, nw_manager_stats *st)
{
    memset(st, 0, sizeof *st);
    st->closed_full = nw_mgr_table_closed_full(&m->table);
    nw_mgr_heads_count(&m->heads, st);
    nw_mgr_handover_count(&m->handover, st);
    nw_mgr_shed_count(&m->shed, st);
    nw_mgr_offload_count(&m->offload, st);
    nw_mgr_channels_count(&m->channels, st);
    nw_mgr_accept_count(&m->accept, st);
}

/* The manager's part of a status page (nw_status_numbers_fn). */
static void status_numbers(void *arg, nw_status_manager *sm)
{
    const nw_manager *m = arg;
    nw_manager_stats st;
    gather_counts(m, &st);
    memset(sm, 0, sizeof *sm);
    sm->held_idle = nw_mgr_table_count(&m->table, NW_MGR_IDLE);
    sm->held_reading = nw_mgr_table_count(&m->table, NW_MGR_READING);
    sm->held_queued = nw_mgr_table_count(&m->table, NW_MGR_QUEUED);
    sm->held_writing = nw_mgr_table_count(&m->table, NW_MGR_WRITING);
    sm->held_closing = nw_mgr_table_count(&m->table, NW_MGR_CLOSING);
    if (m->board)
        nw_scoreboard_connections(m->board, &sm->board);
    nw_mgr_handover_refused(&m->handover, sm->refused);
    nw_mgr_custody_numbers(&m->custody, sm);
    sm->offloaded = st.offloaded;
    sm->offload_bytes = m->shared ? m->shared->offload_bytes : 0;
    sm->handoffs_in = st.received;
    sm->handoffs_out = st.handed_off;
    sm->shed = st.shed;
    sm->accepted = st.accepted;
    sm->stopping = m->serve_until != 0;
    nw_mgr_accept_numbers(&m->accept, sm);
    nw_mgr_tls_numbers(&m->tls, sm);
}

/* Counts to the master once a second (stats_ms). */
static void send_stats(nw_manager *m)
{
    nw_msec now = nw_mgr_now(&m->clock);
    if (now < m->next_stats)
        return;
    nw_mgr_handover_flush_said(&m->handover);
    /* (while it takes new connections, the master's elastic pool wants to
     * know soon: accepted is its sign that clients wait) */
    m->next_stats = now + (nw_mgr_accept_taking(&m->accept) && m->stats_ms > NW_POOL_LOOK_IDLE_MS
                           ? NW_POOL_LOOK_IDLE_MS : m->stats_ms);
    nw_manager_stats st;
    gather_counts(m, &st);
    st.idle = nw_mgr_table_held(&m->table);
    st.queued = nw_mgr_table_count(&m->table, NW_MGR_QUEUED);
    st.writing = nw_mgr_table_count(&m->table, NW_MGR_WRITING);
    nw_mgr_channels_send_stats(&m->channels, &st);
}

/* ------------------------------------------------------------ time */

/* The pool is looked at, and when the manager has just begun taking new
 * connections, the master hears of it soon (send_stats). */
static void look_at_pool(nw_manager *m)
{
    nw_msec soon = nw_mgr_now(&m->clock) + NW_POOL_LOOK_IDLE_MS;
    if (nw_mgr_accept_look(&m->accept, m->serve_until != 0) && m->next_stats > soon)
        m->next_stats = soon;
}

/* epoll_wait timeout: until the earliest deadline or the next stats. */
static int next_timeout(const nw_manager *m)
{
    nw_msec next = m->next_stats;
    next = nw_mgr_heads_next(&m->heads, next);
    next = nw_mgr_offload_next(&m->offload, next);
    next = nw_mgr_shed_next(&m->shed, next);
    next = nw_mgr_handover_next(&m->handover, next);
    next = nw_mgr_accept_next(&m->accept, next);
    next = nw_mgr_tls_next(&m->tls, next);
    if (m->status.active && nw_mgr_now(&m->clock) + 1000 < next)
        next = nw_mgr_now(&m->clock) + 1000;
    if (nw_mgr_clock_stands(&m->clock))
        return -1;      /* its time passes only with an advance, an event */
    nw_msec left = next - nw_now_ms();
    return left <= 0 ? 0 : (int)left;
}

/* A stop signal does not end the loop at once: for NW_STOP_SERVE_MS the
 * manager goes on serving (the workers are stopped after it), so busy
 * keep-alive clients get their next request answered, with Connection:
 * close, instead of a FIN that races it. Then, for up to NW_STOP_WRITE_MS
 * more, it finishes the responses it writes for slow readers and puts the
 * requests still in its queue on the serve queue as the workers make room:
 * clients it took while every worker was stuck are served by the workers'
 * drain, as they would have been from the listen queue. */
static int stopped(const nw_manager *m)
{
    nw_msec now = nw_mgr_now(&m->clock);
    if (m->stop)
        return 1;
    if (!m->serve_until || now < m->serve_until)
        return 0;
    return (nw_mgr_table_count(&m->table, NW_MGR_WRITING) == 0
            && nw_mgr_table_count(&m->table, NW_MGR_QUEUED) == 0)
           || now >= m->serve_until + NW_STOP_WRITE_MS;
}

/* The wait for events, shortened to the end of a stop. */
static int wait_timeout(const nw_manager *m)
{
    nw_msec now = nw_mgr_now(&m->clock);
    int timeout = next_timeout(m);
    nw_msec stop_at = m->serve_until && now >= m->serve_until
                      ? m->serve_until + NW_STOP_WRITE_MS : m->serve_until;
    if (m->foreign_stop_at && (!stop_at || m->foreign_stop_at < stop_at))
        stop_at = m->foreign_stop_at;
    if (stop_at && (timeout < 0 || timeout > stop_at - now))
        timeout = stop_at > now ? (int)(stop_at - now) : 0;
    return timeout;
}

/* ------------------------------------------------------------ events */

/* USR1 (after the master reopened --error-log, created the file and gave
 * it to --user): stderr onto the file at the path, so that the manager
 * does not go on writing to the rotated (or deleted) one. A failure is
 * said on the old stderr, and stderr stays where it was. */
static void reopen_error_log(nw_manager *m)
{
    if (!m->error_log)
        return;
    int fd = open(m->error_log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
        nw_log("error", "cannot reopen the error log %s: %s", m->error_log, strerror(errno));
        return;
    }
    if (fd != 2) {
        if (dup2(fd, 2) < 0)
            nw_log("error", "cannot reopen the error log %s: %s", m->error_log, strerror(errno));
        close(fd);
    }
    nw_log("info", "reopened the error log %s", m->error_log);
}

static void stop_begins(nw_manager *m)
{
    if (!m->serve_until)
        m->serve_until = nw_mgr_now(&m->clock) + m->stop_serve_ms;
    m->foreign_stop_at = 0;
}

/* A stop signal from the master, or from anyone when there is no board to
 * say who the master is. Ctrl-C and systemd signal the whole group: the
 * master then drains (--drain-delay) with the manager serving, and stops
 * it itself; so a stop from another sender waits NW_GROUP_STOP_WAIT_MS for
 * the master to begin its own (the board's stopping word), and is the
 * manager's alone only if it does not (an operator's TERM to the manager). */
static void stop_signal(nw_manager *m, const struct signalfd_siginfo *si)
{
    if (!m->board || (pid_t)si->ssi_pid == m->board->h.master_pid)
        stop_begins(m);
    else if (!m->serve_until && !m->foreign_stop_at)
        m->foreign_stop_at = nw_mgr_now(&m->clock) + NW_GROUP_STOP_WAIT_MS;
}

static void foreign_stop_look(nw_manager *m)
{
    if (!m->foreign_stop_at || nw_mgr_now(&m->clock) < m->foreign_stop_at)
        return;
    if (m->board->h.stopping)
        m->foreign_stop_at = 0;     /* the master's stop: it tells the manager when */
    else
        stop_begins(m);
}

static void signals_came(nw_manager *m)
{
    struct signalfd_siginfo si;
    while (read(m->sigfd, &si, sizeof si) == (ssize_t)sizeof si) {
        if (si.ssi_signo == SIGUSR1)
            reopen_error_log(m);
        else if (si.ssi_signo == SIGHUP)
            nw_mgr_tls_reload(&m->tls);
        else
            stop_signal(m, &si);
    }
}

/* What the worker sent before it ended is in the handoff queue, before
 * anything done now: hand-offs of connections we hold copies of. */
static void worker_ended(nw_manager *m, int pidfd)
{
    for (int i = 0; i < NW_MANAGER_FRAMES_PER_WAKE && nw_mgr_channels_handoffs(&m->channels); i++)
        continue;
    nw_mgr_custody_worker_ended(&m->custody, pidfd);
}

/* An event on a descriptor with a record: its kind says whose it is. */
static void record_event(nw_manager *m, int fd)
{
    int kind = nw_mgr_table_slot(&m->table, fd)->kind;
    if (kind == NW_MGR_IDLE || kind == NW_MGR_READING)
        nw_mgr_heads_readable(&m->heads, fd);
    else if (kind == NW_MGR_WRITING)
        nw_mgr_offload_writable(&m->offload, fd);
    else if (kind == NW_MGR_CLOSING)
        nw_mgr_offload_closing_readable(&m->offload, fd);
    else if (kind == NW_MGR_CUSTODY)
        nw_mgr_custody_hung_up(&m->custody, fd);    /* the worker or the client hung up */
    else if (kind == NW_MGR_WORKER)
        worker_ended(m, fd);
    /* anything else: a stale event for an fd closed in this batch */
}

static void event(nw_manager *m, int fd)
{
    if ((m->status.fd >= 0 || m->status.active)
        && nw_status_server_event(&m->status, fd, nw_mgr_now(&m->clock)))
        return;
    int channel = nw_mgr_channels_which(&m->channels, fd);
    if (channel == NW_MGR_CONTROL) {
        if (nw_mgr_channels_control(&m->channels))
            m->stop = 1;
    } else if (fd == nw_mgr_clock_fd(&m->clock) && fd >= 0) {
        nw_mgr_clock_advance(&m->clock, m->ep);
    } else if (fd == m->sigfd) {
        signals_came(m);
    } else if (channel == NW_MGR_HANDOFFS) {
        nw_mgr_channels_handoffs(&m->channels);
    } else if (nw_mgr_handover_is_queue(&m->handover, fd)) {
        nw_mgr_handover_drain(&m->handover);
    } else if (nw_mgr_accept_event(&m->accept, fd)) {
        return;
    } else if (fd == nw_mgr_tls_fd(&m->tls) && fd >= 0) {
        nw_mgr_tls_run(&m->tls, 0);
    } else if (nw_mgr_table_has(&m->table, fd)) {
        record_event(m, fd);
    }
}

/* ------------------------------------------------------------ opening */

/* One of the manager's own descriptors in epoll, for input. */
static int watch(nw_manager *m, int fd)
{
    struct epoll_event ev = { .events = EPOLLIN, .data.fd = fd };
    return epoll_ctl(m->ep, EPOLL_CTL_ADD, fd, &ev);
}

static nw_msec ms(double seconds)
{
    if (!(seconds > 0))
        return 0;
    if (seconds > 0x7fffffff / 1000.0)
        return 0x7fffffff;
    return (nw_msec)(seconds * 1000.0 + 0.5);
}

/* The scoreboard, read-only, and the words of it the manager writes. */
static void map_board(nw_manager *m, int fd)
{
    if (fd >= 0 && !(m->board = nw_scoreboard_map(fd)))
        nw_log("error", "cannot map the scoreboard: %s", strerror(errno));
    if (m->board && (m->shared = nw_scoreboard_map_shared(fd)))
        /* the rests an earlier manager held went with it (DESIGN.md, "Slow
         * readers"); the frames in the queues did not: their counts stay */
        __atomic_store_n(&m->shared->offload_bytes, 0, __ATOMIC_RELAXED);
}

/* SIGPIPE ignored; TERM, INT, USR1 and HUP blocked, to be read from a
 * signalfd (HUP: the TLS part reads its certificate pair again). */
static void take_signals(sigset_t *set)
{
    struct sigaction ign;
    memset(&ign, 0, sizeof ign);
    ign.sa_handler = SIG_IGN;
    sigaction(SIGPIPE, &ign, NULL);
    sigemptyset(set);
    sigaddset(set, SIGTERM);
    sigaddset(set, SIGINT);
    sigaddset(set, SIGUSR1);
    sigaddset(set, SIGHUP);
    sigprocmask(SIG_BLOCK, set, NULL);
}

/* The heads part asks, of an idle connection at its deadline, whether a
 * response is still in its socket; the offload part then holds it. */
static int still_sending(void *offload, int fd)
{
    return nw_mgr_offload_wait_sent(offload, fd);
}

static void init_heads(nw_manager *m, const nw_manager_config *cfg)
{
    nw_mgr_head_limits lim = {
        .keepalive_ms = ms(cfg->keepalive_timeout),
        .read_ms = ms(cfg->read_timeout),
        .read_timeout = cfg->read_timeout,
        .read_timeout_max = cfg->read_timeout_max,
        .min_head_rate = cfg->min_head_rate,
        .max_header = cfg->max_header_bytes,
        .max_line = cfg->max_request_line,
    };
    nw_mgr_heads_unsent unsent = { still_sending, &m->offload };
    nw_mgr_heads_init(&m->heads, &m->table, &m->clock, &m->handover, unsent, &lim);
}

/* Every part, wired to the parts it calls. */
static void init_parts(nw_manager *m, const nw_manager_config *cfg, int control,
                       int handoff_queue, int serve_queue)
{
    volatile int64_t *offload_bytes = m->shared ? &m->shared->offload_bytes : NULL;
    volatile int64_t *serve_queued = m->shared ? &m->shared->serve_queued : NULL;
    volatile int64_t *handoff_queued = m->shared ? &m->shared->handoff_queued : NULL;
    nw_mgr_table_init(&m->table, m->ep, cfg->max_connections, offload_bytes);
    nw_mgr_handover_init(&m->handover, &m->table, &m->clock, m->ep, serve_queue, serve_queued);
    nw_mgr_shed_init(&m->shed, &m->table, &m->clock, &m->handover, cfg->serve_reader_fd,
                     ms(cfg->max_queue_wait), m->frame_data, serve_queued, m->board);
    init_heads(m, cfg);
    nw_mgr_offload_init(&m->offload, &m->table, &m->clock, &m->handover, &m->heads,
                        ms(cfg->timeout ? cfg->timeout : NW_DEFAULT_TIMEOUT), offload_bytes);
    nw_mgr_custody_init(&m->custody, &m->table, &m->clock, &m->heads, m->board);
    nw_mgr_channels_init(&m->channels, &m->heads, &m->offload, &m->custody, control,
                         handoff_queue, m->frame_data, handoff_queued);
    nw_mgr_accept_init(&m->accept, &m->table, &m->clock, &m->heads, m->board, m->ep,
                       cfg->listener_fds, cfg->nlisteners, cfg->proxy_protocol);
}

/* The TLS part: its listeners are the app's listeners of the indices
 * cfg->tls_listeners names, which the accept part leaves to it. */
static int init_tls(nw_manager *m, const nw_manager_config *cfg)
{
    int fds[NW_MAX_LISTENERS];
    uint64_t mask = 0;
    char err[512];
    for (int i = 0; i < cfg->ntls; i++) {
        fds[i] = cfg->listener_fds[cfg->tls_listeners[i]];
        mask |= (uint64_t)1 << cfg->tls_listeners[i];
    }
    nw_mgr_accept_leave(&m->accept, mask);
    if (nw_mgr_tls_init(&m->tls, &m->heads, &m->table, &m->clock, cfg->tls_cert, cfg->tls_key, fds,
                        cfg->tls_listeners, cfg->ntls, cfg->read_timeout, cfg->tls_threads,
                        err, sizeof err) == 0) {
        if (cfg->proxy_protocol)
            nw_mgr_tls_proxy(&m->tls, cfg->proxy_from, (size_t)cfg->nproxy_from);
        return 0;
    }
    nw_log("error", "TLS: %s", err);
    return -1;
}

static int open_manager(nw_manager *m, const nw_manager_config *cfg, int control,
                        int handoff_queue, int serve_queue)
{
    sigset_t set;
    memset(m, 0, sizeof *m);
    m->ep = m->sigfd = -1;
    m->tls.ep = -1;     /* (off until init_tls) */
    nw_mgr_clock_init(&m->clock, cfg->test_clock_fd);
    m->stats_ms = cfg->stats_ms > 0 ? cfg->stats_ms : STATS_MS;
    m->next_stats = nw_mgr_now(&m->clock) + m->stats_ms;
    m->stop_serve_ms = cfg->stop_serve_ms > 0 ? cfg->stop_serve_ms : NW_STOP_SERVE_MS;
    nw_status_server_init(&m->status, cfg->status_fd);
    m->error_log = cfg->error_log;
    map_board(m, cfg->scoreboard_fd);
    take_signals(&set);
    m->frame_data = malloc(NW_FRAME_MAX_DATA);
    m->ep = epoll_create1(EPOLL_CLOEXEC);
    /* (before any return: closing needs every part) */
    init_parts(m, cfg, control, handoff_queue, serve_queue);
    if (!m->frame_data || m->ep < 0)
        return -1;
    if (init_tls(m, cfg) < 0)
        return -2;
    if (nw_mgr_tls_fd(&m->tls) >= 0 && watch(m, nw_mgr_tls_fd(&m->tls)) < 0)
        return -1;
    if ((m->sigfd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC)) < 0)
        return -1;
    if (watch(m, m->sigfd) < 0 || watch(m, control) < 0 || watch(m, handoff_queue) < 0
        || (nw_mgr_clock_fd(&m->clock) >= 0 && watch(m, nw_mgr_clock_fd(&m->clock)) < 0))
        return -1;
    return nw_status_server_start(&m->status, m->ep, m->board, status_numbers, m);
}

/* ------------------------------------------------------------ closing */

/* On stop, held connections get a FIN (shutdown SHUT_WR) rather than a bare
 * close: a request that crosses it then meets end-of-stream, which clients
 * retry, instead of a reset, which they do not. What they send meanwhile is
 * read and dropped until they close or the linger time is up
 * (NW_MANAGER_LINGER_MS, which a written response without keep-alive gets
 * too). */

static int is_client(const nw_mgr_slot *s)
{
    return s->kind == NW_MGR_IDLE || s->kind == NW_MGR_READING
           || s->kind == NW_MGR_QUEUED || s->kind == NW_MGR_WRITING
           || s->kind == NW_MGR_CLOSING;
}

/* Read and drop what the polled connections send until each closes or
 * the time is up; a closed one is forgotten. p[n] is the TLS part's set
 * (or -1): its relays carry the FINs to their clients meanwhile. */
static void drain_until(nw_manager *m, struct pollfd *p, size_t n, nw_msec deadline)
{
    size_t open_left = n;
    p[n].fd = nw_mgr_tls_fd(&m->tls);
    p[n].events = POLLIN;
    while (open_left > 0) {
        nw_msec left = deadline - nw_now_ms();
        if (left <= 0 || poll(p, n + 1, (int)left) <= 0)
            break;
        if (p[n].revents)
            nw_mgr_tls_run(&m->tls, 0);
        for (size_t i = 0; i < n; i++) {
            char sink[4096];
            if (p[i].fd < 0 || !p[i].revents)
                continue;
            if (read(p[i].fd, sink, sizeof sink) > 0)
                continue;
            nw_mgr_table_forget(&m->table, p[i].fd);
            p[i].fd = -1;
            open_left--;
        }
    }
}

static void linger(nw_manager *m)
{
    size_t n = 0, size = nw_mgr_table_size(&m->table);
    struct pollfd *p = calloc(size + 1, sizeof *p);
    if (!p)
        return;
    for (size_t fd = 0; fd < size; fd++) {
        if (!is_client(nw_mgr_table_slot(&m->table, (int)fd)))
            continue;
        shutdown((int)fd, SHUT_WR);
        p[n].fd = (int)fd;
        p[n++].events = POLLIN;
    }
    /* (real time, a test clock or not: the manager's last wait, bounded) */
    drain_until(m, p, n, nw_now_ms() + NW_MANAGER_LINGER_MS);
    free(p);
}

/* The server stops: before the held connections get their FIN, serve what
 * has arrived on them, so that a request sent just before the stop is
 * answered (by a worker, which is still taking from the serve queue: the
 * master stops the workers after the manager) rather than met by
 * end-of-stream. Hand-offs still in the queue are taken first. One pass,
 * no waiting: a head still incomplete gets the FIN with the rest. */
static void serve_arrived(nw_manager *m)
{
    nw_mgr_channels_handoffs(&m->channels);
    for (size_t fd = 0; fd < nw_mgr_table_size(&m->table); fd++) {
        int kind = nw_mgr_table_slot(&m->table, (int)fd)->kind;
        if (kind == NW_MGR_IDLE || kind == NW_MGR_READING)
            nw_mgr_heads_readable(&m->heads, (int)fd);
    }
    nw_mgr_handover_drain(&m->handover);
}

/* The server stops: the TLS connections the workers still answer are
 * relayed until they end (the worker closes its end, the client reads
 * the close_notify and closes) or NW_TLS_FINISH_MS is over; the master
 * stops the workers meanwhile, which end theirs. */
static void finish_tls(nw_manager *m)
{
    nw_msec deadline = nw_now_ms() + NW_TLS_FINISH_MS;
    while (nw_mgr_tls_open(&m->tls) > 0 && nw_now_ms() < deadline) {
        nw_mgr_tls_run(&m->tls, 100);
        nw_mgr_clock_tick(&m->clock);
        nw_mgr_tls_expire(&m->tls);
    }
}

/* Close everything: held connections, worker channels, our own fds. */
static void close_manager(nw_manager *m)
{
    nw_mgr_tls_close(&m->tls);
    nw_mgr_table_close(&m->table);
    nw_mgr_custody_close(&m->custody);
    nw_mgr_accept_close(&m->accept);
    nw_mgr_shed_close(&m->shed);
    nw_status_server_close(&m->status);
    nw_scoreboard_unmap(m->board);
    nw_scoreboard_unmap_shared(m->shared);
    free(m->frame_data);
    if (m->ep >= 0)
        close(m->ep);
    if (m->sigfd >= 0)
        close(m->sigfd);
    nw_mgr_channels_close(&m->channels);
    nw_mgr_handover_close(&m->handover);
}

/* ------------------------------------------------------------ the loop */

/* What is due once a wake's events are taken. */
static void after_events(nw_manager *m)
{
    nw_mgr_clock_step(&m->clock);
    foreign_stop_look(m);
    nw_mgr_heads_expire(&m->heads);
    nw_mgr_tls_expire(&m->tls);
    nw_mgr_offload_expire(&m->offload);
    nw_mgr_handover_retry(&m->handover);
    nw_mgr_shed_look(&m->shed);
    look_at_pool(m);
    nw_status_server_expire(&m->status, nw_mgr_now(&m->clock));
    send_stats(m);
    nw_mgr_clock_answer(&m->clock);
    nw_log_limited_flush_all(nw_mgr_now(&m->clock), 0);
}

int nw_manager_run(const nw_manager_config *cfg, int control_fd, int handoff_queue_fd,
                   int serve_queue_fd)
{
    nw_manager m;
    struct epoll_event ev[EVENTS];
    int rc = 0, opened = open_manager(&m, cfg, control_fd, handoff_queue_fd, serve_queue_fd);
    if (opened < 0) {
        if (opened == -1)
            nw_log("error", "cannot start: %s", strerror(errno));
        close_manager(&m);
        return 1;
    }
    while (!stopped(&m)) {
        int n = epoll_wait(m.ep, ev, EVENTS, wait_timeout(&m));
        if (n < 0 && errno != EINTR) {
            nw_log("error", "epoll_wait: %s", strerror(errno));
            rc = 1;
            break;
        }
        nw_mgr_clock_tick(&m.clock);
        for (int i = 0; i < n && !m.stop; i++)
            event(&m, ev[i].data.fd);
        after_events(&m);
    }
    nw_mgr_tls_stop_accepting(&m.tls);
    if (m.serve_until) {
        serve_arrived(&m);
        linger(&m);
        finish_tls(&m);
    } else if (m.stop) {
        linger(&m);     /* the master is gone: nobody to serve them */
    }
    nw_log_limited_flush_all(nw_mgr_now(&m.clock), 1);    /* (a stop does not lose the counts) */
    close_manager(&m);
    return rc;
}
