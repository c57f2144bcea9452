/* The PROXY protocol (see nw_proxy.h). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "nw_proxy.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>

static const char v2_sig[12] = "\r\n\r\n\0\r\nQUIT\n";
static const char v1_sig[6] = "PROXY ";

enum { V2_LOCAL = 0x20, V2_PROXY = 0x21 };
enum { V2_UNSPEC = 0x00, V2_TCP4 = 0x11, V2_TCP6 = 0x21, V2_UNIX = 0x31 };

/* ------------------------------------------------------------ version 1 */

/* A decimal port, 0-65535, no sign, no leading zero but for "0". */
static int v1_port(const char *s, size_t n, uint16_t *out)
{
    if (n == 0 || n > 5 || (n > 1 && s[0] == '0'))
        return -1;
    unsigned v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        v = v * 10 + (unsigned)(s[i] - '0');
    }
    if (v > 65535)
        return -1;
    *out = (uint16_t)v;
    return 0;
}

static int v1_addr(int family, const char *s, size_t n, struct sockaddr_storage *ss,
                   socklen_t *len, uint16_t port)
{
    char text[INET6_ADDRSTRLEN];
    if (n == 0 || n >= sizeof text)
        return -1;
    memcpy(text, s, n);
    text[n] = 0;
    memset(ss, 0, sizeof *ss);
    if (family == AF_INET) {
        struct sockaddr_in *in = (struct sockaddr_in *)ss;
        if (inet_pton(AF_INET, text, &in->sin_addr) != 1)
            return -1;
        in->sin_family = AF_INET;
        in->sin_port = htons(port);
        *len = sizeof *in;
    } else {
        struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)ss;
        if (inet_pton(AF_INET6, text, &in6->sin6_addr) != 1)
            return -1;
        in6->sin6_family = AF_INET6;
        in6->sin6_port = htons(port);
        *len = sizeof *in6;
    }
    return 0;
}

/* "TCP4 a b p q" (the line after "PROXY ", CRLF cut): exactly four fields
 * separated by single spaces. */
static int v1_fields(const char *p, size_t n, int family, nw_proxy_info *out)
{
    const char *f[4];
    size_t fl[4];
    int k = 0;
    const char *end = p + n;
    while (k < 4) {
        const char *sp = memchr(p, ' ', (size_t)(end - p));
        const char *stop = sp ? sp : end;
        f[k] = p;
        fl[k++] = (size_t)(stop - p);
        if (!sp)
            break;
        p = sp + 1;
    }
    if (k != 4 || f[3] + fl[3] != end)
        return NW_PROXY_BAD;
    uint16_t sport, dport;
    if (v1_port(f[2], fl[2], &sport) < 0 || v1_port(f[3], fl[3], &dport) < 0
        || v1_addr(family, f[0], fl[0], &out->src, &out->src_len, sport) < 0
        || v1_addr(family, f[1], fl[1], &out->dst, &out->dst_len, dport) < 0)
        return NW_PROXY_BAD;
    return NW_PROXY_DONE;
}

static int parse_v1(const char *buf, size_t len, nw_proxy_info *out, size_t *consumed)
{
    size_t look = len < NW_PROXY_V1_MAX ? len : NW_PROXY_V1_MAX;
    const char *lf = memchr(buf, '\n', look);
    if (!lf)
        return len >= NW_PROXY_V1_MAX ? NW_PROXY_BAD : NW_PROXY_MORE;
    size_t line = (size_t)(lf - buf) + 1;
    if (line < sizeof v1_sig + 2 || buf[line - 2] != '\r')
        return NW_PROXY_BAD;
    const char *p = buf + sizeof v1_sig;
    size_t n = line - 2 - sizeof v1_sig;      /* without "PROXY " and CRLF */
    for (size_t i = 0; i < n; i++)
        if (p[i] == '\r' || p[i] == '\0')
            return NW_PROXY_BAD;
    memset(out, 0, sizeof *out);
    int r;
    if (n >= 7 && !memcmp(p, "UNKNOWN", 7) && (n == 7 || p[7] == ' ')) {
        out->local = 1;
        r = NW_PROXY_DONE;
    } else if (n > 5 && !memcmp(p, "TCP4 ", 5)) {
        r = v1_fields(p + 5, n - 5, AF_INET, out);
    } else if (n > 5 && !memcmp(p, "TCP6 ", 5)) {
        r = v1_fields(p + 5, n - 5, AF_INET6, out);
    } else {
        r = NW_PROXY_BAD;
    }
    if (r == NW_PROXY_DONE)
        *consumed = line;
    return r;
}

