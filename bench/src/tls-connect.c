/* tls-connect: new HTTPS connections per second, one request each.
 *
 * Keeps N connections in flight for D seconds. Each one: a TCP connect, a
 * TLS handshake (1.3 by default, --tls12 for 1.2), one request
 *   GET / HTTP/1.1, Host: x, Connection: close
 * read until the server closes, the answer checked to begin with
 * "HTTP/1.1 200", then closed; a new connection takes its place at once.
 * One thread (per process: -t), epoll, non-blocking sockets; the server's certificate is not
 * verified (a throwaway one).
 *
 * --resume offers a session on every connection: the newest one the server
 * gave (a TLS 1.3 ticket, or a 1.2 ticket), kept as a copy from the
 * new-session callback and offered as a copy of its own to each new
 * connection, so handshakes are resumed as soon as the first
 * connection got a ticket. How many actually were is counted
 * (SSL_session_reused) and printed; a --resume run where fewer than 90%
 * of the answered connections beyond the first N (N = -c: those started
 * before any ticket came) resumed says "resume=FAILED".
 *
 * Nothing is retried: every connection that fails counts once, by the
 * step it failed at: connect (refused, reset, no port), handshake, write,
 * read (reset or TLS error before the close), status (the answer did not
 * begin with "HTTP/1.1 200", or was empty), timeout (not closed within
 * --timeout of its connect). A close without close_notify after an answer
 * is not a failure but is counted (unclean).
 *
 * Options:
 *   -p PORT          server port (required)
 *   -h ADDR          server IPv4 address (default 127.0.0.1)
 *   -c N             connections in flight (default 16)
 *   -d SECONDS       how long new connections are started (default 5)
 *   -t PROCS         share the connections among PROCS processes (default
 *                    1): one process keeps one CPU busy with its side of
 *                    the handshakes, which may be less than the server can
 *                    take; each process resumes its own sessions
 *   --tls12          TLS 1.2 instead of 1.3
 *   --resume         resume sessions (see above)
 *   --timeout S      per connection, from connect to close (default 5)
 *   --rtt MS         act as a client MS milliseconds away (see below)
 *
 * --rtt: each flight the client sends after its hello (TLS 1.2's key
 * exchange and Finished, TLS 1.3's Finished with the request) is held back
 * MS milliseconds before it is written, so the server waits one round trip
 * for each of them, as it would for a client that far away. The hello goes
 * at once: the TCP handshake's round trip is the kernel's (a server has
 * accepted nothing before it ends) and is not emulated, so a connection
 * costs the server 1 round trip (TLS 1.3) or 2 (TLS 1.2) less than across a
 * real network of that RTT costs the client. The client writes through a
 * memory BIO for this; without --rtt it writes to the socket directly.
 *
 * Output, one line of key=value: conns_s (connections answered and closed
 * within the D seconds, per second), ok, p50_ms and p99_ms (connect to
 * close, over those), errors and per kind, resumed=R/answered, unclean, the
 * connections still open at the end (finished afterwards, their failures
 * counted, not their time), the client's own CPU use (user + system over
 * wall, all its processes: near -t means the client was the limit).
 *
 *   cc -O2 -Wall -o bench/build/tls-connect bench/src/tls-connect.c -lssl -lcrypto
 *   bench/build/tls-connect -p 8443 -c 16 -d 5 --resume
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const char REQUEST[] = "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
static const char WANT[] = "HTTP/1.1 200";

enum { S_FREE, S_CONNECTING, S_HANDSHAKE, S_WRITING, S_READING };
enum { E_CONNECT, E_HANDSHAKE, E_WRITE, E_READ, E_STATUS, E_TIMEOUT, E_KINDS };
static const char *const kind_name[E_KINDS] = {
    "connect", "handshake", "write", "read", "status", "timeout"
};

struct conn {
    int fd, state;
    unsigned events;            /* what epoll waits for on fd */
    SSL *ssl;
    double t0;                  /* when connect() was called */
    char head[sizeof WANT];     /* the answer's first bytes */
    size_t got;                 /* bytes of answer */
    /* --rtt: what the client has sent, not yet written to the socket */
    BIO *held;                  /* the connection's write BIO (memory) */
    char out[16384];
    size_t outlen;
    double due;                 /* when out is written */
    int flights;                /* flights taken from held so far */
};

