/* The TLS part's core: context, handshake, relay (nw_tls.h). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "nw_tls.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/core_names.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

/* Mozilla's "intermediate" TLS 1.2 list without its DHE suites: forward
 * secrecy through ECDHE only, AEAD ciphers only. TLS 1.3 keeps
 * OpenSSL's defaults (all three are AEAD). */
#define NW_TLS12_CIPHERS                                                  \
    "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:"          \
    "ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384:"          \
    "ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305"

/* One session-ticket key: its name travels in the ticket. */
struct nw_tls_ticket_key {
    unsigned char name[16];
    unsigned char aes[32];     /* AES-256-CBC */
    unsigned char hmac[32];    /* HMAC-SHA256 */
};

struct nw_tls_ctx {
    pthread_mutex_t lock;      /* ssl (reload) and the keys (rotation) */
    SSL_CTX *ssl;
    struct nw_tls_ticket_key keys[2];   /* [0] current, [1] previous */
    int have_previous;
};

/* A relay buffer: data[off .. off+len) waits to be written; data is
 * allocated while it holds something. */
struct nw_tls_buf {
    char *data;
    size_t off, len;
};

struct nw_tls_conn {
    SSL *ssl;
    int fd;
    int sniffed;               /* the first byte was a handshake record */
    enum nw_tls_reason reason;
    struct nw_tls_buf up;      /* client -> worker (SSL_read -> pair) */
    struct nw_tls_buf down;    /* worker -> client (pair -> SSL_write) */
    int up_eof;                /* the client's stream ended */
    int up_done;               /* ... and the pair was told (SHUT_WR) */
    int down_eof;              /* the worker's stream ended */
    int down_done;             /* ... close_notify sent, TCP SHUT_WR */
    int up_wait, down_wait;    /* what each way waited for when it last ran */
};

/* ---- Errors ---- */