/* ------------------------------------------------------------ version 2 */

static void v2_inet(const unsigned char *a, nw_proxy_info *out)
{
    struct sockaddr_in *s = (struct sockaddr_in *)&out->src, *d = (struct sockaddr_in *)&out->dst;
    s->sin_family = d->sin_family = AF_INET;
    memcpy(&s->sin_addr, a, 4);
    memcpy(&d->sin_addr, a + 4, 4);
    memcpy(&s->sin_port, a + 8, 2);
    memcpy(&d->sin_port, a + 10, 2);
    out->src_len = out->dst_len = sizeof(struct sockaddr_in);
}

static void v2_inet6(const unsigned char *a, nw_proxy_info *out)
{
    struct sockaddr_in6 *s = (struct sockaddr_in6 *)&out->src, *d = (struct sockaddr_in6 *)&out->dst;
    s->sin6_family = d->sin6_family = AF_INET6;
    memcpy(&s->sin6_addr, a, 16);
    memcpy(&d->sin6_addr, a + 16, 16);
    memcpy(&s->sin6_port, a + 32, 2);
    memcpy(&d->sin6_port, a + 34, 2);
    out->src_len = out->dst_len = sizeof(struct sockaddr_in6);
}

static void v2_unix(const unsigned char *a, nw_proxy_info *out)
{
    struct sockaddr_un *s = (struct sockaddr_un *)&out->src, *d = (struct sockaddr_un *)&out->dst;
    s->sun_family = d->sun_family = AF_UNIX;
    /* 108 bytes each: the path up to its NUL (at most 107 bytes), so the
     * rest of sun_path stays zero whatever the header held after it */
    memcpy(s->sun_path, a, strnlen((const char *)a, 107));
    memcpy(d->sun_path, a + 108, strnlen((const char *)a + 108, 107));
    out->src_len = out->dst_len = sizeof(struct sockaddr_un);
}

static int parse_v2(const unsigned char *b, size_t len, nw_proxy_info *out, size_t *consumed)
{
    if (len < NW_PROXY_V2_HEAD)
        return NW_PROXY_MORE;
    size_t body = (size_t)b[14] << 8 | b[15];
    int cmd = b[12], fam = b[13];
    if ((cmd != V2_LOCAL && cmd != V2_PROXY) || NW_PROXY_V2_HEAD + body > NW_PROXY_V2_MAX)
        return NW_PROXY_BAD;
    size_t need = cmd == V2_LOCAL ? 0 : fam == V2_TCP4 ? 12 : fam == V2_TCP6 ? 36
                : fam == V2_UNIX ? 216 : fam == V2_UNSPEC ? 0 : (size_t)-1;
    if (need == (size_t)-1 || body < need)
        return NW_PROXY_BAD;     /* an unknown family or protocol, or too short for its addresses */
    if (len < NW_PROXY_V2_HEAD + body)
        return NW_PROXY_MORE;
    memset(out, 0, sizeof *out);
    const unsigned char *a = b + NW_PROXY_V2_HEAD;
    if (cmd == V2_LOCAL || fam == V2_UNSPEC)
        out->local = 1;
    else if (fam == V2_TCP4)
        v2_inet(a, out);
    else if (fam == V2_TCP6)
        v2_inet6(a, out);
    else
        v2_unix(a, out);
    *consumed = NW_PROXY_V2_HEAD + body;     /* TLVs after the addresses are skipped */
    return NW_PROXY_DONE;
}

int nw_proxy_parse(const char *buf, size_t len, nw_proxy_info *out, size_t *consumed)
{
    if (len == 0)
        return NW_PROXY_MORE;
    if (buf[0] == v2_sig[0]) {
        size_t n = len < sizeof v2_sig ? len : sizeof v2_sig;
        if (memcmp(buf, v2_sig, n))
            return NW_PROXY_BAD;
        return len < sizeof v2_sig ? NW_PROXY_MORE
                                   : parse_v2((const unsigned char *)buf, len, out, consumed);
    }
    size_t n = len < sizeof v1_sig ? len : sizeof v1_sig;
    if (memcmp(buf, v1_sig, n))
        return NW_PROXY_BAD;
    return len < sizeof v1_sig ? NW_PROXY_MORE : parse_v1(buf, len, out, consumed);
}

