/* Unit tests of the PROXY protocol parser and encoder (src/shared/nw_proxy.c):
 * every valid shape, each fed byte by byte, bytes after the header left
 * alone, every malformed shape refused, the v2 encoder read back by the
 * parser, and --proxy-from's CIDR matching. */
#define _GNU_SOURCE
#include "tap.h"
#include "nw_proxy.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>

static const char SIG[] = "\r\n\r\n\0\r\nQUIT\n";

/* A v2 header: command, family byte, the address block, extra (TLV) bytes. */
static size_t v2(char *out, int cmd, int fam, const void *addrs, size_t alen, size_t extra)
{
    memcpy(out, SIG, 12);
    out[12] = (char)cmd;
    out[13] = (char)fam;
    out[14] = (char)((alen + extra) >> 8);
    out[15] = (char)(alen + extra);
    memcpy(out + 16, addrs, alen);
    memset(out + 16 + alen, 0x42, extra);
    return 16 + alen + extra;
}

static const char *src_text(const nw_proxy_info *i, char *buf, size_t cap)
{
    if (i->src.ss_family == AF_INET)
        inet_ntop(AF_INET, &((struct sockaddr_in *)&i->src)->sin_addr, buf, (socklen_t)cap);
    else if (i->src.ss_family == AF_INET6)
        inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&i->src)->sin6_addr, buf, (socklen_t)cap);
    else if (i->src.ss_family == AF_UNIX)
        snprintf(buf, cap, "%s", ((struct sockaddr_un *)&i->src)->sun_path);
    else
        snprintf(buf, cap, "-");
    return buf;
}

static int src_port(const nw_proxy_info *i)
{
    return i->src.ss_family == AF_INET ? ntohs(((struct sockaddr_in *)&i->src)->sin_port)
         : i->src.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&i->src)->sin6_port) : -1;
}

/* A valid header, whole and byte by byte, with an HTTP request after it. */
static void valid(const char *name, const char *hdr, size_t hlen, const char *want_src, int want_port,
                  int want_local)
{
    char buf[2048], t[128], msg[256];
    const char *req = "GET / HTTP/1.1\r\n\r\n";
    memcpy(buf, hdr, hlen);
    memcpy(buf + hlen, req, strlen(req));
    nw_proxy_info info;
    size_t used = 0;
    int r = nw_proxy_parse(buf, hlen + strlen(req), &info, &used);
    snprintf(msg, sizeof msg, "%s: parsed", name);
    is(r, NW_PROXY_DONE, msg);
    snprintf(msg, sizeof msg, "%s: the header's length, not the request's", name);
    is(used, hlen, msg);
    snprintf(msg, sizeof msg, "%s: local", name);
    is(info.local, want_local, msg);
    if (want_src) {
        snprintf(msg, sizeof msg, "%s: source %s", name, want_src);
        ok(!strcmp(src_text(&info, t, sizeof t), want_src), msg);
        if (want_port >= 0) {
            snprintf(msg, sizeof msg, "%s: source port", name);
            is(src_port(&info), want_port, msg);
        }
    }
    int all_more = 1;
    for (size_t k = 0; k < hlen; k++) {
        char *piece = malloc(k ? k : 1);     /* exactly k bytes: ASan sees any over-read */
        memcpy(piece, hdr, k);
        if (nw_proxy_parse(piece, k, &info, &used) != NW_PROXY_MORE)
            all_more = 0;
        free(piece);
    }
    snprintf(msg, sizeof msg, "%s: every cut before its end asks for more", name);
    ok(all_more, msg);
}

static void bad(const char *name, const char *buf, size_t len)
{
    nw_proxy_info info;
    size_t used = 0;
    char *copy = malloc(len ? len : 1);
    memcpy(copy, buf, len);
    is(nw_proxy_parse(copy, len, &info, &used), NW_PROXY_BAD, name);
    free(copy);
}