__attribute__((format(printf, 3, 4)))
static void say(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    if (!err || !errlen)
        return;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* OpenSSL's reason for its first (deepest) queued error, or a default;
 * clears the queue. */
static const char *ssl_reason(const char *fallback)
{
    unsigned long e = ERR_peek_error();
    const char *r = e ? ERR_reason_error_string(e) : NULL;
    ERR_clear_error();
    return r ? r : fallback;
}

/* OpenSSL's error queue, taken (it is left empty): up to 8 errors, the
 * first (deepest) first. */
struct nw_tls_errs {
    unsigned long e[8];
    int n;
};

static void take_errors(struct nw_tls_errs *q)
{
    unsigned long e;
    q->n = 0;
    while ((e = ERR_get_error()))
        if (q->n < 8)
            q->e[q->n++] = e;
}

static int has_error(const struct nw_tls_errs *q, int lib, int reason)
{
    for (int i = 0; i < q->n; i++)
        if (ERR_GET_LIB(q->e[i]) == lib && ERR_GET_REASON(q->e[i]) == reason)
            return 1;
    return 0;
}

static const char *first_reason(const struct nw_tls_errs *q)
{
    const char *r = q->n ? ERR_reason_error_string(q->e[0]) : NULL;
    return r ? r : "unknown error";
}

/* ---- Context ---- */

/* A file we can open for reading, else the one-line reason. */
static int readable(const char *what, const char *file, char *err, size_t errlen)
{
    struct stat st;
    FILE *f = fopen(file, "r");
    if (f && fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) {
        fclose(f);
        f = NULL;
        errno = EISDIR;
    }
    if (!f) {
        say(err, errlen, "cannot read %s file %s: %s", what, file, strerror(errno));
        return -1;
    }
    fclose(f);
    return 0;
}

/* No passphrase is asked for: an encrypted key fails to load. */
static int no_passphrase(char *buf, int size, int rwflag, void *u)
{
    (void)buf, (void)size, (void)rwflag, (void)u;
    return -1;
}

static int load_cert(SSL_CTX *s, const char *file, char *err, size_t errlen)
{
    struct nw_tls_errs q;
    if (readable("certificate", file, err, errlen) < 0)
        return -1;
    ERR_clear_error();
    if (SSL_CTX_use_certificate_chain_file(s, file) == 1)
        return 0;
    take_errors(&q);
    if (has_error(&q, ERR_LIB_PEM, PEM_R_NO_START_LINE))
        say(err, errlen, "no certificate in %s", file);
    else
        say(err, errlen, "bad certificate file %s: %s", file, first_reason(&q));
    return -1;
}

/* What the PEM blocks of a key file hold: 0 no private key, 1 a private
 * key, 2 an encrypted one. (OpenSSL 3's decoders say "unsupported" for
 * all three alike when the key does not load.) */
static int pem_key_kind(const char *file)
{
    BIO *b = BIO_new_file(file, "r");
    char *name = NULL, *header = NULL;
    unsigned char *data = NULL;
    long len;
    int kind = 0;
    while (b && !kind && PEM_read_bio(b, &name, &header, &data, &len) == 1) {
        size_t n = strlen(name);
        if (n >= 11 && strcmp(name + n - 11, "PRIVATE KEY") == 0)
            kind = strstr(name, "ENCRYPTED") || strstr(header, "ENCRYPTED") ? 2 : 1;
        OPENSSL_free(name), OPENSSL_free(header), OPENSSL_free(data);
    }
    BIO_free(b);
    ERR_clear_error();
    return kind;
}

static int load_key(SSL_CTX *s, const char *cert, const char *file, char *err, size_t errlen)
{
    struct nw_tls_errs q;
    int kind;
    if (readable("key", file, err, errlen) < 0)
        return -1;
    ERR_clear_error();
    if (SSL_CTX_use_PrivateKey_file(s, file, SSL_FILETYPE_PEM) == 1
        && SSL_CTX_check_private_key(s) == 1)
        return 0;
    take_errors(&q);
    if (has_error(&q, ERR_LIB_X509, X509_R_KEY_VALUES_MISMATCH)
        || has_error(&q, ERR_LIB_X509, X509_R_KEY_TYPE_MISMATCH)
        || has_error(&q, ERR_LIB_SSL, SSL_R_NO_PRIVATE_KEY_ASSIGNED))
        say(err, errlen, "the key in %s does not match the certificate in %s", file, cert);
    else if ((kind = pem_key_kind(file)) == 0)
        say(err, errlen, "no private key in %s", file);
    else if (kind == 2)
        say(err, errlen, "the key in %s is encrypted (a passphrase is not supported)", file);
    else
        say(err, errlen, "bad key file %s: %s", file, first_reason(&q));
    return -1;
}

/* ALPN: http/1.1 when the client offers it. A client offering only
 * other protocols (only h2, say) gets no ALPN answer rather than a
 * failed handshake (SSL_TLSEXT_ERR_NOACK, not ALERT_FATAL): it learns
 * that what it asked for is not spoken and may carry on in HTTP/1.1 or
 * close; refusing would cost it the handshake for nothing and leave
 * only a count in the server's metrics. */
static int select_alpn(SSL *s, const unsigned char **out, unsigned char *outlen,
                       const unsigned char *in, unsigned int inlen, void *arg)
{
    static const unsigned char ours[] = "\x08http/1.1";
    unsigned char *sel;
    (void)s, (void)arg;
    if (SSL_select_next_proto(&sel, outlen, ours, sizeof ours - 1, in, inlen)
        != OPENSSL_NPN_NEGOTIATED)
        return SSL_TLSEXT_ERR_NOACK;
    *out = sel;
    return SSL_TLSEXT_ERR_OK;
}

static int ticket_key_cb(SSL *s, unsigned char name[16], unsigned char *iv,
                         EVP_CIPHER_CTX *cctx, EVP_MAC_CTX *hctx, int enc);

/* The policy: TLS 1.2 and 1.3, the cipher list above with the server's
 * order (ChaCha20 first for a client that puts it first: phones without
 * AES instructions), no renegotiation, no compression, buffers released
 * while idle, stateless tickets (no server-side session cache). A
 * client's TCP end without close_notify ends its stream as close_notify
 * does (SSL_OP_IGNORE_UNEXPECTED_EOF): the answer still goes out (many
 * clients close so), and a request cut short is seen as one by HTTP's
 * own framing (Content-Length, chunked), as on plain TCP. */
static SSL_CTX *ssl_ctx_new(struct nw_tls_ctx *t, const char *cert, const char *key,
                            char *err, size_t errlen)
{
    SSL_CTX *s = SSL_CTX_new(TLS_server_method());
    if (!s) {
        say(err, errlen, "TLS context: %s", ssl_reason("out of memory"));
        return NULL;
    }
    SSL_CTX_set_min_proto_version(s, TLS1_2_VERSION);
    SSL_CTX_set_max_proto_version(s, TLS1_3_VERSION);
    SSL_CTX_set_options(s, SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION
                           | SSL_OP_CIPHER_SERVER_PREFERENCE | SSL_OP_PRIORITIZE_CHACHA
                           | SSL_OP_IGNORE_UNEXPECTED_EOF);
    SSL_CTX_clear_options(s, SSL_OP_NO_TICKET);
    SSL_CTX_set_mode(s, SSL_MODE_RELEASE_BUFFERS | SSL_MODE_ENABLE_PARTIAL_WRITE
                        | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    SSL_CTX_set_read_ahead(s, 1);  /* (a record's header and body in one read(2)) */
    SSL_CTX_set_session_cache_mode(s, SSL_SESS_CACHE_OFF);
    SSL_CTX_set_default_passwd_cb(s, no_passphrase);
    SSL_CTX_set_alpn_select_cb(s, select_alpn, NULL);
    SSL_CTX_set_app_data(s, t);
    if (SSL_CTX_set_cipher_list(s, NW_TLS12_CIPHERS) != 1
        || SSL_CTX_set_tlsext_ticket_key_evp_cb(s, ticket_key_cb) != 1) {
        say(err, errlen, "TLS policy: %s", ssl_reason("refused"));
        SSL_CTX_free(s);
        return NULL;
    }
    if (load_cert(s, cert, err, errlen) < 0 || load_key(s, cert, key, err, errlen) < 0) {
        SSL_CTX_free(s);
        return NULL;
    }
    return s;
}

static int new_ticket_key(struct nw_tls_ticket_key *k)
{
    return RAND_bytes((unsigned char *)k, sizeof *k) == 1 ? 0 : -1;
}

struct nw_tls_ctx *nw_tls_ctx_new(const char *cert_file, const char *key_file,
                                  char *err, size_t errlen)
{
    struct nw_tls_ctx *t = calloc(1, sizeof *t);
    if (!t) {
        say(err, errlen, "TLS context: out of memory");
        return NULL;
    }
    if (new_ticket_key(&t->keys[0]) < 0) {
        say(err, errlen, "TLS ticket key: %s", ssl_reason("no randomness"));
        free(t);
        return NULL;
    }
    if (!(t->ssl = ssl_ctx_new(t, cert_file, key_file, err, errlen))) {
        OPENSSL_cleanse(t->keys, sizeof t->keys);
        free(t);
        return NULL;
    }
    pthread_mutex_init(&t->lock, NULL);
    return t;
}

int nw_tls_ctx_reload(struct nw_tls_ctx *t, const char *cert_file, const char *key_file,
                      char *err, size_t errlen)
{
    SSL_CTX *fresh = ssl_ctx_new(t, cert_file, key_file, err, errlen), *old;
    if (!fresh)
        return -1;
    pthread_mutex_lock(&t->lock);
    old = t->ssl;
    t->ssl = fresh;
    pthread_mutex_unlock(&t->lock);
    SSL_CTX_free(old);    /* (connections made from it hold references) */
    return 0;
}

int nw_tls_ctx_rotate_ticket_key(struct nw_tls_ctx *t)
{
    struct nw_tls_ticket_key k;
    if (new_ticket_key(&k) < 0) {
        ERR_clear_error();
        return -1;
    }
    pthread_mutex_lock(&t->lock);
    t->keys[1] = t->keys[0];
    t->keys[0] = k;
    t->have_previous = 1;
    pthread_mutex_unlock(&t->lock);
    OPENSSL_cleanse(&k, sizeof k);
    return 0;
}

void nw_tls_ctx_free(struct nw_tls_ctx *t)
{
    if (!t)
        return;
    SSL_CTX_free(t->ssl);
    pthread_mutex_destroy(&t->lock);
    OPENSSL_cleanse(t->keys, sizeof t->keys);
    free(t);
}

/* Which key a ticket names: 0 current, 1 previous, -1 none; a copy of it
 * in *k (taken under the lock: a rotation may run in another thread). */
static int find_ticket_key(struct nw_tls_ctx *t, const unsigned char *name,
                           struct nw_tls_ticket_key *k)
{
    int which = -1;
    pthread_mutex_lock(&t->lock);
    if (!name)
        which = 0;
    else if (memcmp(name, t->keys[0].name, 16) == 0)
        which = 0;
    else if (t->have_previous && memcmp(name, t->keys[1].name, 16) == 0)
        which = 1;
    if (which >= 0)
        *k = t->keys[which];
    pthread_mutex_unlock(&t->lock);
    return which;
}

static int ticket_hmac_init(EVP_MAC_CTX *hctx, struct nw_tls_ticket_key *k)
{
    OSSL_PARAM params[] = {
        OSSL_PARAM_construct_octet_string(OSSL_MAC_PARAM_KEY, k->hmac, sizeof k->hmac),
        OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, (char *)"SHA256", 0),
        OSSL_PARAM_construct_end(),
    };
    return EVP_MAC_CTX_set_params(hctx, params) == 1 ? 0 : -1;
}

/* OpenSSL's ticket callback. Encrypting (enc 1): name, IV and keys of
 * the current key; returns 1, or -1 on failure. Decrypting: 1 for the
 * current key, 2 for the previous (use it, and issue a new ticket under
 * the current one), 0 for a key we no longer have (a full handshake). */
static int ticket_key_cb(SSL *s, unsigned char name[16], unsigned char *iv,
                         EVP_CIPHER_CTX *cctx, EVP_MAC_CTX *hctx, int enc)
{
    struct nw_tls_ctx *t = SSL_CTX_get_app_data(SSL_get_SSL_CTX(s));
    struct nw_tls_ticket_key k;
    int which = find_ticket_key(t, enc ? NULL : name, &k), ok;
    if (which < 0)
        return 0;
    if (enc) {
        memcpy(name, k.name, 16);
        ok = RAND_bytes(iv, 16) == 1
             && EVP_EncryptInit_ex(cctx, EVP_aes_256_cbc(), NULL, k.aes, iv) == 1;
    } else {
        ok = EVP_DecryptInit_ex(cctx, EVP_aes_256_cbc(), NULL, k.aes, iv) == 1;
    }
    ok = ok && ticket_hmac_init(hctx, &k) == 0;
    OPENSSL_cleanse(&k, sizeof k);
    if (!ok)
        return -1;
    return which == 0 ? 1 : 2;
}

/* ---- Handshake ---- */

static const char *const reason_names[NW_TLS_R_COUNT] = {
    [NW_TLS_R_NONE] = "none",           [NW_TLS_R_PLAIN] = "plain_http",
    [NW_TLS_R_VERSION] = "version",     [NW_TLS_R_CIPHER] = "cipher",
    [NW_TLS_R_GARBAGE] = "garbage",     [NW_TLS_R_CLOSED] = "closed",
    [NW_TLS_R_CERT_REFUSED] = "certificate_refused",
    [NW_TLS_R_TIMEOUT] = "timeout",     [NW_TLS_R_OTHER] = "other",
};

const char *nw_tls_reason_name(enum nw_tls_reason r)
{
    return (unsigned)r < NW_TLS_R_COUNT ? reason_names[r] : "other";
}

const char *nw_tls_plain_400(size_t *len)
{
    static const char answer[] =
        "HTTP/1.1 400 Bad Request\r\n"
        "Content-Type: text/plain\r\n"
        "Content-Length: 49\r\n"
        "Connection: close\r\n"
        "\r\n"
        "This port speaks HTTPS: use https:// to reach it\n";
    *len = sizeof answer - 1;
    return answer;
}

struct nw_tls_conn *nw_tls_conn_new(struct nw_tls_ctx *t, int fd)
{
    struct nw_tls_conn *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    pthread_mutex_lock(&t->lock);
    c->ssl = SSL_new(t->ssl);
    pthread_mutex_unlock(&t->lock);
    if (!c->ssl || SSL_set_fd(c->ssl, fd) != 1) {
        SSL_free(c->ssl);
        ERR_clear_error();
        free(c);
        return NULL;
    }
    SSL_set_accept_state(c->ssl);
    c->fd = fd;
    c->up_wait = c->down_wait = NW_TLS_READY_ALL;     /* (both ways run at first) */
    return c;
}

void nw_tls_conn_free(struct nw_tls_conn *c)
{
    if (!c)
        return;
    SSL_free(c->ssl);
    free(c->up.data);
    free(c->down.data);
    free(c);
}

enum nw_tls_reason nw_tls_conn_reason(const struct nw_tls_conn *c)
{
    return c->reason;
}

int nw_tls_conn_begun(const struct nw_tls_conn *c)
{
    return !SSL_in_before(c->ssl);
}

int nw_tls_conn_resumed(const struct nw_tls_conn *c)
{
    return SSL_session_reused(c->ssl) ? 1 : 0;
}

/* The reason an OpenSSL library error stands for. */
static enum nw_tls_reason reason_of_ssl_error(unsigned long e)
{
    if (ERR_GET_LIB(e) != ERR_LIB_SSL)
        return NW_TLS_R_OTHER;
    switch (ERR_GET_REASON(e)) {
    case SSL_R_UNSUPPORTED_PROTOCOL: case SSL_R_VERSION_TOO_LOW:
    case SSL_R_TLSV1_ALERT_PROTOCOL_VERSION: case SSL_R_BAD_PROTOCOL_VERSION_NUMBER:
    case SSL_R_TLSV1_ALERT_INAPPROPRIATE_FALLBACK: case SSL_R_INAPPROPRIATE_FALLBACK:
        return NW_TLS_R_VERSION;
    case SSL_R_NO_SHARED_CIPHER: case SSL_R_NO_SHARED_GROUPS:
    case SSL_R_NO_SUITABLE_SIGNATURE_ALGORITHM: case SSL_R_NO_SHARED_SIGNATURE_ALGORITHMS:
    case SSL_R_NO_CIPHERS_AVAILABLE: case SSL_R_NO_SUITABLE_KEY_SHARE:
    case SSL_R_SSLV3_ALERT_HANDSHAKE_FAILURE: case SSL_R_TLSV1_ALERT_INSUFFICIENT_SECURITY:
        return NW_TLS_R_CIPHER;
    case SSL_R_UNEXPECTED_EOF_WHILE_READING:
        return NW_TLS_R_CLOSED;
    case SSL_R_SSLV3_ALERT_BAD_CERTIFICATE: case SSL_R_SSLV3_ALERT_CERTIFICATE_UNKNOWN:
    case SSL_R_SSLV3_ALERT_CERTIFICATE_EXPIRED: case SSL_R_SSLV3_ALERT_CERTIFICATE_REVOKED:
    case SSL_R_SSLV3_ALERT_UNSUPPORTED_CERTIFICATE: case SSL_R_TLSV1_ALERT_UNKNOWN_CA:
    case SSL_R_TLSV1_ALERT_ACCESS_DENIED:
        return NW_TLS_R_CERT_REFUSED;
    case SSL_R_WRONG_VERSION_NUMBER: case SSL_R_PACKET_LENGTH_TOO_LONG:
    case SSL_R_RECORD_LENGTH_MISMATCH: case SSL_R_LENGTH_MISMATCH: case SSL_R_BAD_PACKET_LENGTH:
    case SSL_R_BAD_LENGTH: case SSL_R_LENGTH_TOO_SHORT: case SSL_R_LENGTH_TOO_LONG:
    case SSL_R_UNEXPECTED_MESSAGE: case SSL_R_UNEXPECTED_RECORD: case SSL_R_BAD_PACKET:
    case SSL_R_HTTP_REQUEST: case SSL_R_HTTPS_PROXY_REQUEST: case SSL_R_ENCRYPTED_LENGTH_TOO_LONG:
    case SSL_R_EXCESSIVE_MESSAGE_SIZE: case SSL_R_BAD_EXTENSION: case SSL_R_BAD_RECORD_TYPE:
    case SSL_R_UNKNOWN_PROTOCOL: case SSL_R_DECRYPTION_FAILED_OR_BAD_RECORD_MAC:
    case SSL_R_BAD_HANDSHAKE_LENGTH: case SSL_R_NO_COMPRESSION_SPECIFIED:
    case SSL_R_BAD_DECOMPRESSION: case SSL_R_UNKNOWN_ALERT_TYPE: case SSL_R_BAD_KEY_SHARE:
    case SSL_R_BAD_HELLO_REQUEST: case SSL_R_DATA_LENGTH_TOO_LONG: case SSL_R_TOO_MANY_WARN_ALERTS:
    case SSL_R_RECORD_TOO_SMALL: case SSL_R_BAD_CIPHER: case SSL_R_MISSING_SIGALGS_EXTENSION:
    case SSL_R_BAD_LEGACY_VERSION: case SSL_R_BAD_PSK_IDENTITY: case SSL_R_DUPLICATE_COMPRESSION_ID:
    case SSL_R_SSLV3_ALERT_DECOMPRESSION_FAILURE: case SSL_R_TLSV1_ALERT_DECODE_ERROR:
    case SSL_R_SSLV3_ALERT_ILLEGAL_PARAMETER: case SSL_R_SSLV3_ALERT_UNEXPECTED_MESSAGE:
    case SSL_R_SSLV3_ALERT_BAD_RECORD_MAC: case SSL_R_SSLV3_ALERT_NO_CERTIFICATE:
        return NW_TLS_R_GARBAGE;
    default:
        return NW_TLS_R_OTHER;
    }
}

/* The reason a failed SSL call (ret, SSL_get_error's code) stands for;
 * clears the error queue. */
static enum nw_tls_reason reason_of(int code)
{
    int saved = errno;
    unsigned long e = ERR_peek_error();
    enum nw_tls_reason r;
    if (code == SSL_ERROR_ZERO_RETURN)
        r = NW_TLS_R_CLOSED;
    else if (code == SSL_ERROR_SYSCALL && !e)
        r = saved == 0 || saved == ECONNRESET || saved == EPIPE ? NW_TLS_R_CLOSED
                                                                : NW_TLS_R_OTHER;
    else
        r = reason_of_ssl_error(e);
    ERR_clear_error();
    return r;
}

static enum nw_tls_step failed(struct nw_tls_conn *c, enum nw_tls_reason r)
{
    c->reason = r;
    return NW_TLS_FAILED;
}

/* The first byte, looked at and left in place: a TLS handshake record
 * goes on to OpenSSL, anything else is plain (an SSLv2-format hello
 * too: no client of that age speaks TLS 1.2). */
static enum nw_tls_step sniff(struct nw_tls_conn *c)
{
    unsigned char b;
    ssize_t n = recv(c->fd, &b, 1, MSG_PEEK);
    if (n == 1 && b == 0x16) {
        c->sniffed = 1;
        return NW_TLS_DONE;
    }
    if (n == 1) {
        c->reason = NW_TLS_R_PLAIN;
        return NW_TLS_PLAIN;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return NW_TLS_WANT_READ;
    return failed(c, n == 0 || errno == ECONNRESET ? NW_TLS_R_CLOSED : NW_TLS_R_OTHER);
}

enum nw_tls_step nw_tls_handshake(struct nw_tls_conn *c)
{
    if (c->reason != NW_TLS_R_NONE)
        return c->reason == NW_TLS_R_PLAIN ? NW_TLS_PLAIN : NW_TLS_FAILED;
    if (!c->sniffed) {
        enum nw_tls_step s = sniff(c);
        if (s != NW_TLS_DONE)
            return s;
    }
    ERR_clear_error();
    errno = 0;
    int ret = SSL_do_handshake(c->ssl);
    if (ret == 1)
        return NW_TLS_DONE;
    int code = SSL_get_error(c->ssl, ret);
    if (code == SSL_ERROR_WANT_READ)
        return NW_TLS_WANT_READ;
    if (code == SSL_ERROR_WANT_WRITE)
        return NW_TLS_WANT_WRITE;
    return failed(c, reason_of(code));
}

/* ---- Relay ---- */

/* Room for a buffer's next fill (it is empty): allocated on demand. */
static char *buf_room(struct nw_tls_buf *b)
{
    if (!b->data)
        b->data = malloc(NW_TLS_RELAY_BUF);
    b->off = 0;
    return b->data;
}

/* n bytes of b were written: an emptied buffer is given back. */
static void buf_took(struct nw_tls_buf *b, size_t n)
{
    b->off += n;
    b->len -= n;
    if (!b->len) {
        free(b->data);
        b->data = NULL;
        b->off = 0;
    }
}

/* What a failed SSL_read/SSL_write waits for (a NW_TLS_WAIT_ bit), or 0:
 * it did not fail for want of the socket (code in *code). */
static int ssl_wants(SSL *s, int ret, int *code)
{
    *code = SSL_get_error(s, ret);
    if (*code == SSL_ERROR_WANT_READ)
        return NW_TLS_WAIT_TCP_READ;
    if (*code == SSL_ERROR_WANT_WRITE)
        return NW_TLS_WAIT_TCP_WRITE;
    return 0;
}

static int would_block(void)
{
    return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
}

/* The relay failed: both ways are over. */
static int relay_failed(struct nw_tls_conn *c, enum nw_tls_reason r)
{
    c->reason = r == NW_TLS_R_NONE ? NW_TLS_R_OTHER : r;
    c->up_done = c->down_done = 1;
    return 0;
}

/* Client to worker: SSL_read into up, up into the pair; the client's end
 * (close_notify, or the TCP stream's end without one) becomes SHUT_WR of
 * the pair. Returns what it waits for, 0 when this way is over, -1 on
 * failure (reason set). After less than a full record with nothing more
 * decrypted or read ahead, it waits for the socket without asking it
 * again: the caller's epoll is level-triggered, so bytes that came since
 * wake it at once, and a request costs one read(2) rather than two. */
static int relay_up(struct nw_tls_conn *c, int pair)
{
    int drained = 0;
    for (;;) {
        if (!c->up.len && drained)
            return NW_TLS_WAIT_TCP_READ;
        if (c->up.len) {
            ssize_t n = send(pair, c->up.data + c->up.off, c->up.len, MSG_NOSIGNAL);
            if (n < 0 && would_block())
                return NW_TLS_WAIT_PAIR_WRITE;
            if (n < 0) {    /* the worker is gone: drop what the client sends */
                buf_took(&c->up, c->up.len);
                c->up_eof = c->up_done = 1;
                return 0;
            }
            buf_took(&c->up, (size_t)n);
            continue;
        }
        if (c->up_eof) {
            shutdown(pair, SHUT_WR);
            c->up_done = 1;
            return 0;
        }
        char *room = buf_room(&c->up);
        if (!room)
            return (c->reason = NW_TLS_R_OTHER), -1;
        ERR_clear_error();
        errno = 0;
        int ret = SSL_read(c->ssl, room, NW_TLS_RELAY_BUF), code;
        if (ret > 0) {
            c->up.len = (size_t)ret;
            drained = ret < NW_TLS_RELAY_BUF && !SSL_has_pending(c->ssl);
            continue;
        }
        buf_took(&c->up, 0);    /* (gives back the empty buffer) */
        int wait = ssl_wants(c->ssl, ret, &code);
        if (wait)
            return wait;
        enum nw_tls_reason r = reason_of(code);
        if (r != NW_TLS_R_CLOSED)
            return (c->reason = r), -1;
        c->up_eof = 1;
    }
}

/* Worker to client: the pair into down, down into SSL_write; the pair's
 * end becomes close_notify, then SHUT_WR of the TCP socket. Returns as
 * relay_up does (a short recv(2) of the pair: it waits without asking
 * again). */
static int relay_down(struct nw_tls_conn *c, int pair)
{
    int drained = 0;
    for (;;) {
        int code;
        if (!c->down.len && drained)
            return NW_TLS_WAIT_PAIR_READ;
        if (c->down.len) {
            ERR_clear_error();
            errno = 0;
            int ret = SSL_write(c->ssl, c->down.data + c->down.off, (int)c->down.len);
            if (ret > 0) {
                buf_took(&c->down, (size_t)ret);
                continue;
            }
            int wait = ssl_wants(c->ssl, ret, &code);
            return wait ? wait : ((c->reason = reason_of(code)), -1);
        }
        if (c->down_eof) {
            ERR_clear_error();
            int ret = SSL_shutdown(c->ssl);
            if (ret < 0) {
                int wait = ssl_wants(c->ssl, ret, &code);
                if (wait)
                    return wait;
                return (c->reason = reason_of(code)), -1;
            }
            shutdown(c->fd, SHUT_WR);
            c->down_done = 1;
            return 0;
        }
        char *room = buf_room(&c->down);
        if (!room)
            return (c->reason = NW_TLS_R_OTHER), -1;
        ssize_t n = recv(pair, room, NW_TLS_RELAY_BUF, 0);
        if (n > 0) {
            c->down.len = (size_t)n;
            drained = n < NW_TLS_RELAY_BUF;
            continue;
        }
        buf_took(&c->down, 0);
        if (n < 0 && would_block())
            return NW_TLS_WAIT_PAIR_READ;
        c->down_eof = 1;    /* the worker's end (or its reset): close_notify */
    }
}

/* A way runs when what it waited for is ready (at first, both run). */
int nw_tls_relay(struct nw_tls_conn *c, int pair_fd, int ready)
{
    int w;
    if (!c->up_done && (c->up_wait & ready)) {
        if ((w = relay_up(c, pair_fd)) < 0)
            return relay_failed(c, c->reason);
        c->up_wait = w;
    }
    if (!c->down_done && (c->down_wait & ready)) {
        if ((w = relay_down(c, pair_fd)) < 0)
            return relay_failed(c, c->reason);
        c->down_wait = w;
    }
    if (c->up_done && c->down_done)
        return 0;
    return (c->up_done ? 0 : c->up_wait) | (c->down_done ? 0 : c->down_wait);
}