/* ------------------------------------------------------------ encoding */

size_t nw_proxy_encode_v2(char *out, const struct sockaddr *src, socklen_t src_len,
                          const struct sockaddr *dst, socklen_t dst_len)
{
    unsigned char *o = (unsigned char *)out;
    memcpy(o, v2_sig, sizeof v2_sig);
    int family = src && dst && src_len && dst_len && src->sa_family == dst->sa_family
               ? src->sa_family : AF_UNSPEC;
    size_t body = 0;
    unsigned char *a = o + NW_PROXY_V2_HEAD;
    if (family == AF_INET) {
        const struct sockaddr_in *s = (const void *)src, *d = (const void *)dst;
        memcpy(a, &s->sin_addr, 4);
        memcpy(a + 4, &d->sin_addr, 4);
        memcpy(a + 8, &s->sin_port, 2);
        memcpy(a + 10, &d->sin_port, 2);
        body = 12;
        o[13] = V2_TCP4;
    } else if (family == AF_INET6) {
        const struct sockaddr_in6 *s = (const void *)src, *d = (const void *)dst;
        memcpy(a, &s->sin6_addr, 16);
        memcpy(a + 16, &d->sin6_addr, 16);
        memcpy(a + 32, &s->sin6_port, 2);
        memcpy(a + 34, &d->sin6_port, 2);
        body = 36;
        o[13] = V2_TCP6;
    } else if (family == AF_UNIX) {
        const struct sockaddr_un *s = (const void *)src, *d = (const void *)dst;
        memset(a, 0, 216);
        memcpy(a, s->sun_path, strnlen(s->sun_path, 107));
        memcpy(a + 108, d->sun_path, strnlen(d->sun_path, 107));
        body = 216;
        o[13] = V2_UNIX;
    }
    o[12] = body ? V2_PROXY : V2_LOCAL;
    if (!body)
        o[13] = V2_UNSPEC;
    o[14] = (unsigned char)(body >> 8);
    o[15] = (unsigned char)body;
    return NW_PROXY_V2_HEAD + body;
}

/* ------------------------------------------------------------ --proxy-from */

int nw_proxy_cidr_parse(const char *text, nw_proxy_cidr *out)
{
    char addr[INET6_ADDRSTRLEN + 1];
    const char *slash = strchr(text, '/');
    size_t n = slash ? (size_t)(slash - text) : strlen(text);
    if (n == 0 || n >= sizeof addr)
        return -1;
    memcpy(addr, text, n);
    addr[n] = 0;
    memset(out, 0, sizeof *out);
    if (inet_pton(AF_INET, addr, out->addr) == 1)
        out->family = AF_INET;
    else if (inet_pton(AF_INET6, addr, out->addr) == 1)
        out->family = AF_INET6;
    else
        return -1;
    int max = out->family == AF_INET ? 32 : 128;
    out->bits = max;
    if (slash) {
        char *end;
        long bits = strtol(slash + 1, &end, 10);
        if (slash[1] < '0' || slash[1] > '9' || *end || bits > max)
            return -1;
        out->bits = (int)bits;
    }
    return 0;
}

static int prefix_match(const unsigned char *a, const unsigned char *b, int bits)
{
    int whole = bits / 8, rest = bits % 8;
    if (memcmp(a, b, (size_t)whole))
        return 0;
    if (!rest)
        return 1;
    unsigned char mask = (unsigned char)(0xff << (8 - rest));
    return (a[whole] & mask) == (b[whole] & mask);
}

int nw_proxy_cidr_match(const nw_proxy_cidr *list, size_t n, const struct sockaddr *peer)
{
    unsigned char addr[16];
    int family = peer->sa_family;
    if (family == AF_UNIX)
        return 1;
    if (family == AF_INET) {
        memcpy(addr, &((const struct sockaddr_in *)peer)->sin_addr, 4);
    } else if (family == AF_INET6) {
        const struct in6_addr *a6 = &((const struct sockaddr_in6 *)peer)->sin6_addr;
        if (IN6_IS_ADDR_V4MAPPED(a6)) {
            family = AF_INET;
            memcpy(addr, a6->s6_addr + 12, 4);
        } else {
            memcpy(addr, a6->s6_addr, 16);
        }
    } else {
        return 0;
    }
    for (size_t i = 0; i < n; i++)
        if (list[i].family == family && prefix_match(list[i].addr, addr, list[i].bits))
            return 1;
    return 0;
}
