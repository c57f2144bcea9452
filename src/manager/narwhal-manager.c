/* narwhal-manager: the connection manager as its own executable. The
 * master fork+execs it before loading the app, with three SOCK_SEQPACKET
 * sockets (their numbers are in nw_frame.h): control, the handoff queue
 * (HANDOFF frames in) and the serve queue (SERVE frames out). See
 * docs/DESIGN.md and docs/PROTOCOL.md.
 *
 *   narwhal-manager [--keepalive-timeout SECS] [--read-timeout SECS]
 *                   [--max-connections N] [--max-header-bytes N]
 *                   [--max-request-line N] [--max-queue-wait MS] [--timeout SECS]
 *                   [--proxy-protocol 0|1] [--proxy-from CIDR ...]
 *                   [--tls-cert FILE --tls-key FILE]
 *                   [--error-log FILE]
 *                   [--scoreboard-fd FD] [--serve-reader-fd FD]
 *                   [--status-fd FD] [--listener-fds FD,FD...]
 *                   [--tls-listeners I,I...] [--tls-threads N]
 *   narwhal-manager --tls-check --tls-cert FILE --tls-key FILE
 *
 * --tls-listeners: which of --listener-fds (by index) are TLS listeners.
 * --tls-threads: the threads that run their handshakes (the master: one
 * per CPU it counts; 1 by default).
 * --tls-check: load the certificate pair as the server would, and print
 * what the kernel offers for TLS in one line (nw_ktls_offered) and exit
 * 0, or print why not in one line and exit 1 (the master runs it at
 * start, before it listens: the workers never link OpenSSL).
 *
 * Defaults come from src/shared/nw_limits.h; --max-connections defaults to what
 * the fd limit allows (after raising the soft limit to the hard one). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "nw_frame.h"
#include "nw_manager.h"
#include "nw_limits.h"
#include "nw_log.h"
#include "nw_ktls.h"
#include "nw_tls.h"

#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>


/* Every option the manager takes; --help lists them from here, and
 * t/31-options.t checks them against the master's option table. */
static const struct option manager_opts[] = {
    { "keepalive-timeout", required_argument, NULL, 'k' },
    { "read-timeout",      required_argument, NULL, 'r' },
    { "max-connections",   required_argument, NULL, 'c' },
    { "max-header-bytes",  required_argument, NULL, 'b' },
    { "max-request-line",  required_argument, NULL, 'l' },
    { "read-timeout-max",  required_argument, NULL, 'R' },
    { "min-head-rate",     required_argument, NULL, 'm' },
    { "max-queue-wait",    required_argument, NULL, 'q' },
    { "timeout",           required_argument, NULL, 't' },
    { "proxy-protocol",    required_argument, NULL, 'P' },
    { "proxy-from",        required_argument, NULL, 'F' },
    { "error-log",         required_argument, NULL, 'e' },
    { "tls-cert",          required_argument, NULL, 'C' },
    { "tls-key",           required_argument, NULL, 'K' },
    { "help",              no_argument,       NULL, 'h' },
    /* descriptors the master passes (docs/PROTOCOL.md), not options of
     * the option table: usage() lists them apart */
    { "scoreboard-fd",     required_argument, NULL, 'S' },
    { "serve-reader-fd",   required_argument, NULL, 'Q' },
    { "status-fd",         required_argument, NULL, 'T' },
    { "listener-fds",      required_argument, NULL, 'L' },
    { "tls-listeners",     required_argument, NULL, 'I' },
    { "tls-threads",       required_argument, NULL, 'H' },
    { "tls-check",         no_argument,       NULL, 'X' },
    { NULL, 0, NULL, 0 },
};
#define FIRST_DESCRIPTOR_OPT "scoreboard-fd"

static void usage(FILE *out)
{
    fprintf(out, "usage: narwhal-manager [options]\n");
    for (const struct option *o = manager_opts; o->name; o++) {
        if (!strcmp(o->name, FIRST_DESCRIPTOR_OPT))
            fprintf(out, "Descriptors from the master:\n");
        fprintf(out, "  --%s%s\n", o->name, o->has_arg ? " VALUE" : "");
    }
    fprintf(out, "Runs Narwhal's connection manager; fds 3, 4 and 5 must be its sockets\n"
                 "from the master (SOCK_SEQPACKET).\n");
}

static int parse_seconds(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v > 0) || v > NW_MAX_SECONDS)
        return -1;
    *out = v;
    return 0;
}

static int parse_count(const char *s, size_t min, size_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || *s == '-' || v < min || v > (size_t)-1 / 2)
        return -1;
    *out = (size_t)v;
    return 0;
}

/* A connection manager wants every fd it may have; returns the soft limit. */
static size_t raise_fd_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return 1024;
    if (rl.rlim_cur < rl.rlim_max) {
        rlim_t want = rl.rlim_max;
        rl.rlim_cur = want;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
            getrlimit(RLIMIT_NOFILE, &rl);
    }
    return rl.rlim_cur == RLIM_INFINITY ? (size_t)1 << 20 : (size_t)rl.rlim_cur;
}