static struct {
    struct sockaddr_in addr;
    int epfd, conns, resume, tls12;
    double duration, timeout, t_end, rtt;
    SSL_CTX *ctx;
    SSL_SESSION *newest;        /* our own copy of the newest session */
    long ok, ok_late, resumed, unclean, errors[E_KINDS], said[E_KINDS];
    double *lat;                /* ms, connections answered before t_end */
    size_t nlat, caplat;
} g;

static void die(const char *what)
{
    fprintf(stderr, "tls-connect: %s: %s\n", what, errno ? strerror(errno) : "failed");
    ERR_print_errors_fp(stderr);
    exit(2);
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* The server gave a session: keep a copy of it (the connection's own
 * object may be marked not resumable when that connection ends badly). */
static int new_session(SSL *ssl, SSL_SESSION *sess)
{
    (void)ssl;
    SSL_SESSION *copy = SSL_SESSION_dup(sess);
    if (copy) {
        if (g.newest)
            SSL_SESSION_free(g.newest);
        g.newest = copy;
    }
    return 0;                   /* we did not keep sess's reference */
}

/* The certificate is not checked (a throwaway one): no chain is built. */
static int accept_any(X509_STORE_CTX *x, void *arg)
{
    (void)x;
    (void)arg;
    return 1;
}

static void watch(struct conn *c, unsigned events)
{
    struct epoll_event ev = { .events = events, .data.ptr = c };
    if (c->events == events)
        return;
    if (epoll_ctl(g.epfd, c->events ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, c->fd, &ev) < 0)
        die("epoll_ctl");
    c->events = events;
}

static void release(struct conn *c)
{
    if (c->ssl)
        SSL_free(c->ssl);
    if (c->fd >= 0)
        close(c->fd);           /* also leaves the epoll set */
    c->ssl = NULL;
    c->held = NULL;             /* freed with ssl */
    c->outlen = 0;
    c->fd = -1;
    c->events = 0;
    c->state = S_FREE;
}

/* The first few failures of each kind are described on stderr. */
static void fail(struct conn *c, int kind, const char *detail)
{
    g.errors[kind]++;
    if (g.said[kind]++ < 3) {
        unsigned long e = ERR_peek_error();
        char buf[256] = "";
        if (e)
            ERR_error_string_n(e, buf, sizeof buf);
        fprintf(stderr, "tls-connect: %s failed: %s%s%s\n", kind_name[kind], detail,
                e ? ": " : "", buf);
    }
    ERR_clear_error();
    release(c);
}

static void start(struct conn *c)
{
    int one = 1;
    c->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c->fd < 0)
        die("socket");
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    c->t0 = now();
    c->got = 0;
    c->events = 0;
    c->ssl = NULL;
    c->state = S_CONNECTING;
    if (connect(c->fd, (struct sockaddr *)&g.addr, sizeof g.addr) < 0 && errno != EINPROGRESS) {
        fail(c, E_CONNECT, strerror(errno));
        return;
    }
    watch(c, EPOLLOUT);
}

/* What an SSL call that did not complete asks for; 0 when it failed. */
static int want(struct conn *c, int r)
{
    int e = SSL_get_error(c->ssl, r);
    if (e == SSL_ERROR_WANT_READ)
        watch(c, EPOLLIN);
    else if (e == SSL_ERROR_WANT_WRITE)
        watch(c, EPOLLOUT);
    else
        return 0;
    return 1;
}

static const char *why(struct conn *c, int r)
{
    int e = SSL_get_error(c->ssl, r);
    if (e == SSL_ERROR_SYSCALL)
        return errno ? strerror(errno) : "EOF";
    if (e == SSL_ERROR_ZERO_RETURN)
        return "close_notify";
    return "TLS error";
}

static void finished(struct conn *c, int clean)
{
    double t = now();
    if (!clean)
        g.unclean++;
    if (c->got < sizeof WANT - 1 || memcmp(c->head, WANT, sizeof WANT - 1) != 0) {
        fail(c, E_STATUS, c->got ? "answer is not HTTP/1.1 200" : "closed without an answer");
        return;
    }
    if (SSL_session_reused(c->ssl))
        g.resumed++;
    if (t <= g.t_end) {
        g.ok++;
        if (g.nlat == g.caplat) {
            g.caplat = g.caplat ? 2 * g.caplat : 65536;
            if (!(g.lat = realloc(g.lat, g.caplat * sizeof *g.lat)))
                die("realloc");
        }
        g.lat[g.nlat++] = (t - c->t0) * 1e3;
    } else
        g.ok_late++;
    release(c);
}

