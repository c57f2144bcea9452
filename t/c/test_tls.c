/* The TLS part's core (src/manager/nw_tls.c): contexts from good and bad files,
 * handshakes over real loopback TCP with an OpenSSL client in the same
 * thread (both sides non-blocking, one poll loop), the refusals by
 * reason, session tickets across key rotations, and the relay of
 * plaintext through a socketpair with ends of stream both ways.
 * Throwaway certificates come from the openssl command, in a temp dir. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include "tap.h"
#include "loopback.h"
#include "nw_ktls.h"
#include "nw_tls.h"
#include "nw_tls_pool.h"

static char dir[64];
static char cert[128], key[128], other_key[128], cert2[128], key2[128], empty[128], locked[128];
static int listener;
static struct sockaddr_in laddr;

static void path(char *out, const char *name)
{
    snprintf(out, 128, "%s/%s", dir, name);
}

/* The certificates: cert/key (P-256, CN=localhost), other_key (a P-256
 * key of no certificate here), cert2/key2 (CN=reloaded), locked (a key
 * under a passphrase), an empty file. */
static void make_certs(void)
{
    char cmd[1024];
    strcpy(dir, "/tmp/nw-tls-XXXXXX");
    if (!mkdtemp(dir))
        loopback_die("mkdtemp");
    path(cert, "cert.pem"), path(key, "key.pem"), path(other_key, "other.pem");
    path(cert2, "cert2.pem"), path(key2, "key2.pem"), path(empty, "empty.pem");
    path(locked, "locked.pem");
    snprintf(cmd, sizeof cmd,
             "(cd %s && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes"
             " -keyout key.pem -out cert.pem -days 2 -subj /CN=localhost"
             " && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes"
             " -keyout key2.pem -out cert2.pem -days 2 -subj /CN=reloaded"
             " && openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out other.pem"
             " && openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -aes256"
             " -pass pass:secret -out locked.pem"
             " && : > empty.pem) >/dev/null 2>&1", dir);
    if (system(cmd) != 0) {
        fprintf(stderr, "openssl could not make test certificates\n");
        exit(2);
    }
}

static void remove_certs(void)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        diag("could not remove %s", dir);
}

