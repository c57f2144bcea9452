/* Narwhal's HTTP/1.x request parser: request head (RFC 9112 sections 2-5),
 * body framing (RFC 9112 section 6), the chunked transfer coding (RFC 9112
 * section 7.1) and percent-decoding. Written from the RFCs; see nw_http.h
 * for the contract.
 *
 * Rules worth knowing, beyond the header:
 *  - Empty lines (CRLF or LF) before the request line are skipped; they are
 *    part of the returned length and count toward max_header_bytes.
 *  - A lone LF ends a line anywhere a CRLF may; a CR not followed by LF is
 *    always an error (400).
 *  - max_request_line counts method SP target SP version, without the line
 *    ending; max_header_bytes counts everything the returned length counts.
 *  - On NW_PARSE_ERROR or NW_PARSE_INCOMPLETE the request fields other than
 *    error_status/error_reason are unspecified.
 *  - Absolute-form targets ("http://host/p?q"): path is "/p". When the
 *    target has no path ("http://host", "http://host?q") path_len is 0 and
 *    path points at the end of the authority. A target that is neither
 *    origin-form nor absolute-form ("*", "host:443") is its own path (up to
 *    the first '?').
 *  - nw_http_framing reports "Content-Length: 0" as NW_BODY_LENGTH with
 *    content_length 0 (so the caller can tell it was sent).
 *  - Empty elements in the Transfer-Encoding and Connection lists are
 *    ignored (RFC 9110 5.6.1). A 100-continue expectation in an HTTP/1.0
 *    request is ignored (RFC 9110 10.1.1).
 *  - Chunked: max_trailer_bytes counts the trailer field lines (their line
 *    endings included, the final empty line not); 0 allows no trailer
 *    fields at all.
 */
#include <string.h>
#include <limits.h>
#include "nw_http.h"

/* ---------------------------------------------------------------- tables */

#define NW_C_TCHAR  0x01    /* token character, RFC 9110 5.6.2 */
#define NW_C_VCHAR  0x02    /* 0x21-0x7E: request-target */
#define NW_C_PATH   0x04    /* VCHAR other than '?' */
#define NW_C_VALUE  0x08    /* field-value byte: HTAB SP VCHAR obs-text */
#define NW_C_OWS    0x10    /* SP HTAB */
#define NW_C_SCHEME 0x20    /* ALPHA DIGIT "+" "-" ".", RFC 3986 3.1 */
#define NW_C_HOST   0x40    /* reg-name byte but pct-encoded: unreserved sub-delims, RFC 3986 3.2.2 */

static const unsigned char ctype[256] = {
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x18, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, /* 0x00 */
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, /* 0x10 */
    0x18, 0x4f, 0x0e, 0x0f, 0x4f, 0x0f, 0x4f, 0x4f, 0x4e, 0x4e, 0x4f, 0x6f, 0x4e, 0x6f, 0x6f, 0x0e, /* 0x20 */
    0x6f, 0x6f, 0x6f, 0x6f, 0x6f, 0x6f, 0x6f, 0x6f, 0x6f, 0x6f, 0x0e, 0x4e, 0x0e, 0x4e, 0x0e, 0x0a, /* 0x30 */
    0x0e, 0x6f, 0x6f, 0x6f, 0x6f, 0x6f, 0x6f, 0x6f, 0x6f, 0x6f, 0x6f, 0x6f, 0x6f, 0x6f, 0x6f, 0x6f, /* 0x40 */
    0x6f, 0x6f, 0x6f, 0x6f, 0x6f, 0x6f, 0x6f, 0x6f, 0x6f, 0x6f, 0x6f, 0x0e, 0x0e, 0x0e, 0x0f, 0x4f, /* 0x50 */
    0x0f, 0x6f, 0x6f, 0x6f, 0x6f, 0x6f, 0x6f, 0x6f, 0x6f, 0x6f, 0x6f, 0x6f, 0x6f, 0x6f, 0x6f, 0x6f, /* 0x60 */
    0x6f, 0x6f, 0x6f, 0x6f, 0x6f, 0x6f, 0x6f, 0x6f, 0x6f, 0x6f, 0x6f, 0x0e, 0x0f, 0x0e, 0x4f, 0x00, /* 0x70 */
    0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, /* 0x80 */
    0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, /* 0x90 */
    0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, /* 0xA0 */
    0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, /* 0xB0 */
    0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, /* 0xC0 */
    0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, /* 0xD0 */
    0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, /* 0xE0 */
    0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, /* 0xF0 */
};

