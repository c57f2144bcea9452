/* HTTP/1.x request parsing: the request head, its framing, chunked bodies
 * and percent-decoding. Stateless where it can be, never allocates, never
 * reads past the length it is given. RFC 9112 is the reference. */
#ifndef NW_HTTP_H
#define NW_HTTP_H

#include <stddef.h>
#include <stdint.h>
#include "nw_limits.h"

/* Results of nw_http_parse_head. Every family of results in src/ has a
 * range of its own (parse -1..-2, I/O -11.., requests -21.., chunked
 * -41..), so a value can never be read as another family's. */
#define NW_PARSE_INCOMPLETE  (-2)   /* need more bytes */
#define NW_PARSE_ERROR       (-1)   /* req->error_status says which 4xx/5xx */

typedef struct {
    const char *name;   size_t name_len;    /* as sent; matching is case-insensitive */
    const char *value;  size_t value_len;   /* leading and trailing OWS stripped */
} nw_header;

typedef struct {
    size_t max_request_line;    /* over it: 414 */
    size_t max_header_bytes;    /* whole head, request line included; over it: 431 */
    size_t max_headers;         /* over it: 431 (must be <= the headers array size) */
} nw_parse_limits;

typedef struct {
    const char *method;  size_t method_len;
    const char *target;  size_t target_len;   /* request-target, raw */
    const char *path;    size_t path_len;     /* target up to '?' (absolute-form: the path part) */
    const char *query;   size_t query_len;    /* after '?', without it; query == NULL if no '?' */
    const char *authority; size_t authority_len; /* absolute-form: host[:port] of the target
                                               * (userinfo dropped); NULL otherwise */
    int minor_version;                        /* HTTP/1.<minor>: 0 or 1 */
    nw_header *headers;  size_t num_headers;
    int error_status;                         /* set when NW_PARSE_ERROR is returned */
    const char *error_reason;                 /* short static text for the log */
} nw_request;

/* Parse one request head from buf[0..len). headers points at an array of
 * limits->max_headers entries. Returns the length of the head including the
 * blank line (> 0), NW_PARSE_INCOMPLETE, or NW_PARSE_ERROR with
 * req->error_status one of 400, 414, 431, 505.
 * Incomplete input that already exceeds a limit is an error, not incomplete. */
int nw_http_parse_head(const char *buf, size_t len, nw_request *req,
                       nw_header *headers, const nw_parse_limits *limits);

/* The head req was parsed from moved (the buffer grew, reading the body):
 * its bytes, which were at address `from`, are now at `to`. Every pointer
 * in req (and its headers) is moved with them. `from` is taken as a number
 * before the buffer moves: the old block is not read. */
void nw_http_request_moved(nw_request *req, uintptr_t from, const char *to);

/* Body framing and connection semantics, from the parsed headers. */
enum nw_body_kind { NW_BODY_NONE = 0, NW_BODY_LENGTH = 1, NW_BODY_CHUNKED = 2 };

typedef struct {
    enum nw_body_kind body;
    int64_t content_length;     /* NW_BODY_LENGTH: the length; otherwise -1 */
    int length_padded;          /* ... spelt with leading zeros ("005"): the value,
                                   not the spelling, is what CONTENT_LENGTH says */
    int keep_alive;             /* the client allows reuse: 1.1 without "close",
                                   1.0 with "keep-alive" */
    int expect_continue;        /* Expect: 100-continue was sent */
    int options_asterisk;       /* "OPTIONS *": the server answers it, not the app */
    int error_status;           /* set when nw_http_framing returns non-zero */
    const char *error_reason;
} nw_framing;

/* Returns 0, or an HTTP status (400, 413, 417, 501) also stored in f->error_status.
 * Enforces: Content-Length digits only (a value over INT64_MAX is 413), and at most one Content-Length line
 * (two, even with the same value, are 400 as "5, 5" is); Content-Length
 * together with Transfer-Encoding is 400; a Transfer-Encoding whose last
 * coding is not "chunked" is 400 (RFC 9112 6.3), one with codings before
 * a final "chunked" (or "chunked" twice) is 501; Transfer-Encoding in HTTP/1.0 is 400; HTTP/1.1
 * without exactly one Host, more than one Host, or a Host value that is
 * not host[:port] is 400; an Expect other than 100-continue is 417.
 * The request-target must be origin-form ("/..."), absolute-form with a
 * valid host[:port], or "*" with OPTIONS (options_asterisk set); other
 * forms are 400, and CONNECT is 501 whatever its target. */