static void nonblocking(int fd)
{
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

/* A connected loopback TCP pair, both ends non-blocking. */
static void tcp_pair(int *cfd, int *sfd)
{
    *cfd = loopback_client(&laddr);
    *sfd = accept(listener, NULL, NULL);
    if (*sfd < 0)
        loopback_die("accept");
    nonblocking(*cfd);
    nonblocking(*sfd);
}

static void wait_fds(int a, int b, int ms)
{
    struct pollfd p[2] = { { .fd = a, .events = POLLIN }, { .fd = b, .events = POLLIN } };
    poll(p, 2, ms);
}

/* A client context: versions min..max (0: OpenSSL's), a TLS 1.2 cipher
 * list or NULL, ALPN offer (wire format) or NULL. */
static SSL_CTX *client_ctx(int min, int max, const char *ciphers, const char *alpn)
{
    SSL_CTX *c = SSL_CTX_new(TLS_client_method());
    SSL_CTX_set_min_proto_version(c, min);
    SSL_CTX_set_max_proto_version(c, max);
    if (ciphers)
        SSL_CTX_set_cipher_list(c, ciphers);
    if (alpn)
        SSL_CTX_set_alpn_protos(c, (const unsigned char *)alpn, strlen(alpn));
    SSL_CTX_set_mode(c, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    return c;
}

/* One handshake: the client's outcome (1 done, -1 failed) and the
 * server's last step. */
struct hs {
    int client;
    enum nw_tls_step server;
};

static int step_pending(enum nw_tls_step s)
{
    return s == NW_TLS_WANT_READ || s == NW_TLS_WANT_WRITE;
}

static struct hs drive(SSL *cl, struct nw_tls_conn *sc, int cfd, int sfd)
{
    struct hs h = { 0, NW_TLS_WANT_READ };
    for (int i = 0; i < 400 && (h.client == 0 || step_pending(h.server)); i++) {
        if (h.client == 0) {
            int r = SSL_do_handshake(cl);
            if (r == 1)
                h.client = 1;
            else if (SSL_get_error(cl, r) != SSL_ERROR_WANT_READ
                     && SSL_get_error(cl, r) != SSL_ERROR_WANT_WRITE)
                h.client = -1;
            ERR_clear_error();
        }
        if (step_pending(h.server))
            h.server = nw_tls_handshake(sc);
        if (!step_pending(h.server) && h.client == 0 && h.server != NW_TLS_DONE)
            h.client = -1;    /* (what it got is the server's business here) */
        wait_fds(cfd, sfd, 10);
    }
    return h;
}

/* A connection of a client from cctx to a server conn of t: sockets,
 * both sides, the handshake driven. */
struct link {
    int cfd, sfd;
    SSL *cl;
    struct nw_tls_conn *sc;
    struct hs h;
};

static void link_up(struct link *l, SSL_CTX *cctx, struct nw_tls_ctx *t, SSL_SESSION *resume)
{
    tcp_pair(&l->cfd, &l->sfd);
    l->cl = SSL_new(cctx);
    SSL_set_fd(l->cl, l->cfd);
    SSL_set_connect_state(l->cl);
    if (resume)
        SSL_set_session(l->cl, resume);
    l->sc = nw_tls_conn_new(t, l->sfd);
    l->h = drive(l->cl, l->sc, l->cfd, l->sfd);
}

static void link_down(struct link *l)
{
    if (l->h.client == 1)
        SSL_shutdown(l->cl);    /* (a session freed without it is not resumed) */
    SSL_free(l->cl);
    nw_tls_conn_free(l->sc);
    close(l->cfd);
    close(l->sfd);
    ERR_clear_error();
}

/* ---- Contexts ---- */

static void check_refused(const char *c, const char *k, const char *want, const char *name)
{
    char err[512] = "";
    struct nw_tls_ctx *t = nw_tls_ctx_new(c, k, err, sizeof err);
    ok(!t, name);
    if (!ok(strstr(err, want) != NULL, "... with its reason"))
        diag("got: %s; want: %s", err, want);
    ok(!strchr(err, '\n') && err[0], "... on one line");
    nw_tls_ctx_free(t);
}

static void test_files(void)
{
    char want[512], missing[128];
    path(missing, "missing.pem");
    snprintf(want, sizeof want, "cannot read certificate file %s: No such file", missing);
    check_refused(missing, key, want, "a missing certificate file");
    snprintf(want, sizeof want, "cannot read key file %s: No such file", missing);
    check_refused(cert, missing, want, "a missing key file");
    snprintf(want, sizeof want, "no certificate in %s", empty);
    check_refused(empty, key, want, "an empty certificate file");
    snprintf(want, sizeof want, "no certificate in %s", key);
    check_refused(key, key, want, "a key file given as the certificate");
    snprintf(want, sizeof want, "no private key in %s", cert);
    check_refused(cert, cert, want, "a certificate given as the key");
    snprintf(want, sizeof want, "the key in %s does not match the certificate in %s",
             other_key, cert);
    check_refused(cert, other_key, want, "a key of another certificate");
    snprintf(want, sizeof want, "no private key in %s", empty);
    check_refused(cert, empty, want, "an empty key file");
    snprintf(want, sizeof want, "the key in %s is encrypted", locked);
    check_refused(cert, locked, want, "a key under a passphrase (never asked for)");
    snprintf(want, sizeof want, "cannot read certificate file %s: Is a directory", dir);
    check_refused(dir, key, want, "a directory as the certificate");
}

/* The CN of the certificate the server showed the client. */
static int peer_cn_is(SSL *cl, const char *want)
{
    char cn[64] = "";
    X509 *x = SSL_get1_peer_certificate(cl);
    if (x)
        X509_NAME_get_text_by_NID(X509_get_subject_name(x), NID_commonName, cn, sizeof cn);
    X509_free(x);
    return strcmp(cn, want) == 0;
}

static void test_reload(struct nw_tls_ctx *t, SSL_CTX *cctx)
{
    char err[512] = "";
    struct link l;
    ok(nw_tls_ctx_reload(t, cert2, other_key, err, sizeof err) == -1,
       "reload: a pair that does not match is refused");
    if (!ok(strstr(err, "does not match") != NULL, "... saying why"))
        diag("got: %s", err);
    link_up(&l, cctx, t, NULL);
    ok(l.h.server == NW_TLS_DONE && peer_cn_is(l.cl, "localhost"), "... and the old pair serves on");
    link_down(&l);
    ok(nw_tls_ctx_reload(t, cert2, key2, err, sizeof err) == 0, "reload: a new pair is taken");
    link_up(&l, cctx, t, NULL);
    ok(l.h.server == NW_TLS_DONE && peer_cn_is(l.cl, "reloaded"), "... and serves");
    link_down(&l);
    ok(nw_tls_ctx_reload(t, cert, key, err, sizeof err) == 0, "reload: back to the first pair");
}

/* ---- Handshakes ---- */

static void alpn_is(SSL *cl, const char *want, const char *name)
{
    const unsigned char *p = NULL;
    unsigned int n = 0;
    SSL_get0_alpn_selected(cl, &p, &n);
    is_str((const char *)p, p ? n : 0, want, name);
}

static void test_handshakes(struct nw_tls_ctx *t)
{
    struct link l;
    SSL_CTX *cc = client_ctx(0, 0, NULL, "\x02h2\x08http/1.1");
    link_up(&l, cc, t, NULL);
    is(l.h.server, NW_TLS_DONE, "TLS 1.3 handshake done (server)");
    is(l.h.client, 1, "... and client");
    is(SSL_version(l.cl), TLS1_3_VERSION, "... in TLS 1.3");
    alpn_is(l.cl, "http/1.1", "ALPN: http/1.1 chosen among h2 and http/1.1");
    is(nw_tls_conn_reason(l.sc), NW_TLS_R_NONE, "... no failure reason");
    link_down(&l);
    SSL_CTX_free(cc);

    cc = client_ctx(0, 0, NULL, "\x02h2");
    link_up(&l, cc, t, NULL);
    ok(l.h.server == NW_TLS_DONE && l.h.client == 1, "ALPN: a client offering only h2 is served");
    const unsigned char *p = NULL;
    unsigned int n = 0;
    SSL_get0_alpn_selected(l.cl, &p, &n);
    ok(n == 0, "... with no ALPN answer");
    link_down(&l);
    SSL_CTX_free(cc);

    cc = client_ctx(TLS1_2_VERSION, TLS1_2_VERSION, NULL, "\x08http/1.1");
    link_up(&l, cc, t, NULL);
    ok(l.h.server == NW_TLS_DONE && SSL_version(l.cl) == TLS1_2_VERSION, "TLS 1.2 handshake done");
    if (!ok(strncmp(SSL_get_cipher_name(l.cl), "ECDHE-ECDSA-", 12) == 0
       && strstr(SSL_get_cipher_name(l.cl), "GCM") != NULL, "... with an ECDHE AEAD cipher"))
        diag("cipher: %s", SSL_get_cipher_name(l.cl));
    alpn_is(l.cl, "http/1.1", "... and ALPN http/1.1");
    link_down(&l);
    SSL_CTX_free(cc);
}

static void expect_refused(struct nw_tls_ctx *t, SSL_CTX *cc, enum nw_tls_reason want,
                           const char *name)
{
    struct link l;
    link_up(&l, cc, t, NULL);
    is(l.h.server, NW_TLS_FAILED, name);
    is(nw_tls_conn_reason(l.sc), want, "... for its reason");
    ok(l.h.client == -1, "... and the client failed too");
    link_down(&l);
    SSL_CTX_free(cc);
}

static void test_refusals(struct nw_tls_ctx *t)
{
    SSL_CTX *cc = client_ctx(TLS1_1_VERSION, TLS1_1_VERSION, "DEFAULT:@SECLEVEL=0", NULL);
    SSL_CTX_set_security_level(cc, 0);
    expect_refused(t, cc, NW_TLS_R_VERSION, "a TLS 1.1 client is refused");
    is_str(nw_tls_reason_name(NW_TLS_R_VERSION), strlen("version"), "version", "... named version");
    cc = client_ctx(TLS1_2_VERSION, TLS1_2_VERSION, "AES128-GCM-SHA256:AES256-SHA", NULL);
    expect_refused(t, cc, NW_TLS_R_CIPHER, "a TLS 1.2 client without ECDHE is refused");
    cc = client_ctx(TLS1_2_VERSION, TLS1_2_VERSION, "ECDHE-ECDSA-AES128-SHA", NULL);
    expect_refused(t, cc, NW_TLS_R_CIPHER, "a TLS 1.2 client with CBC only is refused");
}

/* A server conn on a socket whose client sent bytes (n of them) and,
 * if close_after, closed; stepped until it is no longer waiting. */
static enum nw_tls_step server_given(struct nw_tls_ctx *t, const char *bytes, size_t n,
                                     int close_after, struct nw_tls_conn **out)
{
    int cfd, sfd;
    enum nw_tls_step s = NW_TLS_WANT_READ;
    tcp_pair(&cfd, &sfd);
    if (n && write(cfd, bytes, n) != (ssize_t)n)
        loopback_die("write");
    if (close_after)
        close(cfd);
    *out = nw_tls_conn_new(t, sfd);
    for (int i = 0; i < 100 && step_pending(s); i++) {
        wait_fds(sfd, sfd, 20);
        s = nw_tls_handshake(*out);
        if (s == NW_TLS_WANT_READ && !close_after && i > 5)
            break;    /* (it waits for more, as it should) */
    }
    if (!close_after)
        close(cfd);
    close(sfd);    /* (the conn does not own it; a test only reads its state) */
    return s;
}

/* The first flight of an OpenSSL client (its ClientHello), in buf. */
static size_t client_hello(char *buf, size_t size)
{
    SSL_CTX *cc = client_ctx(0, 0, NULL, "\x08http/1.1");
    SSL *cl = SSL_new(cc);
    BIO *rb = BIO_new(BIO_s_mem()), *wb = BIO_new(BIO_s_mem());
    SSL_set_bio(cl, rb, wb);
    SSL_set_connect_state(cl);
    SSL_do_handshake(cl);
    int n = BIO_read(wb, buf, (int)size);
    SSL_free(cl);
    SSL_CTX_free(cc);
    ERR_clear_error();
    return n > 0 ? (size_t)n : 0;
}

static void test_not_tls(struct nw_tls_ctx *t)
{
    struct nw_tls_conn *c;
    static const char get[] = "GET / HTTP/1.1\r\nHost: localhost\r\n\r\n";
    static const char junk[] = "\x16garbage, not a record at all\r\n\r\n";
    static const char short_hello[] = "\x16\x03\x01\x00\x06\x01\x00\x00\x02\x03\x03";
    char hello[4096];
    size_t len, hn = client_hello(hello, sizeof hello);

    is(server_given(t, get, sizeof get - 1, 0, &c), NW_TLS_PLAIN, "plain HTTP is PLAIN");
    is(nw_tls_conn_reason(c), NW_TLS_R_PLAIN, "... reason plain");
    is_str(nw_tls_reason_name(nw_tls_conn_reason(c)), strlen("plain_http"), "plain_http",
           "... named plain_http");
    nw_tls_conn_free(c);
    const char *a = nw_tls_plain_400(&len);
    ok(len > 20 && strncmp(a, "HTTP/1.1 400 Bad Request\r\n", 26) == 0, "the answer to it: a 400");
    ok(strstr(a, "\r\nConnection: close\r\n") && strstr(a, "HTTPS"), "... closing, saying HTTPS");
    const char *body = strstr(a, "\r\n\r\n") + 4, *cl = strstr(a, "Content-Length: ");
    is(cl ? atoi(cl + 16) : -1, (long long)(a + len - body), "... its Content-Length right");

    is(server_given(t, NULL, 0, 0, &c), NW_TLS_WANT_READ, "nothing sent yet: WANT_READ");
    nw_tls_conn_free(c);
    is(server_given(t, junk, sizeof junk - 1, 0, &c), NW_TLS_FAILED, "0x16 then junk: FAILED");
    is(nw_tls_conn_reason(c), NW_TLS_R_GARBAGE, "... reason garbage");
    nw_tls_conn_free(c);
    is(server_given(t, short_hello, sizeof short_hello - 1, 0, &c), NW_TLS_FAILED,
       "a ClientHello cut short inside its record: FAILED");
    is(nw_tls_conn_reason(c), NW_TLS_R_GARBAGE, "... reason garbage");
    nw_tls_conn_free(c);

    ok(hn > 100, "an OpenSSL client's hello taken");
    is(server_given(t, NULL, 0, 1, &c), NW_TLS_FAILED, "a client closing at once: FAILED");
    is(nw_tls_conn_reason(c), NW_TLS_R_CLOSED, "... reason closed");
    nw_tls_conn_free(c);
    is(server_given(t, hello, hn / 2, 1, &c), NW_TLS_FAILED,
       "a client closing in the middle of its hello: FAILED");
    is(nw_tls_conn_reason(c), NW_TLS_R_CLOSED, "... reason closed");
    nw_tls_conn_free(c);
    is(server_given(t, hello, hn, 1, &c), NW_TLS_FAILED,
       "a client closing after its hello: FAILED");
    is(nw_tls_conn_reason(c), NW_TLS_R_CLOSED, "... reason closed");
    nw_tls_conn_free(c);
}

/* ---- Tickets ---- */

static SSL_SESSION *last_session;

static int keep_session(SSL *s, SSL_SESSION *sess)
{
    (void)s;
    SSL_SESSION_free(last_session);
    last_session = sess;
    return 1;    /* (ours now) */
}

/* A handshake of cc, resuming from resume or not, after which the client
 * reads its tickets; whether the server resumed it. The client presents
 * a copy of resume: OpenSSL's client uses a TLS 1.3 ticket once (RFC
 * 8446's advice to clients), and the test shows the same ticket again. */
static int resumed(struct nw_tls_ctx *t, SSL_CTX *cc, SSL_SESSION *resume, int *done)
{
    struct link l;
    char b;
    SSL_SESSION *copy = resume ? SSL_SESSION_dup(resume) : NULL;
    link_up(&l, cc, t, copy);
    SSL_SESSION_free(copy);
    *done = l.h.server == NW_TLS_DONE && l.h.client == 1;
    for (int i = 0; i < 20 && SSL_version(l.cl) == TLS1_3_VERSION; i++) {
        if (SSL_read(l.cl, &b, 1) <= 0 && SSL_get_error(l.cl, -1) != SSL_ERROR_WANT_READ)
            break;
        ERR_clear_error();
        if (last_session && i > 2)
            break;
        wait_fds(l.cfd, l.cfd, 10);
    }
    int r = SSL_session_reused(l.cl);
    ok(!*done || nw_tls_conn_resumed(l.sc) == r, "... the server's nw_tls_conn_resumed agrees");
    link_down(&l);
    return r;
}

static void test_tickets(struct nw_tls_ctx *t, int version, const char *v)
{
    char name[128];
    int done;
    SSL_CTX *cc = client_ctx(version, version, NULL, NULL);
    SSL_CTX_set_session_cache_mode(cc, SSL_SESS_CACHE_CLIENT | SSL_SESS_CACHE_NO_INTERNAL_STORE);
    SSL_CTX_sess_set_new_cb(cc, keep_session);
    last_session = NULL;
    ok(!resumed(t, cc, NULL, &done) && done, (snprintf(name, sizeof name, "%s: a full handshake", v), name));
    SSL_SESSION *first = last_session;
    last_session = NULL;
    ok(first != NULL, "... gave the client a ticket");
    if (!first) {
        SSL_CTX_free(cc);
        return;
    }
    ok(resumed(t, cc, first, &done) && done, (snprintf(name, sizeof name, "%s: the ticket resumes", v), name));
    is(nw_tls_ctx_rotate_ticket_key(t), 0, "the ticket key rotated");
    ok(resumed(t, cc, first, &done) && done, "... the ticket still resumes after one rotation");
    is(nw_tls_ctx_rotate_ticket_key(t), 0, "the ticket key rotated again");
    ok(!resumed(t, cc, first, &done) && done, "... and no longer after two: a full handshake");
    ok(last_session != NULL, "... which gave a new ticket");
    SSL_SESSION *fresh = last_session;
    last_session = NULL;
    ok(fresh && resumed(t, cc, fresh, &done) && done, "... which resumes");
    SSL_SESSION_free(first);
    SSL_SESSION_free(fresh);
    SSL_SESSION_free(last_session);
    last_session = NULL;
    SSL_CTX_free(cc);
}

/* ---- Relay ---- */

#define RELAY_TLS_FIN  1    /* the client ends with close_notify */
#define RELAY_TCP_FIN  2    /* ... with shutdown(SHUT_WR) alone */

/* One end of the relay test: the client (over TLS) or the worker (the
 * pair's far end). It sends to_send bytes of a pattern (salted), then
 * ends its stream; it reads and checks the other's. It starts sending at
 * once, or once the other's stream has ended. */
struct end {
    SSL *ssl;           /* NULL: the pair end */
    int fd, fin;
    size_t to_send, sent, got;
    int salt_out, salt_in, send_first, shut, eof, bad;
};

static unsigned char pattern(size_t i, int salt)
{
    return (unsigned char)(i * 7 + (i >> 11) * salt + salt);
}

static int end_write(struct end *e, const char *p, size_t n)
{
    if (!e->ssl)
        return (int)write(e->fd, p, n);
    int r = SSL_write(e->ssl, p, (int)n);
    ERR_clear_error();
    return r > 0 ? r : -1;
}

/* Returns 1, 0 (would block), -1 at the end of the stream. */
static int end_read(struct end *e, char *p, size_t n, ssize_t *got)
{
    if (!e->ssl) {
        *got = read(e->fd, p, n);
        return *got > 0 ? 1 : *got == 0 ? -1 : errno == EAGAIN ? 0 : (e->bad = 1, -1);
    }
    int r = SSL_read(e->ssl, p, (int)n), code = SSL_get_error(e->ssl, r);
    ERR_clear_error();
    *got = r;
    if (r > 0)
        return 1;
    if (code == SSL_ERROR_WANT_READ || code == SSL_ERROR_WANT_WRITE)
        return 0;
    if (code != SSL_ERROR_ZERO_RETURN)
        e->bad = 1;
    return -1;
}

static void end_send(struct end *e)
{
    char chunk[16384];
    while (e->sent < e->to_send) {
        size_t n = e->to_send - e->sent < sizeof chunk ? e->to_send - e->sent : sizeof chunk;
        for (size_t i = 0; i < n; i++)
            chunk[i] = (char)pattern(e->sent + i, e->salt_out);
        int w = end_write(e, chunk, n);
        if (w <= 0)
            return;
        e->sent += (size_t)w;
    }
    if (e->shut)
        return;
    if (e->ssl && e->fin == RELAY_TLS_FIN) {
        if (SSL_shutdown(e->ssl) < 0) {
            ERR_clear_error();
            return;
        }
    } else {
        shutdown(e->fd, SHUT_WR);
    }
    e->shut = 1;
}

static void end_step(struct end *e)
{
    char buf[16384];
    ssize_t n;
    int r;
    while (!e->eof && (r = end_read(e, buf, sizeof buf, &n)) != 0) {
        if (r < 0) {
            e->eof = 1;
            break;
        }
        for (ssize_t i = 0; i < n; i++)
            if ((unsigned char)buf[i] != pattern(e->got + (size_t)i, e->salt_in))
                e->bad = 1;
        e->got += (size_t)n;
    }
    if (e->send_first || e->eof)
        end_send(e);
}

static int end_over(const struct end *e, size_t want)
{
    return e->shut && e->eof && e->got == want;
}

static short want_out(const struct end *e)
{
    return (e->send_first || e->eof) && !e->shut ? POLLOUT : 0;
}

/* Relays `size` bytes each way through an established link: the client
 * first (client_first) or the worker first; returns 1 when all went
 * across intact, both ways ended, and the relay said it was over. The
 * relay is called as the manager calls it: for the socket whose event
 * came (a way left waiting for what never comes would stall here). */
static int relay_run(struct link *l, int client_first, int fin, size_t size, int *stalls)
{
    int sp[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sp) < 0)
        loopback_die("socketpair");
    struct end cl = { .ssl = l->cl, .fd = l->cfd, .fin = fin, .to_send = size,
                      .salt_out = 1, .salt_in = 2, .send_first = client_first };
    struct end wk = { .ssl = NULL, .fd = sp[1], .to_send = size,
                      .salt_out = 2, .salt_in = 1, .send_first = !client_first };
    int mask = -1, ready = NW_TLS_READY_ALL;
    time_t start = time(NULL);
    *stalls = 0;
    while (time(NULL) - start < 30 && !(mask == 0 && end_over(&cl, size) && end_over(&wk, size))) {
        end_step(&cl);
        end_step(&wk);
        if (mask != 0 && ready)
            mask = nw_tls_relay(l->sc, sp[0], ready);
        if (mask == 0 && end_over(&cl, size) && end_over(&wk, size))
            break;
        struct pollfd p[4] = {
            { .fd = l->cfd, .events = POLLIN | want_out(&cl) },
            { .fd = sp[1], .events = POLLIN | want_out(&wk) },
            { .fd = l->sfd, .events = (mask & NW_TLS_WAIT_TCP_READ ? POLLIN : 0)
                                      | (mask & NW_TLS_WAIT_TCP_WRITE ? POLLOUT : 0) },
            { .fd = sp[0], .events = (mask & NW_TLS_WAIT_PAIR_READ ? POLLIN : 0)
                                     | (mask & NW_TLS_WAIT_PAIR_WRITE ? POLLOUT : 0) },
        };
        if (mask <= 0)
            p[2].fd = p[3].fd = -1;
        if (poll(p, 4, 200) == 0)
            ++*stalls;
        ready = (p[2].fd >= 0 && p[2].revents ? NW_TLS_READY_TCP : 0)
                | (p[3].fd >= 0 && p[3].revents ? NW_TLS_READY_PAIR : 0);
    }
    close(sp[0]);
    close(sp[1]);
    if (cl.bad || wk.bad || cl.got != size || wk.got != size || mask != 0)
        diag("client got %zu bad %d eof %d, worker got %zu bad %d eof %d, mask %d, reason %s",
             cl.got, cl.bad, cl.eof, wk.got, wk.bad, wk.eof, mask,
             nw_tls_reason_name(nw_tls_conn_reason(l->sc)));
    return !cl.bad && !wk.bad && end_over(&cl, size) && end_over(&wk, size) && mask == 0
           && nw_tls_conn_reason(l->sc) == NW_TLS_R_NONE;
}

static void test_relay(struct nw_tls_ctx *t, int client_first, int fin, size_t size, const char *name)
{
    struct link l;
    int stalls;
    SSL_CTX *cc = client_ctx(0, 0, NULL, "\x08http/1.1");
    link_up(&l, cc, t, NULL);
    if (l.h.server != NW_TLS_DONE || l.h.client != 1)
        diag("handshake: server %d client %d", l.h.server, l.h.client);
    ok(relay_run(&l, client_first, fin, size, &stalls), name);
    is(stalls, 0, "... never waiting for what it did not say");
    link_down(&l);
    SSL_CTX_free(cc);
}

/* Handshakes whose server steps run in the pool's threads, as the
 * manager runs them: a step given, the socket left alone until the job
 * is back, given again while it wants more. */
enum { POOLED = 16 };

struct pooled {
    int cfd, sfd, client, server, out;
    SSL *cl;
    struct nw_tls_conn *sc;
    nw_tls_job job;
};

static int pooled_over(const struct pooled *k)
{
    for (int i = 0; i < POOLED; i++)
        if (k[i].client != 1 || k[i].server != 1)
            return 0;
    return 1;
}

static void pooled_client_steps(struct pooled *k)
{
    for (int i = 0; i < POOLED; i++) {
        if (k[i].client)
            continue;
        int r = SSL_do_handshake(k[i].cl);
        if (r == 1)
            k[i].client = 1;
        else if (SSL_get_error(k[i].cl, r) != SSL_ERROR_WANT_READ
                 && SSL_get_error(k[i].cl, r) != SSL_ERROR_WANT_WRITE)
            k[i].client = -1;
        ERR_clear_error();
    }
}

static void pooled_take(struct nw_tls_pool *p, struct pooled *k)
{
    for (nw_tls_job *j = nw_tls_pool_done(p); j; j = j->next) {
        struct pooled *one = (struct pooled *)((char *)j - offsetof(struct pooled, job));
        one->out = 0;
        if (j->step == NW_TLS_DONE)
            one->server = 1;
        else if (!step_pending(j->step))
            one->server = -1;
    }
    for (int i = 0; i < POOLED; i++)
        if (!k[i].server && !k[i].out) {
            k[i].out = 1;
            nw_tls_pool_submit(p, &k[i].job);
        }
}

static void test_pool(struct nw_tls_ctx *t)
{
    char err[256] = "";
    struct pooled k[POOLED];
    ok(nw_tls_pool_new(0, err, sizeof err) == NULL && strstr(err, "not between"),
       "a pool of no threads is refused");
    struct nw_tls_pool *p = nw_tls_pool_new(3, err, sizeof err);
    if (!ok(p != NULL, "a pool of 3 handshake threads")) {
        diag("%s", err);
        return;
    }
    SSL_CTX *cc = client_ctx(0, 0, NULL, NULL);
    memset(k, 0, sizeof k);
    for (int i = 0; i < POOLED; i++) {
        tcp_pair(&k[i].cfd, &k[i].sfd);
        k[i].cl = SSL_new(cc);
        SSL_set_fd(k[i].cl, k[i].cfd);
        SSL_set_connect_state(k[i].cl);
        k[i].sc = nw_tls_conn_new(t, k[i].sfd);
        k[i].job.tls = k[i].sc;
    }
    time_t start = time(NULL);
    while (!pooled_over(k) && time(NULL) - start < 20) {
        pooled_client_steps(k);
        pooled_take(p, k);
        struct pollfd w = { .fd = nw_tls_pool_fd(p), .events = POLLIN };
        poll(&w, 1, 5);
    }
    ok(pooled_over(k), "16 handshakes at once, their server steps in the threads");
    /* a job still waiting when the pool stops is not run, and stays the owner's */
    int cfd, sfd;
    tcp_pair(&cfd, &sfd);
    struct nw_tls_conn *idle = nw_tls_conn_new(t, sfd);
    nw_tls_job j = { .tls = idle };
    nw_tls_pool_submit(p, &j);
    nw_tls_pool_free(p);
    is(nw_tls_handshake(idle), NW_TLS_WANT_READ,
       "the pool stops with a job given; its connection is the owner's again");
    nw_tls_conn_free(idle);
    close(cfd);
    close(sfd);
    for (int i = 0; i < POOLED; i++) {
        SSL_free(k[i].cl);
        nw_tls_conn_free(k[i].sc);
        close(k[i].cfd);
        close(k[i].sfd);
    }
    SSL_CTX_free(cc);
    ERR_clear_error();
}

/* The probe says what the kernel lists once asked: asking for the tls
 * module loads it where it can be loaded. */
static void test_ktls_probe(void)
{
    char why[256] = "", ulps[256] = "";
    int offered = nw_ktls_offered(why, sizeof why);
    FILE *f = fopen("/proc/sys/net/ipv4/tcp_available_ulp", "r");
    if (f) {
        if (!fgets(ulps, sizeof ulps, f))
            ulps[0] = 0;
        ulps[strcspn(ulps, "\n")] = 0;
        fclose(f);
    }
    int listed = strstr(ulps, "tls") != NULL;
    ok(!f || offered == listed, "kTLS probe: offered exactly when the kernel lists tls");
    diag("kTLS probe: %s (the kernel lists: %s)", why, f ? ulps : "unknown");
    ok(strstr(why, offered ? "offered" : "kTLS") != NULL, "... and says so");
}

int main(void)
{
    char err[512] = "";
    signal(SIGPIPE, SIG_IGN);    /* (as the manager does) */
    make_certs();
    listener = loopback_listener(&laddr);
    test_files();
    test_ktls_probe();
    struct nw_tls_ctx *t = nw_tls_ctx_new(cert, key, err, sizeof err);
    if (!ok(t != NULL, "a context from a P-256 certificate and its key"))
        diag("%s", err);
    if (!t) {
        remove_certs();
        return done_testing();
    }
    SSL_CTX *cc = client_ctx(0, 0, NULL, NULL);
    test_reload(t, cc);
    SSL_CTX_free(cc);
    test_handshakes(t);
    test_refusals(t);
    test_not_tls(t);
    test_pool(t);
    test_tickets(t, TLS1_3_VERSION, "TLS 1.3");
    test_tickets(t, TLS1_2_VERSION, "TLS 1.2");
    test_relay(t, 1, RELAY_TLS_FIN, 1 << 20,
               "relay: 1 MB up, close_notify, then 1 MB down and the worker's end");
    test_relay(t, 0, RELAY_TLS_FIN, 1 << 20,
               "relay: 1 MB down and the worker's end, then 1 MB up and close_notify");
    test_relay(t, 1, RELAY_TCP_FIN, 65536,
               "relay: the client's TCP end without close_notify ends its stream too");
    nw_tls_ctx_free(t);
    close(listener);
    remove_certs();
    return done_testing();
}
