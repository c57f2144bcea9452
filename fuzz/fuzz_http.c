/* libFuzzer harness for src/shared/nw_http.c.
 *
 * The input is parsed as a request head. On success: framing, percent-
 * decoding of the path, and the rest of the input goes to the chunked
 * decoder; otherwise the whole input goes to the chunked decoder. The
 * decoder runs on one piece, on two pieces split at a point taken from the
 * input (in place), and byte by byte; all three must agree. Invariants of
 * the API are checked with abort(), so a broken one is reported as a crash.
 *
 * Build and run: make -f fuzz.mk run, from fuzz/ (see fuzz/README.md).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "nw_http.h"

#define FZ_MAX_HEADERS      16
#define FZ_MAX_PAYLOAD      65536
#define FZ_MAX_TRAILER      128
#define FZ_BYTEWISE_MAX     4096    /* byte-by-byte decoding up to this size */

static const nw_parse_limits fz_limits = { 512, 2048, FZ_MAX_HEADERS };

#define FZ_CHECK(cond) do { if (!(cond)) abort(); } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* p[0..n) lies inside [lo, lo + len). */
static int fz_inside(const char *p, size_t n, const char *lo, size_t len)
{
    return p != NULL && p >= lo && n <= len && (size_t)(p - lo) <= len - n;
}

static int fz_ows(char c)
{
    return c == ' ' || c == '\t';
}

static void fz_check_request(const nw_request *req, const char *buf, size_t n)
{
    size_t i;

    FZ_CHECK(req->method_len >= 1 && req->method_len <= NW_MAX_METHOD_LEN);
    FZ_CHECK(fz_inside(req->method, req->method_len, buf, n));
    FZ_CHECK(req->target_len >= 1 && req->target_len <= fz_limits.max_request_line);
    FZ_CHECK(fz_inside(req->target, req->target_len, buf, n));
    FZ_CHECK(fz_inside(req->path, req->path_len, req->target, req->target_len));
    if (req->query) {
        FZ_CHECK(fz_inside(req->query, req->query_len, req->target, req->target_len));
        FZ_CHECK(req->query[-1] == '?');
        FZ_CHECK(memchr(req->target, '?', (size_t)(req->query - req->target) - 1) == NULL);
    } else {
        FZ_CHECK(req->query_len == 0);
        FZ_CHECK(memchr(req->target, '?', req->target_len) == NULL);
    }
    FZ_CHECK(req->minor_version == 0 || req->minor_version == 1);
    FZ_CHECK(req->num_headers <= FZ_MAX_HEADERS);
    for (i = 0; i < req->num_headers; i++) {
        const nw_header *h = &req->headers[i];
        FZ_CHECK(h->name_len >= 1 && fz_inside(h->name, h->name_len, buf, n));
        FZ_CHECK(fz_inside(h->value, h->value_len, buf, n));
        FZ_CHECK(h->name[h->name_len] == ':');
        if (h->value_len)
            FZ_CHECK(!fz_ows(h->value[0]) && !fz_ows(h->value[h->value_len - 1]));
        FZ_CHECK(memchr(h->value, '\r', h->value_len) == NULL);
        FZ_CHECK(memchr(h->value, '\n', h->value_len) == NULL);
        FZ_CHECK(memchr(h->value, '\0', h->value_len) == NULL);
    }
}

static void fz_check_framing(const nw_request *req)
{
    nw_framing f;
    int rc = nw_http_framing(req, &f);

    FZ_CHECK(rc == 0 || rc == 400 || rc == 413 || rc == 417 || rc == 501);
    FZ_CHECK(f.error_status == rc);
    if (rc != 0) {
        FZ_CHECK(f.error_reason != NULL);
        return;
    }
    FZ_CHECK(f.body == NW_BODY_NONE || f.body == NW_BODY_LENGTH
             || f.body == NW_BODY_CHUNKED);
    if (f.body == NW_BODY_LENGTH)
        FZ_CHECK(f.content_length >= 0);    /* (any int64: the value is bounded, not its digits) */
    else
        FZ_CHECK(f.content_length == -1);
    FZ_CHECK(f.keep_alive == 0 || f.keep_alive == 1);
    FZ_CHECK(f.length_padded == 0 || (f.length_padded == 1 && f.body == NW_BODY_LENGTH));
    FZ_CHECK(f.expect_continue == 0 || f.expect_continue == 1);
}

static void fz_check_percent(const nw_request *req)
{
    char *out = malloc(req->path_len ? req->path_len : 1);
    size_t n;

    FZ_CHECK(out != NULL);
    n = nw_percent_decode(req->path, req->path_len, out);
    FZ_CHECK(n <= req->path_len);
    free(out);
}