int nw_http_framing(const nw_request *req, nw_framing *f);

/* Chunked transfer coding, incremental. */
typedef struct {
    int state;                  /* private */
    uint64_t chunk_left;        /* private */
    size_t line_len;            /* private */
    uint64_t payload;           /* payload bytes decoded so far */
    uint64_t overhead;          /* framing bytes consumed so far */
    uint64_t max_payload;       /* 0: no limit; over it: NW_CHUNKED_TOO_LARGE */
    size_t max_trailer_bytes;   /* trailer section limit */
    int done;                   /* 1 once the last chunk and trailers are consumed */
} nw_chunked;

#define NW_CHUNKED_ERROR      (-41) /* malformed: 400 */
#define NW_CHUNKED_TOO_LARGE  (-43) /* payload over max_payload: 413 */

void nw_chunked_init(nw_chunked *d, uint64_t max_payload, size_t max_trailer_bytes);

/* Consume in[0..in_len); decoded payload goes to out (room for in_len bytes;
 * out == in is allowed), its length to *out_len. Returns the number of input
 * bytes consumed (stops right after the message when d->done becomes 1, so
 * pipelined bytes are left), or NW_CHUNKED_ERROR / NW_CHUNKED_TOO_LARGE. */
long nw_chunked_decode(nw_chunked *d, const char *in, size_t in_len,
                       char *out, size_t *out_len);

/* Percent-decoding for PATH_INFO: %XX becomes the byte, anything else
 * (including a malformed %) is copied. out has room for len bytes.
 * Returns the decoded length. */
size_t nw_percent_decode(const char *in, size_t len, char *out);

/* Finding where a request head ends while it arrives in pieces: the one
 * scanner both the worker (nw_conn.c) and the manager (nw_mgr_heads.c) use.
 * Empty lines before the request line are skipped (RFC 9112 2.2, the
 * rule of nw_http_empty_lines; from a bare CR on, the bytes are searched
 * as a head, which the parser refuses); the head ends with an empty line,
 * LF LF or LF CR LF (a bare LF ends a line
 * as CRLF does; the parser decides what is valid). Zero the state for a
 * new head; each call searches only bytes it has not searched before. */
typedef struct {
    size_t start;       /* the first byte after leading empty lines */
    size_t scanned;     /* bytes searched already; 0: still in the empty lines */
} nw_head_scan;

/* The offset just past the head's empty line in p[0..len), or 0 when it
 * has not arrived yet. p holds every byte given before, and more. */
size_t nw_http_head_end(const char *p, size_t len, nw_head_scan *s);

/* Whether the bytes of a head received so far can still begin a request
 * line: a method (token characters, at most NW_MAX_METHOD_LEN), SP, a
 * target (visible characters), SP, "HTTP/d.d" and the line end. Empty
 * lines before it are allowed. A TLS handshake, a PROXY protocol line or
 * other bytes that are not HTTP are refused at once (400) instead of
 * waiting for a head that will never end. */
int nw_http_line_can_start(const char *p, size_t len);

/* What may precede a request line (RFC 9112 2.2), the one rule the parser,
 * the worker and the manager apply: empty lines, each CRLF or a lone LF.
 * Returns the length of the complete empty lines at the start of p[0..len)
 * (a CR that is the last byte is not counted: its LF may follow). *bad is
 * set to 1 when a CR there is followed by anything but LF: a bare CR,
 * which makes the request a 400 whatever comes after it. Dropping these
 * bytes before a head changes nothing about the head. */
size_t nw_http_empty_lines(const char *p, size_t len, int *bad);

/* A Content-Length value (RFC 9110 8.6: 1*DIGIT) into *out. The value is
 * bounded, not its spelling: leading zeros are as good as none. Returns 0,
 * NW_LENGTH_INVALID (empty, or not digits only: 400) or
 * NW_LENGTH_TOO_LARGE (over INT64_MAX: 413). */
#define NW_LENGTH_INVALID    (-1)
#define NW_LENGTH_TOO_LARGE  (-2)
int nw_http_parse_length(const char *v, size_t n, int64_t *out);

/* 1 when v[0..n) is a valid Host value: uri-host [":" port] (RFC 3986),
 * or empty. */
int nw_http_host_valid(const char *v, size_t n);

/* 1 when p[0..n) is a non-empty token (RFC 9110 5.6.2), e.g. a field name. */
int nw_http_is_token(const char *p, size_t n);

/* Case-insensitive compare of a header name with a lower-case literal. */
int nw_header_is(const nw_header *h, const char *lower_name, size_t lower_len);

#endif