#define NW_NOT_HEX 0xff
static const unsigned char hexval[256] = {
    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, /* 0x00 */
    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, /* 0x10 */
    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, /* 0x20 */
    0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, /* 0x30 */
    0xff, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, /* 0x40 */
    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, /* 0x50 */
    0xff, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, /* 0x60 */
    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, /* 0x70 */
    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, /* 0x80 */
    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, /* 0x90 */
    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, /* 0xA0 */
    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, /* 0xB0 */
    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, /* 0xC0 */
    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, /* 0xD0 */
    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, /* 0xE0 */
    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, /* 0xF0 */
};

#define NW_IS(c, cls) (ctype[(unsigned char)(c)] & (cls))

static inline unsigned char lower(unsigned char c)
{
    return (c >= 'A' && c <= 'Z') ? (unsigned char)(c | 0x20) : c;
}

/* Case-insensitive: does s[0..n) equal the lower-case literal lit[0..ln)? */
static int ieq(const char *s, size_t n, const char *lit, size_t ln)
{
    if (n != ln)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (lower((unsigned char)s[i]) != (unsigned char)lit[i])
            return 0;
    return 1;
}

/* First index in [i, end) whose byte is not of class cls (or end). */
static inline size_t span(const unsigned char *s, size_t i, size_t end, unsigned cls)
{
    while (end - i >= 4) {
        if (!(ctype[s[i]] & cls)) return i;
        if (!(ctype[s[i + 1]] & cls)) return i + 1;
        if (!(ctype[s[i + 2]] & cls)) return i + 2;
        if (!(ctype[s[i + 3]] & cls)) return i + 3;
        i += 4;
    }
    while (i < end && (ctype[s[i]] & cls))
        i++;
    return i;
}

int nw_header_is(const nw_header *h, const char *lower_name, size_t lower_len)
{
    return ieq(h->name, h->name_len, lower_name, lower_len);
}

/* ----------------------------------------------------------- request head */

typedef struct {
    const unsigned char *s;
    size_t len;         /* bytes given */
    size_t end;         /* bytes we may look at: min(len, max_header_bytes) */
    size_t rl_end;      /* request line: bytes we may look at */
    int rl_capped;      /* rl_end is the max_request_line cap, not end */
    nw_request *req;
    const nw_parse_limits *lim;
} nw_head_ctx;

static int fail(nw_request *req, int status, const char *why)
{
    req->error_status = status;
    req->error_reason = why;
    return NW_PARSE_ERROR;
}

/* Ran off the bytes we may look at: more input needed, or over a limit. */
static int ran_out(const nw_head_ctx *c)
{
    if (c->end < c->len || c->len >= c->lim->max_header_bytes)
        return fail(c->req, 431, "request head too large");
    return NW_PARSE_INCOMPLETE;
}

/* Same, inside the request line. */
static int rl_ran_out(const nw_head_ctx *c)
{
    if (c->rl_capped)
        return fail(c->req, 414, "request line too long");
    return ran_out(c);
}

/* Line ending at s[*i]: CRLF or LF. Returns 0 and advances, 1 if it needs
 * more bytes, -1 if the byte there is neither (or a CR without LF). */
static inline int eol(const nw_head_ctx *c, size_t *i)
{
    size_t k = *i;
    if (c->s[k] == '\n') {
        *i = k + 1;
        return 0;
    }
    if (c->s[k] != '\r')
        return -1;
    if (k + 1 >= c->end)
        return 1;
    if (c->s[k + 1] != '\n')
        return -1;
    *i = k + 2;
    return 0;
}

size_t nw_http_empty_lines(const char *p, size_t len, int *bad)
{
    size_t i = 0;
    *bad = 0;
    for (;;) {
        if (i < len && p[i] == '\n') {
            i++;
        } else if (i + 1 < len && p[i] == '\r') {
            if (p[i + 1] != '\n') {
                *bad = 1;
                return i;
            }
            i += 2;
        } else {
            return i;       /* the end, a lone CR at the end, or the line */
        }
    }
}

/* Skip empty lines before the request line (RFC 9112 2.2), by the rule
 * the worker and the manager apply before they parse (nw_http_empty_lines). */
static int skip_empty_lines(nw_head_ctx *c, size_t *i)
{
    int bad;
    if (c->s[0] != '\r' && c->s[0] != '\n')
        return 0;
    size_t n = nw_http_empty_lines((const char *)c->s, c->end, &bad);
    if (bad)
        return fail(c->req, 400, "bare CR");
    *i = n;
    if (n >= c->end || (c->s[n] == '\r' && n + 1 == c->end))
        return ran_out(c);
    return 0;
}