static void test_v1(void)
{
    const char *h = "PROXY TCP4 203.0.113.7 10.0.0.1 51234 80\r\n";
    valid("v1 TCP4", h, strlen(h), "203.0.113.7", 51234, 0);
    h = "PROXY TCP6 2001:db8::1 2001:db8::2 4444 443\r\n";
    valid("v1 TCP6", h, strlen(h), "2001:db8::1", 4444, 0);
    h = "PROXY UNKNOWN\r\n";
    valid("v1 UNKNOWN", h, strlen(h), NULL, -1, 1);
    h = "PROXY UNKNOWN ffff:f...f:ffff ffff:f...f:ffff 65535 65535\r\n";
    valid("v1 UNKNOWN with fields", h, strlen(h), NULL, -1, 1);
    h = "PROXY TCP4 0.0.0.0 255.255.255.255 0 65535\r\n";
    valid("v1 bounds", h, strlen(h), "0.0.0.0", 0, 0);

    bad("v1: HTTP instead", "GET / HTTP/1.1\r\n\r\n", 18);
    bad("v1: refused at the first wrong byte", "G", 1);
    bad("v1: lower case", "proxy TCP4 1.2.3.4 5.6.7.8 1 2\r\n", 32);
    bad("v1: LF without CR", "PROXY TCP4 1.2.3.4 5.6.7.8 1 2\n", 31);
    bad("v1: UNKNOWN, LF without CR", "PROXY UNKNOWN x\n", 16);
    bad("v1: two spaces", "PROXY TCP4  1.2.3.4 5.6.7.8 1 2\r\n", 33);
    bad("v1: a field missing", "PROXY TCP4 1.2.3.4 5.6.7.8 1\r\n", 30);
    bad("v1: a field more", "PROXY TCP4 1.2.3.4 5.6.7.8 1 2 3\r\n", 34);
    bad("v1: port too large", "PROXY TCP4 1.2.3.4 5.6.7.8 65536 2\r\n", 36);
    bad("v1: port with a sign", "PROXY TCP4 1.2.3.4 5.6.7.8 +1 2\r\n", 33);
    bad("v1: port with a leading zero", "PROXY TCP4 1.2.3.4 5.6.7.8 01 2\r\n", 33);
    bad("v1: bad address", "PROXY TCP4 1.2.3.256 5.6.7.8 1 2\r\n", 34);
    bad("v1: an IPv6 address in TCP4", "PROXY TCP4 ::1 5.6.7.8 1 2\r\n", 28);
    bad("v1: unknown protocol", "PROXY UDP4 1.2.3.4 5.6.7.8 1 2\r\n", 32);
    bad("v1: a CR inside", "PROXY TCP4 1.2.3.4\r5.6.7.8 1 2\r\n", 32);
    char long_line[200];
    memset(long_line, 'x', sizeof long_line);
    memcpy(long_line, "PROXY UNKNOWN ", 14);
    bad("v1: no CRLF within 107 bytes", long_line, sizeof long_line);
}

static void test_v2(void)
{
    char h[600];
    unsigned char a4[12] = { 203, 0, 113, 7, 10, 0, 0, 1, 0xc8, 0x22, 0, 80 };
    size_t n = v2(h, 0x21, 0x11, a4, sizeof a4, 0);
    valid("v2 TCP4", h, n, "203.0.113.7", 51234, 0);
    n = v2(h, 0x21, 0x11, a4, sizeof a4, 20);
    valid("v2 TCP4 with TLVs after", h, n, "203.0.113.7", 51234, 0);
    unsigned char a6[36] = { 0x20, 0x01, 0x0d, 0xb8 };
    a6[15] = 1;
    a6[32] = 0x11;
    a6[33] = 0x5c;
    n = v2(h, 0x21, 0x21, a6, sizeof a6, 0);
    valid("v2 TCP6", h, n, "2001:db8::1", 4444, 0);
    unsigned char au[216] = { 0 };
    memcpy(au, "/run/client.sock", 16);
    n = v2(h, 0x21, 0x31, au, sizeof au, 0);
    valid("v2 UNIX", h, n, "/run/client.sock", -1, 0);
    n = v2(h, 0x20, 0x00, "", 0, 0);
    valid("v2 LOCAL", h, n, NULL, -1, 1);
    n = v2(h, 0x20, 0x11, a4, sizeof a4, 0);
    valid("v2 LOCAL with addresses (ignored)", h, n, NULL, -1, 1);

    n = v2(h, 0x21, 0x11, a4, sizeof a4, 0);
    h[3] = 'X';
    bad("v2: bad signature", h, n);
    n = v2(h, 0x22, 0x11, a4, sizeof a4, 0);
    bad("v2: unknown command", h, n);
    n = v2(h, 0x11, 0x11, a4, sizeof a4, 0);
    bad("v2: version 1 in a v2 header", h, n);
    n = v2(h, 0x21, 0x12, a4, sizeof a4, 0);
    bad("v2: DGRAM", h, n);
    n = v2(h, 0x21, 0x41, a4, sizeof a4, 0);
    bad("v2: unknown family", h, n);
    n = v2(h, 0x21, 0x21, a4, sizeof a4, 0);
    bad("v2: length too short for TCP6's addresses", h, n);
    n = v2(h, 0x21, 0x11, a4, 8, 0);
    bad("v2: length too short for TCP4's addresses", h, n);
    n = v2(h, 0x21, 0x11, a4, sizeof a4, 0);
    h[14] = 0x7f;
    h[15] = (char)0xff;
    bad("v2: a length past the limit", h, n);
    /* a length past the buffer: more, never a read beyond it */
    n = v2(h, 0x21, 0x11, a4, sizeof a4, 0);
    h[15] = 100;
    nw_proxy_info info;
    size_t used;
    char *cut = malloc(n);
    memcpy(cut, h, n);
    is(nw_proxy_parse(cut, n, &info, &used), NW_PROXY_MORE, "v2: a length past the bytes so far asks for more");
    free(cut);
}

