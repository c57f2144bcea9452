/* What TLS would cost Narwhal on a kernel without kTLS, measured on the
 * server's side only (a child process; its CPU time from getrusage):
 *   - a full handshake, and one resumed with a TLS 1.3 ticket;
 *   - the memory one idle, established TLS connection holds;
 *   - one keep-alive request relayed in plaintext through a socketpair
 *     (SSL_read, write to the pair, the answer back, SSL_write), against
 *     the same request over plain TCP (read, write).
 * docs/DESIGN.md, "HTTPS".
 *
 *   openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
 *       -keyout /tmp/k.pem -out /tmp/c.pem -days 2 -subj /CN=localhost
 *   cc -O2 -o /tmp/tls-cost bench/src/tls-cost.c -lssl -lcrypto
 *   /tmp/tls-cost /tmp/c.pem /tmp/k.pem 2000
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define REQUEST "GET / HTTP/1.1\r\nHost: localhost\r\nUser-Agent: tls-cost\r\nAccept: */*\r\n\r\n"
#define RESPONSE "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 13\r\n\r\nHello, World!"

static void die(const char *what)
{
    perror(what);
    ERR_print_errors_fp(stderr);
    exit(1);
}

static double cpu_seconds(void)
{
    struct rusage r;
    getrusage(RUSAGE_SELF, &r);
    return r.ru_utime.tv_sec + r.ru_utime.tv_usec / 1e6 + r.ru_stime.tv_sec + r.ru_stime.tv_usec / 1e6;
}

static long rss_kib(void)
{
    long pages = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f || fscanf(f, "%ld %ld", &pages, &resident) != 2)
        die("statm");
    fclose(f);
    return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

static int accept_one(int lfd)
{
    int fd = accept(lfd, NULL, NULL), one = 1;
    if (fd < 0)
        die("accept");
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

static SSL *server_handshake(SSL_CTX *ctx, int fd)
{
    SSL *s = SSL_new(ctx);
    SSL_set_fd(s, fd);
    if (SSL_accept(s) != 1)
        die("SSL_accept");
    return s;
}

/* full or resumed handshakes: accept, handshake, send one byte (so the
 * client reads its ticket), close */
static void serve_handshakes(SSL_CTX *ctx, int lfd, int n, const char *label)
{
    double c0 = cpu_seconds();
    int reused = 0;
    for (int i = 0; i < n; i++) {
        int fd = accept_one(lfd);
        SSL *s = server_handshake(ctx, fd);
        reused += SSL_session_reused(s);
        SSL_write(s, "x", 1);
        char b;
        SSL_read(s, &b, 1);    /* the client's close */
        SSL_free(s);
        close(fd);
    }
    double cpu = cpu_seconds() - c0;
    printf("%-28s %8.1f us CPU each  (%d of %d resumed; %.0f per CPU-second)\n",
           label, cpu / n * 1e6, reused, n, n / cpu);
}

static void serve_idle(SSL_CTX *ctx, int lfd, int n)
{
    SSL **kept = calloc(n, sizeof *kept);
    int *fds = calloc(n, sizeof *fds);
    long before = rss_kib();
    for (int i = 0; i < n; i++) {
        fds[i] = accept_one(lfd);
        kept[i] = server_handshake(ctx, fds[i]);
        SSL_write(kept[i], "x", 1);
    }
    long after = rss_kib();
    printf("%-28s %8.1f KiB each  (%d held, release-buffers mode)\n", "idle TLS connection",
           (double)(after - before) / n, n);
    for (int i = 0; i < n; i++) {
        SSL_free(kept[i]);
        close(fds[i]);
    }
    free(kept);
    free(fds);
}

/* one keep-alive connection, n requests: TLS relayed through a socketpair,
 * then plain TCP */
static void serve_requests(SSL_CTX *ctx, int lfd, int n)
{
    char buf[4096];
    int pair[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, pair) < 0)
        die("socketpair");
    int fd = accept_one(lfd);
    SSL *s = server_handshake(ctx, fd);
    double c0 = cpu_seconds();
    for (int i = 0; i < n; i++) {
        int got = SSL_read(s, buf, sizeof buf);
        if (got <= 0)
            die("SSL_read");
        if (write(pair[0], buf, got) != got || read(pair[1], buf, sizeof buf) != got)
            die("pair");
        if (write(pair[1], RESPONSE, sizeof RESPONSE - 1) < 0 || read(pair[0], buf, sizeof buf) <= 0)
            die("pair back");
        SSL_write(s, RESPONSE, sizeof RESPONSE - 1);
    }
    double tls = cpu_seconds() - c0;
    SSL_free(s);
    close(fd);
    fd = accept_one(lfd);
    c0 = cpu_seconds();
    for (int i = 0; i < n; i++) {
        if (read(fd, buf, sizeof buf) <= 0 || write(fd, RESPONSE, sizeof RESPONSE - 1) < 0)
            die("plain");
    }
    double plain = cpu_seconds() - c0;
    close(fd);
    printf("%-28s %8.1f us CPU each\n", "request, TLS + relay", tls / n * 1e6);
    printf("%-28s %8.1f us CPU each\n", "request, plain TCP", plain / n * 1e6);
}