/* Absolute-form target: offset just past "scheme://", or 0. */
static size_t authority_start(const char *t, size_t n)
{
    size_t i = 0;
    if (n == 0 || !((t[0] | 0x20) >= 'a' && (t[0] | 0x20) <= 'z'))
        return 0;
    while (i < n && NW_IS(t[i], NW_C_SCHEME))
        i++;
    if (n - i < 3 || t[i] != ':' || t[i + 1] != '/' || t[i + 2] != '/')
        return 0;
    return i + 3;
}

/* path/query from the target; q is the first '?' or NULL. */
static void split_target(nw_request *req, const char *t, size_t n, const char *q)
{
    size_t plen = q ? (size_t)(q - t) : n;
    req->path = t;
    req->path_len = plen;
    req->query = q ? q + 1 : NULL;
    req->query_len = q ? n - plen - 1 : 0;
    req->authority = NULL;
    req->authority_len = 0;
    if (plen == 0 || t[0] == '/')
        return;
    size_t a = authority_start(t, plen);
    if (a == 0)
        return;
    size_t host = a;
    while (a < plen && t[a] != '/') {
        if (t[a] == '@')
            host = a + 1;       /* userinfo (RFC 9110 4.2.4: not to be used) */
        a++;
    }
    req->authority = t + host;
    req->authority_len = a - host;
    req->path = t + a;
    req->path_len = plen - a;
}

/* method SP: returns 0 with *i past the SP. */
static int parse_method(nw_head_ctx *c, size_t *i)
{
    size_t m = *i, cap = c->rl_end;
    if (cap - m > NW_MAX_METHOD_LEN + 1)
        cap = m + NW_MAX_METHOD_LEN + 1;
    size_t k = span(c->s, m, cap, NW_C_TCHAR);
    if (k - m > NW_MAX_METHOD_LEN)
        return fail(c->req, 400, "method too long");
    if (k >= c->rl_end)
        return rl_ran_out(c);
    if (c->s[k] != ' ' || k == m)
        return fail(c->req, 400, "bad method");
    c->req->method = (const char *)c->s + m;
    c->req->method_len = k - m;
    *i = k + 1;
    return 0;
}

/* request-target SP: returns 0 with *i past the SP. */
static int parse_target(nw_head_ctx *c, size_t *i)
{
    size_t t = *i, k = span(c->s, t, c->rl_end, NW_C_PATH);
    const char *q = NULL;
    if (k < c->rl_end && c->s[k] == '?') {
        q = (const char *)c->s + k;
        k = span(c->s, k + 1, c->rl_end, NW_C_VCHAR);
    }
    if (k >= c->rl_end)
        return rl_ran_out(c);
    if (c->s[k] != ' ' || k == t)
        return fail(c->req, 400, "bad request-target");
    c->req->target = (const char *)c->s + t;
    c->req->target_len = k - t;
    split_target(c->req, c->req->target, k - t, q);
    *i = k + 1;
    return 0;
}

/* HTTP-version and the line ending: "HTTP/" DIGIT "." DIGIT CRLF. */
static int parse_version(nw_head_ctx *c, size_t *i)
{
    static const char shape[] = "HTTP/0.0";
    size_t v = *i;
    for (size_t k = 0; k < 8; k++) {
        unsigned char b;
        if (v + k >= c->rl_end)
            return rl_ran_out(c);
        b = c->s[v + k];
        if (shape[k] == '0' ? (b < '0' || b > '9') : b != (unsigned char)shape[k])
            return fail(c->req, 400, "bad HTTP version");
    }
    if (v + 8 >= c->rl_end)
        return rl_ran_out(c);
    *i = v + 8;
    int r = eol(c, i);
    if (r > 0)
        return ran_out(c);
    if (r < 0)
        return fail(c->req, 400, "bad request line ending");
    if (c->s[v + 5] != '1' || c->s[v + 7] > '1')
        return fail(c->req, 505, "HTTP version not supported");
    c->req->minor_version = c->s[v + 7] - '0';
    return 0;
}

static int parse_request_line(nw_head_ctx *c, size_t *i)
{
    int r;
    size_t room = c->end - *i;
    c->rl_capped = c->lim->max_request_line < room;
    c->rl_end = c->rl_capped ? *i + c->lim->max_request_line + 1 : c->end;
    if ((r = parse_method(c, i)) != 0)
        return r;
    if ((r = parse_target(c, i)) != 0)
        return r;
    return parse_version(c, i);
}

