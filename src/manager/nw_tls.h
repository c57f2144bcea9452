/* The TLS part's core (docs/DESIGN.md, "HTTPS"): the context
 * (certificate pair, policy, session-ticket keys), a connection's
 * non-blocking handshake on an accepted socket, and the relay that copies
 * plaintext between the TLS connection and one end of a socketpair (the
 * "relayed" way). It links OpenSSL (-lssl -lcrypto, inc/NarwhalLink.pm's
 * table of headers that bring linker flags): only what includes this
 * header does, never the XS module nor the workers.
 *
 * Threads: a context is shared by every TLS thread; its ticket keys and
 * reload are guarded by a lock of its own. A connection belongs to one
 * thread at a time. OpenSSL's error queue is per thread and left empty.
 * OpenSSL writes to the TCP socket with write(2): the process ignores
 * SIGPIPE (the manager does). */
#ifndef NW_TLS_H
#define NW_TLS_H

#include <stddef.h>

struct nw_tls_ctx;
struct nw_tls_conn;

/* ---- Context ---- */

/* A context from a PEM certificate chain file (the server's certificate
 * first) and a PEM private key file. Returns NULL on failure with a
 * one-line reason naming the file in err (up to errlen bytes, always
 * terminated): unreadable file, no certificate in it, a key that is not
 * one (or is encrypted: no passphrase is ever asked for), or a key that
 * does not match the certificate. Its ticket key is fresh and random. */
struct nw_tls_ctx *nw_tls_ctx_new(const char *cert_file, const char *key_file,
                                  char *err, size_t errlen);

/* Make a new certificate pair and policy from the files and use it for
 * the connections made from now on (those already made keep the old
 * one); the ticket keys stay, so tickets issued before still resume.
 * Returns 0, or -1 with the reason in err: the old pair is then kept. */
int nw_tls_ctx_reload(struct nw_tls_ctx *t, const char *cert_file, const char *key_file,
                      char *err, size_t errlen);

/* A new ticket key encrypts the tickets issued from now on; the one it
 * replaces still decrypts (such a ticket resumes and is renewed under
 * the new key), the one before that no longer does. The caller calls it
 * on a timer (the design: hourly; a ticket then lives at most two
 * hours, the context's session timeout). Returns 0, or -1 when the
 * random generator fails (the keys are then unchanged). */
int nw_tls_ctx_rotate_ticket_key(struct nw_tls_ctx *t);

void nw_tls_ctx_free(struct nw_tls_ctx *t);

/* ---- Handshake ---- */

/* What a step of a connection's handshake came to. */
enum nw_tls_step {
    NW_TLS_DONE,        /* established: relay from now on */
    NW_TLS_WANT_READ,   /* call again when the socket is readable */
    NW_TLS_WANT_WRITE,  /* call again when the socket is writable */
    NW_TLS_FAILED,      /* close the socket; nw_tls_conn_reason says why */
    NW_TLS_PLAIN        /* the first byte is not a TLS handshake record:
                           plain HTTP or garbage; answer nw_tls_plain_400
                           and close (reason NW_TLS_R_PLAIN) */
};

/* Why a connection was refused or failed: the reason label of
 * narwhal_tls_refused_total (nw_tls_reason_name). */
enum nw_tls_reason {
    NW_TLS_R_NONE,          /* no failure */
    NW_TLS_R_PLAIN,         /* plain HTTP (or anything not TLS) */
    NW_TLS_R_VERSION,       /* a protocol version below TLS 1.2 */
    NW_TLS_R_CIPHER,        /* no cipher, group or signature in common */
    NW_TLS_R_GARBAGE,       /* a bad record or message: not TLS after all */
    NW_TLS_R_CLOSED,        /* the peer closed or reset mid-handshake */
    NW_TLS_R_CERT_REFUSED,  /* the peer refused our certificate (its alert) */
    NW_TLS_R_TIMEOUT,       /* the caller's deadline passed (never set here) */
    NW_TLS_R_OTHER,         /* anything else */
    NW_TLS_R_COUNT
};

/* A lower-case label for /metrics ("version", "garbage", ...). */
const char *nw_tls_reason_name(enum nw_tls_reason r);

/* A connection on an accepted, non-blocking TCP socket fd, not yet
 * shaken hands; NULL when out of memory. The socket stays the caller's
 * (nw_tls_conn_free does not close it). */
struct nw_tls_conn *nw_tls_conn_new(struct nw_tls_ctx *t, int fd);

/* One step of the handshake, run when the socket is ready as the last
 * step asked. The first steps look at the first byte without taking it
 * (MSG_PEEK): anything but a handshake record (0x16) is NW_TLS_PLAIN.
 * A deadline is the caller's: it closes a connection whose handshake has
 * not come to NW_TLS_DONE within --header-timeout (and counts
 * NW_TLS_R_TIMEOUT). */
enum nw_tls_step nw_tls_handshake(struct nw_tls_conn *c);

/* Why the connection failed (NW_TLS_R_NONE while it has not). */
enum nw_tls_reason nw_tls_conn_reason(const struct nw_tls_conn *c);

/* 1 once the handshake has begun: the client's hello taken and the
 * server's answer made (the step that costs the key exchange and the
 * signature is over), else 0. */
int nw_tls_conn_begun(const struct nw_tls_conn *c);
/* 1 when the finished handshake resumed a session (a ticket), else 0. */
int nw_tls_conn_resumed(const struct nw_tls_conn *c);
/* The bytes of the answer to plain HTTP on a TLS port: a 400 that says
 * this port speaks HTTPS, with Connection: close; its length in *len. */
const char *nw_tls_plain_400(size_t *len);

/* ---- Relay ---- */

/* What the relay waits for (a mask): the caller watches these and calls
 * nw_tls_relay again when any of them is ready. */
#define NW_TLS_WAIT_TCP_READ   1
#define NW_TLS_WAIT_TCP_WRITE  2
#define NW_TLS_WAIT_PAIR_READ  4
#define NW_TLS_WAIT_PAIR_WRITE 8
#define NW_TLS_READY_TCP       (NW_TLS_WAIT_TCP_READ | NW_TLS_WAIT_TCP_WRITE)
#define NW_TLS_READY_PAIR      (NW_TLS_WAIT_PAIR_READ | NW_TLS_WAIT_PAIR_WRITE)
#define NW_TLS_READY_ALL       (NW_TLS_READY_TCP | NW_TLS_READY_PAIR)

/* Move plaintext between the established connection and pair_fd (a
 * non-blocking stream socket: one end of a socketpair whose other end
 * the worker reads and writes), both ways, as far as it goes without
 * blocking, through two bounded buffers (up to NW_TLS_RELAY_BUF bytes
 * each, held only while not empty). Ends of stream go across: the
 * pair's end (the worker's SHUT_WR or close) becomes close_notify and
 * shutdown(SHUT_WR) of the TCP socket; the client's close_notify or TCP
 * end becomes shutdown(SHUT_WR) of the pair. ready says which socket's
 * event called it (NW_TLS_READY_TCP, _PAIR, or _ALL): a way runs only
 * when something it waits for may be ready, so a request's event does not
 * also ask the other socket for nothing. Returns the mask of what it
 * waits for, or 0 when it is over both ways (or failed: see
 * nw_tls_conn_reason): the caller then closes both sockets. */
#define NW_TLS_RELAY_BUF 16384
int nw_tls_relay(struct nw_tls_conn *c, int pair_fd, int ready);

/* Frees the connection (not its sockets). */
void nw_tls_conn_free(struct nw_tls_conn *c);

#endif
