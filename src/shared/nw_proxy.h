/* The PROXY protocol (haproxy's proxy-protocol.txt, versions 1 and 2): the
 * header a load balancer sends before the HTTP bytes with the client's
 * addresses, and the v2 header Narwhal itself puts in front of a
 * connection's unread bytes when it hands the connection on, so that its
 * real addresses travel with it (docs/DESIGN.md, "The PROXY protocol";
 * docs/PROTOCOL.md). Pure C. */
#ifndef NW_PROXY_H
#define NW_PROXY_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#define NW_PROXY_V1_MAX   107   /* a v1 line, CRLF included (the spec's bound) */
#define NW_PROXY_V2_HEAD  16    /* signature, version/command, family, length */
#define NW_PROXY_V2_MAX   (NW_PROXY_V2_HEAD + 1024) /* addresses and TLVs we accept at most */

/* Results of nw_proxy_parse: a range of their own. */
#define NW_PROXY_DONE  (-61)    /* a whole, valid header */
#define NW_PROXY_MORE  (-62)    /* valid so far: read more */
#define NW_PROXY_BAD   (-63)    /* not a valid header: close, never guess */

typedef struct {
    int local;                  /* LOCAL (v2) or UNKNOWN (v1): keep the socket's own addresses */
    struct sockaddr_storage src, dst;
    socklen_t src_len, dst_len; /* 0 when not given */
} nw_proxy_info;

/* Parse the header at the start of buf[0..len). DONE: *consumed is its
 * length and *out is filled; MORE; BAD. */
int nw_proxy_parse(const char *buf, size_t len, nw_proxy_info *out, size_t *consumed);

/* Write a v2 PROXY header for src and dst (AF_INET, AF_INET6 or AF_UNIX;
 * anything else, or a missing address: a LOCAL header) into out (at least
 * NW_PROXY_V2_HEAD + 216 bytes). Returns its length. */
size_t nw_proxy_encode_v2(char *out, const struct sockaddr *src, socklen_t src_len,
                          const struct sockaddr *dst, socklen_t dst_len);

#define NW_PROXY_V2_ROOM (NW_PROXY_V2_HEAD + 216)

/* --proxy-from: the peers allowed to send a header. */
typedef struct {
    int family;                 /* AF_INET or AF_INET6 */
    unsigned char addr[16];
    int bits;
} nw_proxy_cidr;

/* "10.0.0.0/8", "fd00::/8", or an address alone (/32, /128). 0, or -1. */
int nw_proxy_cidr_parse(const char *text, nw_proxy_cidr *out);

/* Whether peer is in one of list[0..n); an IPv4-mapped IPv6 peer matches
 * IPv4 entries; a unix-socket peer (a local process) always matches. */
int nw_proxy_cidr_match(const nw_proxy_cidr *list, size_t n, const struct sockaddr *peer);

#endif