/* One field line (RFC 9112 5), not the empty line. */
static int parse_field(nw_head_ctx *c, size_t *i, nw_header *h)
{
    size_t n = *i, colon, vs, ve, k;
    colon = span(c->s, n, c->end, NW_C_TCHAR);
    if (colon >= c->end)
        return ran_out(c);
    if (c->s[colon] != ':' || colon == n)
        return fail(c->req, 400, "bad header name");
    vs = span(c->s, colon + 1, c->end, NW_C_OWS);
    k = span(c->s, vs, c->end, NW_C_VALUE);
    if (k >= c->end)
        return ran_out(c);
    ve = k;
    int r = eol(c, &k);
    if (r > 0)
        return ran_out(c);
    if (r < 0)
        return fail(c->req, 400, "bad byte in header value");
    while (ve > vs && NW_IS(c->s[ve - 1], NW_C_OWS))
        ve--;
    h->name = (const char *)c->s + n;
    h->name_len = colon - n;
    h->value = (const char *)c->s + vs;
    h->value_len = ve - vs;
    *i = k;
    return 0;
}

/* Field lines up to and including the empty line. */
static int parse_fields(nw_head_ctx *c, size_t *i, nw_header *headers)
{
    size_t nh = 0;
    int r;
    for (;;) {
        unsigned char b;
        if (*i >= c->end)
            return ran_out(c);
        b = c->s[*i];
        if (b == '\r' || b == '\n') {
            r = eol(c, i);
            if (r > 0)
                return ran_out(c);
            if (r < 0)
                return fail(c->req, 400, "bare CR");
            c->req->num_headers = nh;
            return 0;
        }
        if (b == ' ' || b == '\t')
            return fail(c->req, 400, "obsolete line folding");
        if (nh >= c->lim->max_headers)
            return fail(c->req, 431, "too many header fields");
        if ((r = parse_field(c, i, &headers[nh])) != 0)
            return r;
        nh++;
    }
}

int nw_http_parse_head(const char *buf, size_t len, nw_request *req,
                       nw_header *headers, const nw_parse_limits *limits)
{
    nw_head_ctx c;
    size_t i = 0;
    int r;
    req->headers = headers;
    req->num_headers = 0;
    req->error_status = 0;
    req->error_reason = NULL;
    c.s = (const unsigned char *)buf;
    c.len = len;
    c.end = len < limits->max_header_bytes ? len : limits->max_header_bytes;
    if (c.end > (size_t)INT_MAX)
        c.end = (size_t)INT_MAX;
    c.rl_end = c.end;
    c.rl_capped = 0;
    c.req = req;
    c.lim = limits;
    if (c.end == 0)
        return ran_out(&c);
    if ((r = skip_empty_lines(&c, &i)) != 0)
        return r;
    if ((r = parse_request_line(&c, &i)) != 0)
        return r;
    if ((r = parse_fields(&c, &i, headers)) != 0)
        return r;
    return (int)i;
}

/* ---------------------------------------------------------------- framing */

static int framing_fail(nw_framing *f, int status, const char *why)
{
    f->error_status = status;
    f->error_reason = why;
    return status;
}

/* Next non-empty element of a comma-separated list, OWS trimmed. */
static int list_next(const char **pp, const char *end, const char **el, size_t *el_len)
{
    const char *p = *pp, *e;
    while (p < end && (*p == ',' || NW_IS(*p, NW_C_OWS)))
        p++;
    if (p == end) {
        *pp = p;
        return 0;
    }
    *el = p;
    while (p < end && *p != ',')
        p++;
    e = p;
    while (e > *el && NW_IS(e[-1], NW_C_OWS))
        e--;
    *el_len = (size_t)(e - *el);
    *pp = p;
    return 1;
}

int nw_http_parse_length(const char *v, size_t n, int64_t *out)
{
    int64_t x = 0;
    int too_large = 0;
    if (n == 0)
        return NW_LENGTH_INVALID;
    for (size_t i = 0; i < n; i++) {
        int d = v[i] - '0';
        if (d < 0 || d > 9)
            return NW_LENGTH_INVALID;
        if (x > (INT64_MAX - d) / 10)
            too_large = 1;      /* (the digits are still checked) */
        else
            x = x * 10 + d;
    }
    if (too_large)
        return NW_LENGTH_TOO_LARGE;
    *out = x;
    return 0;
}

/* Host = uri-host [ ":" port ] (RFC 9112 3.2, RFC 3986 3.2.2-3.2.3):
 * a reg-name (unreserved, sub-delims, %XX) or an IP-literal in brackets,
 * then optionally ':' and digits. An empty value is valid (a target with
 * no authority). An IPv4 address is a reg-name as far as bytes go. */