/* Moves a connection on as far as it goes without waiting. */
static void step(struct conn *c)
{
    int r;
    char buf[16384];
    switch (c->state) {
    case S_CONNECTING: {
        int err = 0;
        socklen_t len = sizeof err;
        if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0 || err) {
            fail(c, E_CONNECT, strerror(err ? err : errno));
            return;
        }
        if (!(c->ssl = SSL_new(g.ctx)))
            die("SSL_new");
        if (g.rtt > 0) {
            BIO *rb = BIO_new_socket(c->fd, BIO_NOCLOSE);
            if (!rb || !(c->held = BIO_new(BIO_s_mem())))
                die("BIO_new");
            SSL_set_bio(c->ssl, rb, c->held);
            c->flights = 0;
        } else {
            SSL_set_fd(c->ssl, c->fd);
        }
        SSL_set_tlsext_host_name(c->ssl, "localhost");
        if (g.resume && g.newest) {
            /* a copy per connection: OpenSSL marks a connection's session
             * not resumable when it is freed without a shutdown sent */
            SSL_SESSION *copy = SSL_SESSION_dup(g.newest);
            if (!copy)
                die("SSL_SESSION_dup");
            SSL_set_session(c->ssl, copy);
            SSL_SESSION_free(copy);
        }
        c->state = S_HANDSHAKE;
    }
        /* fall through */
    case S_HANDSHAKE:
        ERR_clear_error();
        r = SSL_connect(c->ssl);
        if (r != 1) {
            if (!want(c, r))
                fail(c, E_HANDSHAKE, why(c, r));
            return;
        }
        c->state = S_WRITING;
        /* fall through */
    case S_WRITING:
        ERR_clear_error();
        r = SSL_write(c->ssl, REQUEST, sizeof REQUEST - 1);
        if (r <= 0) {
            if (!want(c, r))
                fail(c, E_WRITE, why(c, r));
            return;
        }
        c->state = S_READING;
        /* fall through */
    case S_READING:
        for (;;) {
            ERR_clear_error();
            r = SSL_read(c->ssl, buf, sizeof buf);
            if (r > 0) {
                if (c->got < sizeof WANT - 1) {
                    size_t n = sizeof WANT - 1 - c->got;
                    memcpy(c->head + c->got, buf, (size_t)r < n ? (size_t)r : n);
                }
                c->got += r;
                continue;
            }
            if (want(c, r))
                return;
            int e = SSL_get_error(c->ssl, r);
            if (e == SSL_ERROR_ZERO_RETURN) {
                finished(c, 1);
            } else if (c->got && ((e == SSL_ERROR_SYSCALL && errno == 0)
                                  || (e == SSL_ERROR_SSL && ERR_GET_REASON(ERR_peek_error())
                                                                == SSL_R_UNEXPECTED_EOF_WHILE_READING))) {
                ERR_clear_error();
                finished(c, 0);         /* a FIN without close_notify */
            } else {
                fail(c, E_READ, why(c, r));
            }
            return;
        }
    }
}

/* --rtt: what the client wrote since the last step becomes a flight,
 * written at once if it is the hello, else one RTT from now. */
static void hold(struct conn *c)
{
    if (!c->held || c->state == S_FREE)
        return;
    int n = BIO_pending(c->held);
    if (n <= 0)
        return;
    if (c->outlen + n > sizeof c->out)
        die("a flight larger than 16 KiB");
    BIO_read(c->held, c->out + c->outlen, n);
    if (!c->outlen)
        c->due = now() + (c->flights ? g.rtt / 1e3 : 0);
    c->outlen += n;
    c->flights++;
}

/* --rtt: writes the flight that is due; the time to the next one, if
 * sooner than *wait (seconds). */