static size_t default_max_connections(size_t fd_limit)
{
    return fd_limit > 2 * NW_MANAGER_RESERVED_FDS ? fd_limit - NW_MANAGER_RESERVED_FDS : fd_limit / 2;
}

static int control_fd_ok(int fd)
{
    int type = 0;
    socklen_t len = sizeof type;
    return getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) == 0 && type == SOCK_SEQPACKET;
}

static int parse_fd(const char *s, int *out)
{
    size_t v;
    if (parse_count(s, 0, &v) < 0 || v > 1 << 20)
        return -1;
    *out = (int)v;
    return 0;
}

/* "9,10,11": the app's listeners. */
static int parse_fd_list(const char *s, nw_manager_config *cfg)
{
    char copy[256];
    if (strlen(s) >= sizeof copy)
        return -1;
    strcpy(copy, s);
    cfg->nlisteners = 0;
    for (char *save = NULL, *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int max = (int)(sizeof cfg->listener_fds / sizeof cfg->listener_fds[0]);
        if (cfg->nlisteners == max || parse_fd(t, &cfg->listener_fds[cfg->nlisteners]) < 0)
            return -1;
        cfg->nlisteners++;
    }
    return 0;
}

/* "0,2": which listeners are TLS listeners. */
static int parse_tls_list(const char *s, nw_manager_config *cfg)
{
    char copy[256];
    if (strlen(s) >= sizeof copy)
        return -1;
    strcpy(copy, s);
    cfg->ntls = 0;
    for (char *save = NULL, *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        size_t v;
        if (cfg->ntls == NW_MAX_LISTENERS || parse_count(t, 0, &v) < 0 || v >= NW_MAX_LISTENERS)
            return -1;
        cfg->tls_listeners[cfg->ntls++] = (int)v;
    }
    return 0;
}

/* One more --proxy-from (as many as given: the list grows). */
static int add_proxy_from(nw_manager_config *cfg, const char *s)
{
    nw_proxy_cidr *more = realloc(cfg->proxy_from, (size_t)(cfg->nproxy_from + 1) * sizeof *more);
    if (!more)
        return -1;
    cfg->proxy_from = more;
    return nw_proxy_cidr_parse(s, &cfg->proxy_from[cfg->nproxy_from++]);
}

static int parse_ms(const char *s, double *seconds)
{
    size_t ms;
    if (parse_count(s, 0, &ms) < 0 || ms > (size_t)NW_MAX_SECONDS * 1000)
        return -1;
    *seconds = (double)ms / 1000.0;
    return 0;
}

static int parse_args(int argc, char **argv, nw_manager_config *cfg, int *max_given, int *check)
{
    const struct option *opts = manager_opts;
    int c, idx = 0, bad = 0;
    while (!bad && (c = getopt_long(argc, argv, "", opts, &idx)) != -1) {
        switch (c) {
        case 'k': bad = parse_seconds(optarg, &cfg->keepalive_timeout); break;
        case 'r': bad = parse_seconds(optarg, &cfg->read_timeout); break;
        case 'c': bad = parse_count(optarg, 0, &cfg->max_connections); *max_given = 1; break;
        case 'b': bad = parse_count(optarg, 1, &cfg->max_header_bytes); break;
        case 'l': bad = parse_count(optarg, 1, &cfg->max_request_line); break;
        case 'R': bad = parse_seconds(optarg, &cfg->read_timeout_max); break;
        case 'm': { size_t rate; bad = parse_count(optarg, 0, &rate); cfg->min_head_rate = (double)rate; break; }
        case 'q': bad = parse_ms(optarg, &cfg->max_queue_wait); break;
        case 't': bad = parse_seconds(optarg, &cfg->timeout); break;
        case 'P': { size_t on; bad = parse_count(optarg, 0, &on) || on > 1; cfg->proxy_protocol = (int)on; break; }
        case 'F': bad = add_proxy_from(cfg, optarg); break;
        case 'e': cfg->error_log = optarg; bad = !*optarg; break;
        case 'S': bad = parse_fd(optarg, &cfg->scoreboard_fd); break;
        case 'Q': bad = parse_fd(optarg, &cfg->serve_reader_fd); break;
        case 'T': bad = parse_fd(optarg, &cfg->status_fd); break;
        case 'L': bad = parse_fd_list(optarg, cfg); break;
        case 'C': cfg->tls_cert = optarg; bad = !*optarg; break;
        case 'K': cfg->tls_key = optarg; bad = !*optarg; break;
        case 'I': bad = parse_tls_list(optarg, cfg); break;
        case 'H': { size_t n; bad = parse_count(optarg, 1, &n) || n > NW_TLS_MAX_THREADS; cfg->tls_threads = (int)n; break; }
        case 'X': *check = 1; break;
        case 'h': usage(stdout); exit(0);
        default:  return -1;   /* getopt_long has said why */
        }
        if (bad)
            nw_log("error", "bad value for --%s: '%s'", opts[idx].name, optarg);
    }
    if (!bad && optind < argc) {
        nw_log("error", "unexpected argument '%s'", argv[optind]);
        bad = -1;
    }
    return bad ? -1 : 0;
}