int nw_http_host_valid(const char *v, size_t n)
{
    const unsigned char *s = (const unsigned char *)v;
    size_t i;
    if (n > 0 && s[0] == '[') {
        /* IPv6address or IPvFuture: hex digits, ':' and '.', or "v" ... */
        for (i = 1; i < n && s[i] != ']'; i++)
            if (!(NW_IS(s[i], NW_C_HOST) || s[i] == ':'))
                return 0;
        if (i == n || i == 1)
            return 0;
        i++;
    } else {
        for (i = span(s, 0, n, NW_C_HOST); i < n && s[i] == '%';
             i = span(s, i + 3, n, NW_C_HOST))
            if (n - i < 3 || hexval[s[i + 1]] == NW_NOT_HEX
                || hexval[s[i + 2]] == NW_NOT_HEX)
                return 0;
    }
    if (i == n)
        return 1;
    if (s[i++] != ':')
        return 0;
    for (; i < n; i++)
        if (s[i] < '0' || s[i] > '9')
            return 0;
    return 1;
}

typedef struct {
    int hosts;              /* counted up to 2 */
    int bad_host;           /* a Host value that is not host[:port] */
    int have_cl;
    int64_t cl;
    int cl_padded;          /* its value began with a 0 that is not all of it */
    int have_te;
    int te_codings;         /* list elements over all Transfer-Encoding lines */
    int te_other;           /* some element is not "chunked" */
    int te_last_chunked;    /* the last element of the last line is "chunked" */
    int conn_close;
    int conn_keep_alive;
    int expect_continue;
    int expect_other;
} nw_framing_scan;

static void scan_te(nw_framing_scan *s, const nw_header *h)
{
    const char *p = h->value, *end = h->value + h->value_len, *el;
    size_t n;
    s->have_te = 1;
    while (list_next(&p, end, &el, &n)) {
        if (s->te_codings < 2)
            s->te_codings++;
        s->te_last_chunked = ieq(el, n, "chunked", 7);
        if (!s->te_last_chunked)
            s->te_other = 1;
    }
}

static void scan_connection(nw_framing_scan *s, const nw_header *h)
{
    const char *p = h->value, *end = h->value + h->value_len, *el;
    size_t n;
    while (list_next(&p, end, &el, &n)) {
        if (ieq(el, n, "close", 5))
            s->conn_close = 1;
        else if (ieq(el, n, "keep-alive", 10))
            s->conn_keep_alive = 1;
    }
}

static int scan_content_length(nw_framing_scan *s, const nw_header *h)
{
    int64_t v;
    /* A second Content-Length line is refused whatever its value, as one
     * line with a list ("5, 5") is: the app never sees a list. */
    if (s->have_cl)
        return NW_LENGTH_INVALID;
    int r = nw_http_parse_length(h->value, h->value_len, &v);
    if (r != 0)
        return r;
    s->have_cl = 1;
    s->cl = v;
    s->cl_padded = h->value_len > 1 && h->value[0] == '0';
    return 0;
}

static void scan_expect(nw_framing_scan *s, const nw_header *h)
{
    if (ieq(h->value, h->value_len, "100-continue", 12))
        s->expect_continue = 1;
    else
        s->expect_other = 1;
}

/* One header, dispatched on the name length; NW_LENGTH_INVALID or
 * NW_LENGTH_TOO_LARGE for a Content-Length that is refused. */
static int scan_header(nw_framing_scan *s, const nw_header *h)
{
    switch (h->name_len) {
    case 4:
        if (nw_header_is(h, "host", 4) && s->hosts < 2) {
            s->hosts++;
            if (!nw_http_host_valid(h->value, h->value_len))
                s->bad_host = 1;
        }
        break;
    case 6:
        if (nw_header_is(h, "expect", 6))
            scan_expect(s, h);
        break;
    case 10:
        if (nw_header_is(h, "connection", 10))
            scan_connection(s, h);
        break;
    case 14:
        if (nw_header_is(h, "content-length", 14))
            return scan_content_length(s, h);
        break;
    case 17:
        if (nw_header_is(h, "transfer-encoding", 17))
            scan_te(s, h);
        break;
    }
    return 0;
}