static void send_due(struct conn *c, double t, double *wait)
{
    if (c->state == S_FREE || !c->outlen)
        return;
    if (c->due > t) {
        if (c->due - t < *wait)
            *wait = c->due - t;
        return;
    }
    ssize_t w = write(c->fd, c->out, c->outlen);
    if (w < 0 && errno != EAGAIN) {
        fail(c, c->state == S_HANDSHAKE ? E_HANDSHAKE : E_WRITE, strerror(errno));
        return;
    }
    if (w > 0) {
        memmove(c->out, c->out + w, c->outlen - w);
        c->outlen -= w;
    }
    if (c->outlen && *wait > 0.001)
        *wait = 0.001;          /* the socket's buffer was full: soon again */
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(double p)
{
    if (!g.nlat)
        return 0;
    size_t i = (size_t)(p * (g.nlat - 1) + 0.5);
    return g.lat[i];
}

/* This process's CPU time and its client processes' that have ended. */
static double cpu_seconds(void)
{
    struct rusage r;
    double t = 0;
    for (int who = 0; who < 2; who++) {
        getrusage(who ? RUSAGE_CHILDREN : RUSAGE_SELF, &r);
        t += r.ru_utime.tv_sec + r.ru_utime.tv_usec / 1e6 + r.ru_stime.tv_sec + r.ru_stime.tv_usec / 1e6;
    }
    return t;
}

/* Keeps n connections going until t_end, then until they are all done. */
static void run(int n)
{
    if ((g.epfd = epoll_create1(EPOLL_CLOEXEC)) < 0)
        die("epoll_create1");
    struct conn *cs = calloc(n, sizeof *cs);
    if (!cs)
        die("calloc");
    for (int i = 0; i < n; i++) {
        cs[i].fd = -1;
        start(&cs[i]);
    }
    struct epoll_event evs[256];
    for (;;) {
        double t = now(), wait = 0.05;
        int open = 0;
        for (int i = 0; i < n; i++) {
            struct conn *c = &cs[i];
            if (c->state != S_FREE && t - c->t0 > g.timeout)
                fail(c, E_TIMEOUT, "no close within the timeout");
            if (c->state == S_FREE && t < g.t_end) {
                start(c);
                hold(c);
            }
            send_due(c, t, &wait);
            open += c->state != S_FREE;
        }
        if (!open && t >= g.t_end)
            break;
        int k = epoll_wait(g.epfd, evs, 256, (int)(wait * 1e3 + 0.999));
        if (k < 0 && errno != EINTR)
            die("epoll_wait");
        for (int i = 0; i < k; i++) {
            struct conn *c = evs[i].data.ptr;
            if (c->state == S_FREE)
                continue;
            step(c);
            hold(c);
            if (c->state == S_FREE && now() < g.t_end) {
                start(c);
                hold(c);
            }
        }
    }
    free(cs);
}

/* What a client process hands back to the first one, then its latencies. */
struct tally {
    long ok, ok_late, resumed, unclean, errors[E_KINDS];
    size_t nlat;
};

static void xfer(int fd, void *buf, size_t len, int out)
{
    char *p = buf;
    while (len) {
        ssize_t r = out ? write(fd, p, len) : read(fd, p, len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            die(out ? "write to the first process" : "a client process ended early");
        p += r;
        len -= r;
    }
}

static void usage(void)
{
    fprintf(stderr, "usage: tls-connect -p PORT [-h ADDR] [-c N] [-d SECONDS] [-t PROCS] [--tls12] "
                    "[--resume] [--timeout SECONDS] [--rtt MS]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    int port = 0, procs = 1;
    const char *host = "127.0.0.1";
    g.conns = 16;
    g.duration = 5;
    g.timeout = 5;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--tls12"))
            g.tls12 = 1;
        else if (!strcmp(a, "--resume"))
            g.resume = 1;
        else if (i + 1 >= argc)
            usage();
        else if (!strcmp(a, "-p"))
            port = atoi(argv[++i]);
        else if (!strcmp(a, "-h"))
            host = argv[++i];
        else if (!strcmp(a, "-c"))
            g.conns = atoi(argv[++i]);
        else if (!strcmp(a, "-d"))
            g.duration = atof(argv[++i]);
        else if (!strcmp(a, "-t"))
            procs = atoi(argv[++i]);
        else if (!strcmp(a, "--timeout"))
            g.timeout = atof(argv[++i]);
        else if (!strcmp(a, "--rtt"))
            g.rtt = atof(argv[++i]);
        else
            usage();
    }
    if (port <= 0 || port > 65535 || g.conns < 1 || g.duration <= 0 || g.timeout <= 0 || g.rtt < 0 || procs < 1
        || procs > g.conns)
        usage();
    g.addr.sin_family = AF_INET;
    g.addr.sin_port = htons(port);
    if (inet_pton(AF_INET, host, &g.addr.sin_addr) != 1)
        usage();
    signal(SIGPIPE, SIG_IGN);

    if (!(g.ctx = SSL_CTX_new(TLS_client_method())))
        die("SSL_CTX_new");
    SSL_CTX_set_verify(g.ctx, SSL_VERIFY_NONE, NULL);
    SSL_CTX_set_cert_verify_callback(g.ctx, accept_any, NULL);
    SSL_CTX_set_min_proto_version(g.ctx, g.tls12 ? TLS1_2_VERSION : TLS1_3_VERSION);
    SSL_CTX_set_max_proto_version(g.ctx, g.tls12 ? TLS1_2_VERSION : TLS1_3_VERSION);
    SSL_CTX_set_session_cache_mode(g.ctx, SSL_SESS_CACHE_CLIENT | SSL_SESS_CACHE_NO_INTERNAL_STORE);
    SSL_CTX_sess_set_new_cb(g.ctx, new_session);

    double t_start = now(), cpu0 = cpu_seconds();
    g.t_end = t_start + g.duration;
    /* -t: the connections are shared among that many processes (one
     * process saturates one CPU), each with sessions of its own; the
     * others hand their tallies and latencies back through a pipe. */
    int pipes[procs];
    pid_t pids[procs];
    for (int p = 1; p < procs; p++) {
        int fds[2];
        if (pipe(fds) < 0)
            die("pipe");
        if ((pids[p] = fork()) < 0)
            die("fork");
        if (pids[p] == 0) {
            close(fds[0]);
            run(g.conns / procs + (p <= g.conns % procs));
            struct tally t = { g.ok, g.ok_late, g.resumed, g.unclean, { 0 }, g.nlat };
            memcpy(t.errors, g.errors, sizeof t.errors);
            xfer(fds[1], &t, sizeof t, 1);
            if (g.nlat)
                xfer(fds[1], g.lat, g.nlat * sizeof *g.lat, 1);
            _exit(0);
        }
        close(fds[1]);
        pipes[p] = fds[0];
    }
    run(g.conns / procs);
    for (int p = 1; p < procs; p++) {
        struct tally t;
        xfer(pipes[p], &t, sizeof t, 0);
        g.ok += t.ok;
        g.ok_late += t.ok_late;
        g.resumed += t.resumed;
        g.unclean += t.unclean;
        for (int k = 0; k < E_KINDS; k++)
            g.errors[k] += t.errors[k];
        if (t.nlat) {
            if (!(g.lat = realloc(g.lat, (g.nlat + t.nlat) * sizeof *g.lat)))
                die("realloc");
            xfer(pipes[p], g.lat + g.nlat, t.nlat * sizeof *g.lat, 0);
            g.nlat += t.nlat;
        }
        close(pipes[p]);
        waitpid(pids[p], NULL, 0);
    }
    double cpu = (cpu_seconds() - cpu0) / (now() - t_start);

    qsort(g.lat, g.nlat, sizeof *g.lat, cmp_double);
    long errors = 0, answered = g.ok + g.ok_late;
    for (int k = 0; k < E_KINDS; k++)
        errors += g.errors[k];
    printf("conns_s=%.1f ok=%ld p50_ms=%.2f p99_ms=%.2f errors=%ld", g.ok / g.duration, g.ok,
           pct(0.50), pct(0.99), errors);
    for (int k = 0; k < E_KINDS; k++)
        printf(" %s=%ld", kind_name[k], g.errors[k]);
    printf(" resumed=%ld/%ld", g.resumed, answered);
    if (g.resume)
        printf(" resume=%s", answered > g.conns && g.resumed >= 0.9 * (answered - g.conns) ? "ok" : "FAILED");
    printf(" unclean=%ld late=%ld tls=%s c=%d t=%d d=%g rtt_ms=%g client_cpu=%.2f\n", g.unclean, g.ok_late,
           g.tls12 ? "1.2" : "1.3", g.conns, procs, g.duration, g.rtt, cpu);
    return 0;
}
