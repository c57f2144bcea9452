/* Building response heads: status line, app headers (validated), the
 * headers Narwhal adds (Date, Content-Length, Transfer-Encoding,
 * Connection), and the choice of body framing. */
#ifndef NW_RESPONSE_H
#define NW_RESPONSE_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>
#include "nw_buf.h"

enum nw_out_framing {
    NW_OUT_NONE = 0,     /* no body may be sent: HEAD, 1xx, 204, 304 */
    NW_OUT_LENGTH = 1,   /* Content-Length */
    NW_OUT_CHUNKED = 2,  /* Transfer-Encoding: chunked (HTTP/1.1) */
    NW_OUT_CLOSE = 3     /* body ends when the connection closes */
};

/* What the app's headers said, gathered while they are copied. */
typedef struct {
    int has_date;
    int has_content_length;
    int64_t content_length;     /* valid when has_content_length */
    int has_transfer_encoding;  /* (then no Content-Length is sent: RFC 9112 6.2) */
    int te_chunked;             /* ... and its last coding is chunked: Narwhal
                                 * frames the body in chunks (else: by close) */
    int wants_close;            /* app sent Connection: close */
    int bodiless;               /* set by the caller for 1xx and 204: the app's
                                 * Content-Length and Transfer-Encoding are
                                 * checked and dropped (RFC 9110 8.6, RFC 9112 6.1) */
    int http10;                 /* set by the caller for an HTTP/1.0 request: the
                                 * app's Transfer-Encoding is dropped (RFC 9112 6.1) */
} nw_app_headers;

/* Reason phrase for a status ("Unknown" when there is none). */
const char *nw_status_reason(int status, size_t *len);

/* "Date: ...\r\n", refreshed at most once a second. Length via *len. */
const char *nw_date_header(size_t *len);

/* "Date: Sun, 06 Nov 1994 08:49:37 GMT\r\n" (IMF-fixdate, RFC 9110
 * 5.6.7) for t into out, which has room for NW_DATE_FIELD_LEN bytes.
 * Arithmetic only (no locale, time zone or lock), so a signal handler may
 * call it: every response has a Date, the server's own answers too (RFC
 * 9110 6.6.1). Returns NW_DATE_FIELD_LEN. */
#define NW_DATE_FIELD_LEN 37
size_t nw_date_field(char *out, time_t t);

/* 1 when the field name is a token and the value has no CR, LF or NUL. */
int nw_header_valid(const char *name, size_t nlen, const char *val, size_t vlen);

/* Append "HTTP/1.x NNN Reason\r\n". */
int nw_head_status(nw_buf *b, int minor, int status);

/* Append one app header and note what it means in *seen.
 * Returns 0, or -1 when it is invalid (the caller answers 500). */
int nw_head_app_header(nw_buf *b, nw_app_headers *seen, const char *name,
                       size_t nlen, const char *val, size_t vlen);

/* Decide framing and append the headers Narwhal adds and the blank line.
 * known_length is the body length when the server knows it (array bodies,
 * files), else -1. The app's Transfer-Encoding decides over any length: a
 * last coding "chunked" is Narwhal's to apply (the app's body is sent in
 * chunks), any other ends the body by closing; the app's Content-Length
 * is then taken out of the head and none is added. keep_alive is in/out:
 * in, whether the connection may stay open; out, whether it will.
 * Returns the framing. */
int nw_head_finish(nw_buf *b, const nw_app_headers *seen,
                   int minor, int status, int is_head,
                   int64_t known_length, int *keep_alive);

/* A small complete error response with Connection: close. */
int nw_head_error(nw_buf *b, int status);

/* The methods Narwhal passes to an app (any other token method is passed
 * too; CONNECT is refused with 501): the Allow of its answer to
 * "OPTIONS *", which asks about the server, not a resource. */
#define NW_SERVER_METHODS "GET, HEAD, POST, PUT, DELETE, PATCH, OPTIONS"

/* The server's answer to "OPTIONS *" (RFC 9110 9.3.7): 200, Allow,
 * Content-Length: 0, Connection: close. */
int nw_head_options(nw_buf *b);

#endif