int nw_http_framing(const nw_request *req, nw_framing *f)
{
    nw_framing_scan s;
    int http11 = req->minor_version == 1;

    memset(&s, 0, sizeof s);
    f->body = NW_BODY_NONE;
    f->content_length = -1;
    f->length_padded = 0;
    f->keep_alive = http11;
    f->expect_continue = 0;
    f->options_asterisk = 0;
    f->error_status = 0;
    f->error_reason = NULL;

    for (size_t i = 0; i < req->num_headers; i++) {
        int r = scan_header(&s, &req->headers[i]);
        if (r == NW_LENGTH_TOO_LARGE)   /* a valid length no one can send us */
            return framing_fail(f, 413, "Content-Length too large");
        if (r != 0)
            return framing_fail(f, 400, "bad Content-Length");
    }
    if (s.hosts > 1)
        return framing_fail(f, 400, "more than one Host");
    if (http11 && s.hosts == 0)
        return framing_fail(f, 400, "missing Host");
    if (s.bad_host)
        return framing_fail(f, 400, "bad Host");
    if (req->authority && (req->authority_len == 0
                           || !nw_http_host_valid(req->authority, req->authority_len)))
        return framing_fail(f, 400, "bad authority in the request-target");
    if (req->path_len == 0 || req->path[0] != '/') {
        /* not origin-form (RFC 9112 3.2): absolute-form, "*" for OPTIONS
         * (answered by the server), nothing else; CONNECT (authority-form)
         * is not implemented */
        if (req->method_len == 7 && memcmp(req->method, "CONNECT", 7) == 0)
            return framing_fail(f, 501, "CONNECT");
        if (req->authority) {
            /* "http://h" or "http://h?q": PATH_INFO is empty */
        } else if (req->target_len == 1 && req->target[0] == '*'
                   && req->method_len == 7 && memcmp(req->method, "OPTIONS", 7) == 0) {
            f->options_asterisk = 1;
        } else {
            return framing_fail(f, 400, "bad request-target form");
        }
    } else if (req->method_len == 7 && memcmp(req->method, "CONNECT", 7) == 0) {
        return framing_fail(f, 501, "CONNECT");
    }
    if (s.have_te && !http11)
        return framing_fail(f, 400, "Transfer-Encoding in HTTP/1.0");
    if (s.have_te && s.have_cl)
        return framing_fail(f, 400, "Content-Length with Transfer-Encoding");
    if (s.have_te && !s.te_last_chunked)   /* RFC 9112 6.3: no length can be known */
        return framing_fail(f, 400, "chunked is not the final transfer coding");
    if (s.have_te && (s.te_codings != 1 || s.te_other))
        return framing_fail(f, 501, "Transfer-Encoding other than chunked");
    if (s.expect_other)
        return framing_fail(f, 417, "unsupported expectation");

    if (s.have_te) {
        f->body = NW_BODY_CHUNKED;
    } else if (s.have_cl) {
        f->body = NW_BODY_LENGTH;
        f->content_length = s.cl;
        f->length_padded = s.cl_padded;
    }
    f->keep_alive = !s.conn_close && (http11 || s.conn_keep_alive);
    f->expect_continue = http11 && s.expect_continue;
    return 0;
}

/* ---------------------------------------------------------------- chunked */

enum {
    NW_CK_SIZE_FIRST = 0,   /* first hex digit of chunk-size */
    NW_CK_SIZE,             /* more digits, BWS, ';', or the line ending */
    NW_CK_SIZE_BWS,         /* whitespace after the size: ';' must follow */
    NW_CK_EXT,              /* chunk extensions, up to the line ending */
    NW_CK_SIZE_LF,          /* CR seen on the size line */
    NW_CK_DATA,             /* chunk-data */
    NW_CK_DATA_CR,          /* line ending after chunk-data */
    NW_CK_DATA_LF,          /* CR seen after chunk-data */
    NW_CK_TRAILER,          /* start of a trailer line (or of the final one) */
    NW_CK_TRAILER_NAME,
    NW_CK_TRAILER_VALUE,
    NW_CK_TRAILER_LF,       /* CR seen at the end of a trailer field line */
    NW_CK_FINAL_LF,         /* CR seen on the final empty line */
    NW_CK_DONE,
    NW_CK_FAILED,
    NW_CK_FAILED_TOO_LARGE
};

void nw_chunked_init(nw_chunked *d, uint64_t max_payload, size_t max_trailer_bytes)
{
    memset(d, 0, sizeof *d);
    d->state = NW_CK_SIZE_FIRST;
    d->max_payload = max_payload;
    d->max_trailer_bytes = max_trailer_bytes;
}

/* The chunk-size line ended. */
static int chunk_size_done(nw_chunked *d)
{
    if (d->chunk_left == 0) {
        d->state = NW_CK_TRAILER;
        d->line_len = 0;            /* from now on: trailer bytes */
        return 0;
    }
    if (d->max_payload && (d->payload > d->max_payload
                           || d->chunk_left > d->max_payload - d->payload))
        return NW_CHUNKED_TOO_LARGE;
    d->state = NW_CK_DATA;
    return 0;
}