/* TLS listeners need a certificate pair, and each must be one of the
 * listeners passed. */
static int tls_args_ok(const nw_manager_config *cfg)
{
    for (int i = 0; i < cfg->ntls; i++) {
        if (cfg->tls_listeners[i] >= cfg->nlisteners) {
            nw_log("error", "--tls-listeners names listener %d of %d", cfg->tls_listeners[i],
                   cfg->nlisteners);
            return 0;
        }
    }
    if (cfg->ntls && (!cfg->tls_cert || !cfg->tls_key)) {
        nw_log("error", "TLS listeners need --tls-cert and --tls-key");
        return 0;
    }
    return 1;
}

/* --tls-check: the pair loads, or one line says why. */
static int tls_check(const nw_manager_config *cfg)
{
    char err[512];
    if (!cfg->tls_cert || !cfg->tls_key) {
        printf("--tls-check needs --tls-cert and --tls-key\n");
        return 1;
    }
    struct nw_tls_ctx *t = nw_tls_ctx_new(cfg->tls_cert, cfg->tls_key, err, sizeof err);
    if (!t) {
        printf("%s\n", err);
        return 1;
    }
    nw_tls_ctx_free(t);
    nw_ktls_offered(err, sizeof err);
    printf("%s\n", err);     /* (the master's start line says it) */
    return 0;
}

int main(int argc, char **argv)
{
    nw_manager_config cfg = {
        .keepalive_timeout = NW_DEFAULT_KEEPALIVE_TIMEOUT,
        .read_timeout = NW_DEFAULT_READ_TIMEOUT,
        .read_timeout_max = NW_DEFAULT_READ_TIMEOUT_MAX,
        .min_head_rate = NW_DEFAULT_MIN_HEAD_RATE,
        .max_connections = 0,
        .tls_threads = 1,
        .max_header_bytes = NW_DEFAULT_MAX_HEADER_BYTES,
        .max_request_line = NW_DEFAULT_MAX_REQUEST_LINE,
        .max_queue_wait = 0,
        .timeout = NW_DEFAULT_TIMEOUT,
        .scoreboard_fd = -1,
        .serve_reader_fd = -1,
        .status_fd = -1,
    };
    int max_given = 0, check = 0;
    nw_log_set_role("manager");
    if (parse_args(argc, argv, &cfg, &max_given, &check) < 0) {
        usage(stderr);
        return 2;
    }
    if (check)
        return tls_check(&cfg);
    if (!tls_args_ok(&cfg))
        return 2;
    if (!control_fd_ok(NW_MANAGER_CONTROL_FD) || !control_fd_ok(NW_MANAGER_HANDOFF_QUEUE_FD)
        || !control_fd_ok(NW_MANAGER_SERVE_QUEUE_FD)) {
        nw_log("error", "fds %d, %d and %d must be the master's sockets "
                "(SOCK_SEQPACKET); it is started by narwhal, not by hand",
                NW_MANAGER_CONTROL_FD, NW_MANAGER_HANDOFF_QUEUE_FD, NW_MANAGER_SERVE_QUEUE_FD);
        return 2;
    }
    /* For tests only (not options): counts to the master more often
     * than once a second, and a shorter serve on a stop (a stop's
     * NW_STOP_SERVE_MS), so that a test waiting for them waits less. */
    const char *stats_ms = getenv("NARWHAL_TEST_MANAGER_STATS_MS");
    if (stats_ms && atoi(stats_ms) > 0)
        cfg.stats_ms = atoi(stats_ms);
    const char *stop_serve_ms = getenv("NARWHAL_TEST_STOP_SERVE_MS");
    if (stop_serve_ms && atoi(stop_serve_ms) > 0)
        cfg.stop_serve_ms = atoi(stop_serve_ms);
    /* and a clock of the test's (t/c/test_manager.c): its expiry tests
     * advance it instead of waiting the timeouts out in real time */
    const char *test_clock = getenv("NARWHAL_TEST_MANAGER_CLOCK_FD");
    if (test_clock && atoi(test_clock) > 2)
        cfg.test_clock_fd = atoi(test_clock);
    size_t fd_limit = raise_fd_limit();
    if (!max_given)
        cfg.max_connections = default_max_connections(fd_limit);
    /* USR1 reopens --error-log, HUP reads the TLS certificate pair again
     * (a HUP sent to the whole process group, meant for the master, must
     * not kill the manager and its connections): both blocked here
     * (nw_manager_run reads them through its signalfd), and no longer
     * ignored (an ignored signal never reaches a signalfd; the master
     * ignores them until the exec). */
    sigset_t usr1;
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    sigaddset(&usr1, SIGHUP);
    sigprocmask(SIG_BLOCK, &usr1, NULL);
    signal(SIGUSR1, SIG_DFL);
    signal(SIGHUP, SIG_DFL);
    return nw_manager_run(&cfg, NW_MANAGER_CONTROL_FD, NW_MANAGER_HANDOFF_QUEUE_FD,
                          NW_MANAGER_SERVE_QUEUE_FD);
}
