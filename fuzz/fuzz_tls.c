/* libFuzzer harness for the TLS handshake step (src/manager/nw_tls.c): the input
 * is what a client sends on a TLS port, all of it, then the end of its
 * stream. It goes through a socketpair rather than a memory BIO, so that
 * the path the server takes is the real one: the MSG_PEEK of the first
 * byte, then OpenSSL reading the socket. The handshake is stepped until it
 * stops waiting; what the server sends back is drained and dropped.
 * Invariants (abort): it ends, as PLAIN exactly when the first byte is not
 * 0x16, FAILED with a reason, or DONE (never, from one flight).
 * The certificate is made in memory at the first input (P-256, written to
 * temporary files for nw_tls_ctx_new, which reads files).
 * FUZZ_TLS_VERBOSE=1 in the environment says what each input came to. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include "nw_tls.h"

static struct nw_tls_ctx *ctx;

static void free_ctx(void)
{
    nw_tls_ctx_free(ctx);
}

/* A self-signed P-256 certificate and its key, written to cert and key. */
static int write_pair(FILE *cert, FILE *key)
{
    EVP_PKEY *pk = EVP_EC_gen("P-256");
    X509 *x = X509_new();
    int ok = pk && x;
    if (ok) {
        X509_set_version(x, 2);
        ASN1_INTEGER_set(X509_get_serialNumber(x), 1);
        X509_gmtime_adj(X509_getm_notBefore(x), 0);
        X509_gmtime_adj(X509_getm_notAfter(x), 86400);
        X509_NAME_add_entry_by_txt(X509_get_subject_name(x), "CN", MBSTRING_ASC,
                                   (const unsigned char *)"fuzz", -1, -1, 0);
        X509_set_issuer_name(x, X509_get_subject_name(x));
        ok = X509_set_pubkey(x, pk) == 1 && X509_sign(x, pk, EVP_sha256()) > 0
             && PEM_write_X509(cert, x) == 1
             && PEM_write_PrivateKey(key, pk, NULL, NULL, 0, NULL, NULL) == 1;
    }
    X509_free(x);
    EVP_PKEY_free(pk);
    return ok ? 0 : -1;
}

static struct nw_tls_ctx *make_ctx(void)
{
    char cert[] = "/tmp/fuzz-tls-cert-XXXXXX", key[] = "/tmp/fuzz-tls-key-XXXXXX", err[256];
    int cfd = mkstemp(cert), kfd = mkstemp(key);
    FILE *cf = cfd >= 0 ? fdopen(cfd, "w") : NULL, *kf = kfd >= 0 ? fdopen(kfd, "w") : NULL;
    if (!cf || !kf || write_pair(cf, kf) < 0)
        abort();
    fclose(cf);
    fclose(kf);
    struct nw_tls_ctx *t = nw_tls_ctx_new(cert, key, err, sizeof err);
    unlink(cert);
    unlink(key);
    if (!t) {
        fprintf(stderr, "fuzz_tls: %s\n", err);
        abort();
    }
    atexit(free_ctx);
    return t;
}

static void drain(int fd)
{
    char buf[4096];
    while (read(fd, buf, sizeof buf) > 0)
        ;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int sv[2];
    if (!ctx)
        ctx = make_ctx();
    if (size > 65536)    /* (what a socketpair holds at once) */
        return 0;
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv) < 0)
        abort();
    if (size && write(sv[1], data, size) != (ssize_t)size)
        abort();
    shutdown(sv[1], SHUT_WR);
    struct nw_tls_conn *c = nw_tls_conn_new(ctx, sv[0]);
    if (!c)
        abort();
    enum nw_tls_step s = NW_TLS_WANT_READ;
    for (int i = 0; i < 1000 && (s == NW_TLS_WANT_READ || s == NW_TLS_WANT_WRITE); i++) {
        s = nw_tls_handshake(c);
        drain(sv[1]);
    }
    enum nw_tls_reason r = nw_tls_conn_reason(c);
    if (s == NW_TLS_WANT_READ || s == NW_TLS_WANT_WRITE || s == NW_TLS_DONE)
        abort();    /* (one flight and its end cannot finish a handshake) */
    if ((s == NW_TLS_PLAIN) != (size > 0 && data[0] != 0x16))
        abort();
    if (s == NW_TLS_FAILED && (r == NW_TLS_R_NONE || r == NW_TLS_R_PLAIN || r >= NW_TLS_R_COUNT))
        abort();
    if (strlen(nw_tls_reason_name(r)) == 0)
        abort();
    if (getenv("FUZZ_TLS_VERBOSE"))    /* (what each seed comes to) */
        fprintf(stderr, "%zu bytes: %s, %s\n", size, s == NW_TLS_PLAIN ? "plain" : "failed",
                nw_tls_reason_name(r));
    nw_tls_conn_free(c);
    close(sv[0]);
    close(sv[1]);
    return 0;
}