/* One byte of a chunk-size line: size, BWS, extensions, line ending. */
static int chunk_size_byte(nw_chunked *d, unsigned char b)
{
    unsigned v = hexval[b];
    if (d->state == NW_CK_SIZE_LF)
        return b == '\n' ? chunk_size_done(d) : NW_CHUNKED_ERROR;
    if (b != '\r' && b != '\n' && ++d->line_len > NW_MAX_CHUNK_LINE)
        return NW_CHUNKED_ERROR;
    switch (d->state) {
    case NW_CK_SIZE_FIRST:
        if (v == NW_NOT_HEX)
            return NW_CHUNKED_ERROR;
        d->chunk_left = v;
        d->state = NW_CK_SIZE;
        return 0;
    case NW_CK_SIZE:            /* leading zeros are as good as none */
        if (v != NW_NOT_HEX) {
            if (d->chunk_left > UINT64_MAX >> 4)
                return NW_CHUNKED_TOO_LARGE;    /* more than anyone can send */
            d->chunk_left = (d->chunk_left << 4) | v;
            return 0;
        }
        if (b == ';') { d->state = NW_CK_EXT; return 0; }
        if (b == ' ' || b == '\t') { d->state = NW_CK_SIZE_BWS; return 0; }
        break;
    case NW_CK_SIZE_BWS:
        if (b == ';') { d->state = NW_CK_EXT; return 0; }
        if (b == ' ' || b == '\t') return 0;
        return NW_CHUNKED_ERROR;
    case NW_CK_EXT:
        if (NW_IS(b, NW_C_VALUE)) return 0;
        break;
    }
    if (b == '\r') { d->state = NW_CK_SIZE_LF; return 0; }
    if (b == '\n') return chunk_size_done(d);
    return NW_CHUNKED_ERROR;
}

/* One byte of the trailer section or of the final empty line. */
static int chunk_trailer_byte(nw_chunked *d, unsigned char b)
{
    if (d->state == NW_CK_FINAL_LF) {
        if (b != '\n')
            return NW_CHUNKED_ERROR;
        d->state = NW_CK_DONE;
        return 0;
    }
    if (d->state == NW_CK_TRAILER && (b == '\r' || b == '\n')) {
        d->state = b == '\r' ? NW_CK_FINAL_LF : NW_CK_DONE;
        return 0;
    }
    if (++d->line_len > d->max_trailer_bytes)
        return NW_CHUNKED_ERROR;
    switch (d->state) {
    case NW_CK_TRAILER:         /* SP/HTAB here would be obs-fold */
        if (!NW_IS(b, NW_C_TCHAR)) return NW_CHUNKED_ERROR;
        d->state = NW_CK_TRAILER_NAME;
        return 0;
    case NW_CK_TRAILER_NAME:
        if (b == ':') d->state = NW_CK_TRAILER_VALUE;
        else if (!NW_IS(b, NW_C_TCHAR)) return NW_CHUNKED_ERROR;
        return 0;
    case NW_CK_TRAILER_VALUE:
        if (b == '\r') d->state = NW_CK_TRAILER_LF;
        else if (b == '\n') d->state = NW_CK_TRAILER;
        else if (!NW_IS(b, NW_C_VALUE)) return NW_CHUNKED_ERROR;
        return 0;
    case NW_CK_TRAILER_LF:
        if (b != '\n') return NW_CHUNKED_ERROR;
        d->state = NW_CK_TRAILER;
        return 0;
    }
    return NW_CHUNKED_ERROR;
}

/* The line ending after chunk-data: CRLF, or a lone LF. */
static int chunk_data_end(nw_chunked *d, unsigned char b)
{
    if (d->state == NW_CK_DATA_CR && b == '\r') {
        d->state = NW_CK_DATA_LF;
        return 0;
    }
    if (b != '\n')
        return NW_CHUNKED_ERROR;
    d->state = NW_CK_SIZE_FIRST;
    d->line_len = 0;
    return 0;
}

/* One framing byte (anything but chunk-data). */
static int chunk_byte(nw_chunked *d, unsigned char b)
{
    switch (d->state) {
    case NW_CK_DATA_CR: case NW_CK_DATA_LF:
        return chunk_data_end(d, b);
    case NW_CK_SIZE_FIRST: case NW_CK_SIZE: case NW_CK_SIZE_BWS:
    case NW_CK_EXT: case NW_CK_SIZE_LF:
        return chunk_size_byte(d, b);
    default:
        return chunk_trailer_byte(d, b);
    }
}

/* Copy as much chunk-data as there is; returns the input bytes taken. */
static size_t chunk_data(nw_chunked *d, const char *in, size_t n, char *out)
{
    if (n > d->chunk_left)
        n = (size_t)d->chunk_left;
    if (out != in)
        memmove(out, in, n);
    d->chunk_left -= n;
    d->payload += n;
    if (d->chunk_left == 0)
        d->state = NW_CK_DATA_CR;
    return n;
}

