/* The connection manager: an epoll loop that holds idle keep-alive
 * connections and connections whose request head is still arriving, and
 * puts each one on the shared serve queue once its head is complete.
 * See docs/DESIGN.md ("The connection manager") and docs/PROTOCOL.md.
 * Linux only. The executable around it is src/manager/narwhal-manager.c. */
#ifndef NW_MANAGER_H
#define NW_MANAGER_H

#include <stddef.h>
#include "nw_limits.h"
#include "nw_proxy.h"

typedef struct {
    double keepalive_timeout;   /* seconds an idle connection is kept */
    double read_timeout;        /* seconds for a whole head, from its first byte */
    double read_timeout_max;    /* ...moved on while it arrives fast enough, up to this */
    double min_head_rate;       /* bytes a second that move it on (0: never) */
    size_t max_connections;     /* connections held at once; 0: no limit */
    size_t max_header_bytes;    /* a buffered head longer than this goes to a worker (431) */
    size_t max_request_line;    /* a first line longer than this, no LF yet: to a worker (414) */
    double max_queue_wait;      /* seconds a complete request may wait for a worker, then 503 (0: no limit) */
    double timeout;             /* seconds a response's write may make no progress (output offload) */
    int proxy_protocol;         /* --proxy-protocol: connections it accepts begin with a PROXY header */
    nw_proxy_cidr *proxy_from;  /* --proxy-from: who may send one (the TLS listeners'; the
                                 * workers check the rest), nproxy_from of them */
    int nproxy_from;
    int scoreboard_fd;          /* the scoreboard's memfd, or -1 */
    int serve_reader_fd;        /* the workers' end of the serve queue (for shedding), or -1 */
    int status_fd;              /* the --status-listen listener, or -1 */
    int listener_fds[NW_MAX_LISTENERS];       /* the app's listeners (queue lengths; taken from while the
                                 * pool is stuck) */
    int nlisteners;
    int tls_listeners[NW_MAX_LISTENERS];      /* indices of listener_fds that are TLS
                                 * listeners (the TLS part's, nw_mgr_tls.h) */
    int ntls;
    int tls_threads;            /* threads for their handshakes (--tls-threads) */
    const char *tls_cert, *tls_key;     /* --tls-cert, --tls-key: their certificate pair */
    const char *error_log;      /* --error-log: reopened onto fd 2 on SIGUSR1, or NULL */
    int stats_ms;               /* STATS to the master this often; 0: once a second (tests
                                 * set less with NARWHAL_TEST_MANAGER_STATS_MS) */
    int stop_serve_ms;          /* a stop signal: serve this long; 0: NW_STOP_SERVE_MS (tests
                                 * set less with NARWHAL_TEST_STOP_SERVE_MS) */
    int test_clock_fd;          /* tests only (NARWHAL_TEST_MANAGER_CLOCK_FD): a SOCK_SEQPACKET
                                 * socket whose messages advance the manager's clock, which
                                 * otherwise stands still (see nw_manager_test_clock); 0: the
                                 * real, monotonic clock */
} nw_manager_config;

/* Run the manager until the master closes control_fd (end of stream) or
 * SIGTERM/SIGINT arrives, then close every connection it holds and its
 * sockets, and return 0. HANDOFF frames are read from handoff_queue_fd (the handoff queue),
 * SERVE frames written to serve_queue_fd (the serve queue). Returns 1 (with a message on stderr)
 * when it cannot start: no epoll, no signalfd, no memory.
 *
 * SIGUSR1 (the master's, after log rotation) reopens cfg->error_log onto
 * fd 2.
 *
 * It blocks SIGTERM, SIGINT and SIGUSR1 (they are read through a signalfd) and
 * ignores SIGPIPE, and leaves both so on return: a second TERM arriving
 * while the process exits must not turn a clean exit into a killed one. */
int nw_manager_run(const nw_manager_config *cfg, int control_fd, int handoff_queue_fd,
                   int serve_queue_fd);

#endif