static SSL *client_connect(SSL_CTX *ctx, struct sockaddr_in *addr, SSL_SESSION *resume, int *fd_out)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    if (fd < 0 || connect(fd, (struct sockaddr *)addr, sizeof *addr) < 0)
        die("connect");
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    SSL *s = SSL_new(ctx);
    SSL_set_fd(s, fd);
    if (resume)
        SSL_set_session(s, resume);
    if (SSL_connect(s) != 1)
        die("SSL_connect");
    *fd_out = fd;
    return s;
}

static SSL_SESSION *client_handshakes(SSL_CTX *ctx, struct sockaddr_in *addr, int n, SSL_SESSION *resume)
{
    SSL_SESSION *last = resume ? SSL_SESSION_dup(resume) : NULL;
    for (int i = 0; i < n; i++) {
        int fd;
        SSL *s = client_connect(ctx, addr, resume ? last : NULL, &fd);
        char b;
        SSL_read(s, &b, 1);
        if (resume || !last) {    /* a client resumes with its newest ticket */
            SSL_SESSION_free(last);
            last = SSL_get1_session(s);
        }
        SSL_shutdown(s);
        SSL_free(s);
        close(fd);
    }
    return last;
}

static void client_requests(SSL_CTX *ctx, struct sockaddr_in *addr, int n)
{
    char buf[4096];
    int fd;
    SSL *s = client_connect(ctx, addr, NULL, &fd);
    for (int i = 0; i < n; i++) {
        SSL_write(s, REQUEST, sizeof REQUEST - 1);
        if (SSL_read(s, buf, sizeof buf) <= 0)
            die("client SSL_read");
    }
    SSL_free(s);
    close(fd);
    fd = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(fd, (struct sockaddr *)addr, sizeof *addr) < 0)
        die("connect plain");
    for (int i = 0; i < n; i++) {
        if (write(fd, REQUEST, sizeof REQUEST - 1) < 0 || read(fd, buf, sizeof buf) <= 0)
            die("client plain");
    }
    close(fd);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: tls-cost CERT KEY [N]\n");
        return 2;
    }
    int n = argc > 3 ? atoi(argv[3]) : 2000;
    SSL_CTX *sctx = SSL_CTX_new(TLS_server_method()), *cctx = SSL_CTX_new(TLS_client_method());
    SSL_CTX_set_min_proto_version(sctx, TLS1_2_VERSION);
    SSL_CTX_set_mode(sctx, SSL_MODE_RELEASE_BUFFERS);
    if (SSL_CTX_use_certificate_chain_file(sctx, argv[1]) != 1
        || SSL_CTX_use_PrivateKey_file(sctx, argv[2], SSL_FILETYPE_PEM) != 1)
        die("certificate");
    SSL_CTX_set_session_cache_mode(cctx, SSL_SESS_CACHE_CLIENT);

    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in addr = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t alen = sizeof addr;
    if (bind(lfd, (struct sockaddr *)&addr, sizeof addr) < 0 || listen(lfd, 4096) < 0
        || getsockname(lfd, (struct sockaddr *)&addr, &alen) < 0)
        die("listen");
    setvbuf(stdout, NULL, _IOLBF, 0);
    pid_t pid = fork();
    if (pid == 0) {
        serve_handshakes(sctx, lfd, n, "full handshake");
        serve_handshakes(sctx, lfd, n, "resumed handshake");
        serve_idle(sctx, lfd, n);
        serve_requests(sctx, lfd, n * 10);
        _exit(0);
    }
    close(lfd);
    SSL_SESSION *session = client_handshakes(cctx, &addr, n, NULL);
    client_handshakes(cctx, &addr, n, session);
    SSL **idle = calloc(n, sizeof *idle);
    int *fds = calloc(n, sizeof *fds);
    for (int i = 0; i < n; i++) {
        char b;
        idle[i] = client_connect(cctx, &addr, NULL, &fds[i]);
        SSL_read(idle[i], &b, 1);
    }
    client_requests(cctx, &addr, n * 10);
    int status;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}