long nw_chunked_decode(nw_chunked *d, const char *in, size_t in_len,
                       char *out, size_t *out_len)
{
    size_t i = 0, o = 0;
    int r = 0;
    *out_len = 0;
    if (d->state == NW_CK_FAILED)
        return NW_CHUNKED_ERROR;
    if (d->state == NW_CK_FAILED_TOO_LARGE)
        return NW_CHUNKED_TOO_LARGE;
    if (in_len > (size_t)LONG_MAX)
        in_len = (size_t)LONG_MAX;
    while (i < in_len && d->state != NW_CK_DONE) {
        if (d->state == NW_CK_DATA) {
            size_t n = chunk_data(d, in + i, in_len - i, out + o);
            i += n;
            o += n;
            continue;
        }
        if (++d->overhead > d->payload + NW_CHUNK_OVERHEAD_ALLOWANCE) {
            r = NW_CHUNKED_ERROR;
            break;
        }
        if ((r = chunk_byte(d, (unsigned char)in[i++])) != 0)
            break;
    }
    *out_len = o;
    if (r != 0) {
        d->state = r == NW_CHUNKED_TOO_LARGE ? NW_CK_FAILED_TOO_LARGE
                                             : NW_CK_FAILED;
        return r;
    }
    d->done = d->state == NW_CK_DONE;
    return (long)i;
}

/* ------------------------------------------------------- percent-decoding */

size_t nw_percent_decode(const char *in, size_t len, char *out)
{
    size_t i = 0, o = 0;
    while (i < len) {
        unsigned char c = (unsigned char)in[i];
        if (c == '%' && len - i >= 3) {
            unsigned hi = hexval[(unsigned char)in[i + 1]];
            unsigned lo = hexval[(unsigned char)in[i + 2]];
            if (hi != NW_NOT_HEX && lo != NW_NOT_HEX) {
                out[o++] = (char)(hi << 4 | lo);
                i += 3;
                continue;
            }
        }
        out[o++] = (char)c;
        i++;
    }
    return o;
}

int nw_http_is_token(const char *p, size_t n)
{
    if (n == 0)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!(ctype[(unsigned char)p[i]] & NW_C_TCHAR))
            return 0;
    return 1;
}

size_t nw_http_head_end(const char *p, size_t len, nw_head_scan *s)
{
    size_t i;
    if (s->scanned == 0) {
        int bad;
        i = s->start + nw_http_empty_lines(p + s->start, len - s->start, &bad);
        s->start = i;
        if (i == len || (!bad && i + 1 == len && p[i] == '\r'))
            return 0;           /* only empty lines so far */
    } else {
        /* an end can straddle the last call's bytes by two (LF CR | LF) */
        i = s->scanned >= s->start + 2 ? s->scanned - 2 : s->start;
    }
    while (i < len) {
        const char *lf = memchr(p + i, '\n', len - i);
        if (!lf)
            break;
        size_t j = (size_t)(lf - p);
        if (j + 1 < len && p[j + 1] == '\n')
            return j + 2;
        if (j + 2 < len && p[j + 1] == '\r' && p[j + 2] == '\n')
            return j + 3;
        i = j + 1;
    }
    s->scanned = len;
    return 0;
}

int nw_http_line_can_start(const char *p, size_t len)
{
    static const char version[] = "HTTP/d.d";
    size_t n;
    int bad;
    size_t i = nw_http_empty_lines(p, len, &bad);
    if (bad)
        return 0;           /* a bare CR: 400 */
    if (i + 1 == len && p[i] == '\r')
        return 1;           /* the start of one more empty line, maybe */
    for (n = 0; i < len && NW_IS(p[i], NW_C_TCHAR); i++)
        if (++n > NW_MAX_METHOD_LEN)
            return 0;
    if (i == len)
        return 1;
    if (n == 0 || p[i++] != ' ')
        return 0;
    for (n = 0; i < len && NW_IS(p[i], NW_C_VCHAR); i++)
        n++;
    if (i == len)
        return 1;
    if (n == 0 || p[i++] != ' ')
        return 0;
    for (n = 0; i < len && n < sizeof version - 1; i++, n++) {
        char want = version[n];
        if (want == 'd' ? !(p[i] >= '0' && p[i] <= '9') : p[i] != want)
            return 0;
    }
    return i == len || p[i] == '\r' || p[i] == '\n';
}

static const char *moved(const char *p, uintptr_t from, const char *to)
{
    return p ? to + ((uintptr_t)p - from) : NULL;
}

void nw_http_request_moved(nw_request *req, uintptr_t from, const char *to)
{
    req->method = moved(req->method, from, to);
    req->target = moved(req->target, from, to);
    req->path = moved(req->path, from, to);
    req->query = moved(req->query, from, to);
    req->authority = moved(req->authority, from, to);
    for (size_t i = 0; i < req->num_headers; i++) {
        req->headers[i].name = moved(req->headers[i].name, from, to);
        req->headers[i].value = moved(req->headers[i].value, from, to);
    }
}