static void round_trip(const char *name, const struct sockaddr *src, socklen_t sl,
                       const struct sockaddr *dst, socklen_t dl, const char *want, int local)
{
    char out[NW_PROXY_V2_ROOM], t[128], msg[200];
    size_t n = nw_proxy_encode_v2(out, src, sl, dst, dl);
    nw_proxy_info info;
    size_t used = 0;
    snprintf(msg, sizeof msg, "encode %s: the parser reads it back", name);
    ok(nw_proxy_parse(out, n, &info, &used) == NW_PROXY_DONE && used == n, msg);
    snprintf(msg, sizeof msg, "encode %s: same source", name);
    ok(local ? info.local : !strcmp(src_text(&info, t, sizeof t), want), msg);
}

static void test_encode(void)
{
    struct sockaddr_in s4 = { .sin_family = AF_INET, .sin_port = htons(1234) }, d4 = s4;
    inet_pton(AF_INET, "198.51.100.9", &s4.sin_addr);
    round_trip("TCP4", (void *)&s4, sizeof s4, (void *)&d4, sizeof d4, "198.51.100.9", 0);
    struct sockaddr_in6 s6 = { .sin6_family = AF_INET6 }, d6 = s6;
    inet_pton(AF_INET6, "fd00::7", &s6.sin6_addr);
    round_trip("TCP6", (void *)&s6, sizeof s6, (void *)&d6, sizeof d6, "fd00::7", 0);
    struct sockaddr_un su = { .sun_family = AF_UNIX }, du = su;
    strcpy(su.sun_path, "/tmp/a.sock");
    round_trip("UNIX", (void *)&su, sizeof su, (void *)&du, sizeof du, "/tmp/a.sock", 0);
    round_trip("no addresses: LOCAL", NULL, 0, NULL, 0, NULL, 1);
    round_trip("mixed families: LOCAL", (void *)&s4, sizeof s4, (void *)&d6, sizeof d6, NULL, 1);
}

static void test_cidr(void)
{
    nw_proxy_cidr list[3];
    ok(nw_proxy_cidr_parse("10.0.0.0/8", &list[0]) == 0, "cidr 10.0.0.0/8");
    ok(nw_proxy_cidr_parse("fd00::/8", &list[1]) == 0, "cidr fd00::/8");
    ok(nw_proxy_cidr_parse("192.0.2.7", &list[2]) == 0, "an address alone");
    nw_proxy_cidr c;
    ok(nw_proxy_cidr_parse("10.0.0.0/33", &c) < 0, "a prefix too long");
    ok(nw_proxy_cidr_parse("10.0.0.0/", &c) < 0, "an empty prefix");
    ok(nw_proxy_cidr_parse("10.0.0.0/-1", &c) < 0, "a negative prefix");
    ok(nw_proxy_cidr_parse("example.com", &c) < 0, "a name");
    ok(nw_proxy_cidr_parse("", &c) < 0, "nothing");
    struct sockaddr_in a = { .sin_family = AF_INET };
    inet_pton(AF_INET, "10.9.8.7", &a.sin_addr);
    ok(nw_proxy_cidr_match(list, 3, (void *)&a), "10.9.8.7 is in 10.0.0.0/8");
    inet_pton(AF_INET, "11.0.0.1", &a.sin_addr);
    ok(!nw_proxy_cidr_match(list, 3, (void *)&a), "11.0.0.1 is in none");
    inet_pton(AF_INET, "192.0.2.7", &a.sin_addr);
    ok(nw_proxy_cidr_match(list, 3, (void *)&a), "an address alone matches itself");
    inet_pton(AF_INET, "192.0.2.8", &a.sin_addr);
    ok(!nw_proxy_cidr_match(list, 3, (void *)&a), "... and not its neighbour");
    struct sockaddr_in6 b = { .sin6_family = AF_INET6 };
    inet_pton(AF_INET6, "::ffff:10.1.2.3", &b.sin6_addr);
    ok(nw_proxy_cidr_match(list, 3, (void *)&b), "an IPv4-mapped peer matches an IPv4 CIDR");
    inet_pton(AF_INET6, "fd12::1", &b.sin6_addr);
    ok(nw_proxy_cidr_match(list, 3, (void *)&b), "fd12::1 is in fd00::/8");
    inet_pton(AF_INET6, "fe80::1", &b.sin6_addr);
    ok(!nw_proxy_cidr_match(list, 3, (void *)&b), "fe80::1 is not");
    struct sockaddr_un u = { .sun_family = AF_UNIX };
    ok(nw_proxy_cidr_match(list, 3, (void *)&u), "a unix-socket peer is always allowed");
    nw_proxy_cidr odd;
    nw_proxy_cidr_parse("10.128.0.0/9", &odd);
    inet_pton(AF_INET, "10.200.0.1", &a.sin_addr);
    ok(nw_proxy_cidr_match(&odd, 1, (void *)&a), "a prefix not on a byte boundary: in");
    inet_pton(AF_INET, "10.100.0.1", &a.sin_addr);
    ok(!nw_proxy_cidr_match(&odd, 1, (void *)&a), "... out");
}

int main(void)
{
    test_v1();
    test_v2();
    test_encode();
    test_cidr();
    done_testing();
    return tap_failed ? 1 : 0;
}