typedef struct {
    long ret;               /* total consumed, or the decoder's error */
    int done;
    size_t out_len;
    char *out;              /* all decoded payload, room for the input size */
} fz_decoded;

/* Decode in[0..n) fed in pieces of at most `step` bytes (0: one piece),
 * except that the first piece ends at `split`. */
static void fz_decode(const char *in, size_t n, size_t split, size_t step,
                      int in_place, fz_decoded *res)
{
    char *buf = malloc(n ? n : 1), *scratch = malloc(n ? n : 1);
    nw_chunked d;
    size_t start = 0;

    FZ_CHECK(buf != NULL && scratch != NULL);
    memcpy(buf, in, n);
    nw_chunked_init(&d, FZ_MAX_PAYLOAD, FZ_MAX_TRAILER);
    res->ret = 0;
    res->out_len = 0;
    while (start < n) {
        size_t end = start == 0 && split ? split : (step ? start + step : n), got = 0;
        char *out = in_place ? buf + start : scratch;
        long r;

        if (end > n)
            end = n;
        r = nw_chunked_decode(&d, buf + start, end - start, out, &got);
        if (r < 0) {
            FZ_CHECK(r == NW_CHUNKED_ERROR || r == NW_CHUNKED_TOO_LARGE);
            res->ret = r;
            break;
        }
        FZ_CHECK((size_t)r <= end - start && got <= (size_t)r);
        FZ_CHECK((size_t)r == end - start || d.done);
        memcpy(res->out + res->out_len, out, got);
        res->out_len += got;
        res->ret += r;
        if (d.done)
            break;
        start = end;
    }
    res->done = d.done;
    if (res->ret >= 0) {
        FZ_CHECK(d.payload == res->out_len);
        FZ_CHECK(d.payload + d.overhead == (uint64_t)res->ret);
        FZ_CHECK(d.payload <= FZ_MAX_PAYLOAD);
        FZ_CHECK(d.overhead <= d.payload + NW_CHUNK_OVERHEAD_ALLOWANCE);
    }
    free(buf);
    free(scratch);
}

static void fz_same(const fz_decoded *a, const fz_decoded *b)
{
    FZ_CHECK(a->ret == b->ret);
    if (a->ret < 0)
        return;
    FZ_CHECK(a->done == b->done);
    FZ_CHECK(a->out_len == b->out_len);
    FZ_CHECK(memcmp(a->out, b->out, a->out_len) == 0);
}

static void fz_chunked(const char *in, size_t n, size_t split)
{
    fz_decoded whole, parts, bytes;

    whole.out = malloc(n ? n : 1);
    parts.out = malloc(n ? n : 1);
    bytes.out = malloc(n ? n : 1);
    FZ_CHECK(whole.out && parts.out && bytes.out);

    fz_decode(in, n, 0, 0, 0, &whole);
    fz_decode(in, n, split, 0, 1, &parts);
    fz_same(&whole, &parts);
    if (n <= FZ_BYTEWISE_MAX) {
        fz_decode(in, n, 0, 1, 0, &bytes);
        fz_same(&whole, &bytes);
    }
    free(whole.out);
    free(parts.out);
    free(bytes.out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *buf = (const char *)data;
    nw_header headers[FZ_MAX_HEADERS];
    nw_request req;
    size_t rest = 0, split;
    int r;

    r = nw_http_parse_head(buf, size, &req, headers, &fz_limits);
    if (r == NW_PARSE_ERROR) {
        FZ_CHECK(req.error_status == 400 || req.error_status == 414
                 || req.error_status == 431 || req.error_status == 505);
        FZ_CHECK(req.error_reason != NULL);
    } else if (r != NW_PARSE_INCOMPLETE) {
        FZ_CHECK(r > 0 && (size_t)r <= size && (size_t)r <= fz_limits.max_header_bytes);
        fz_check_request(&req, buf, (size_t)r);
        fz_check_framing(&req);
        fz_check_percent(&req);
        /* Every proper prefix of a complete head is incomplete. */
        FZ_CHECK(nw_http_parse_head(buf, (size_t)r - 1, &req, headers, &fz_limits)
                 == NW_PARSE_INCOMPLETE);
        rest = (size_t)r;
    } else {
        FZ_CHECK(size < fz_limits.max_header_bytes);
    }

    split = size ? data[size - 1] % (size - rest + 1) : 0;
    fz_chunked(buf + rest, size - rest, split);
    return 0;
}
