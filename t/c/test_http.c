/* Unit tests for src/shared/nw_http.c, printing TAP.
 *
 * Every input is copied flush against a PROT_NONE page (see guard()), so a
 * read one byte past the given length faults at once. Build and run through
 * t/06-c-units.t, or by hand:
 *   cc -std=gnu99 -g -O1 -Wall -Wextra -Werror -fsanitize=address,undefined \
 *      -Isrc/shared -Isrc/worker -Isrc/manager t/c/test_http.c src/shared/nw_http.c -o /tmp/test_http && /tmp/test_http
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/mman.h>

#include "nw_http.h"
#include "tap.h"

/* A string literal as (pointer, length); embedded NULs kept. */
#define S(lit) (lit), (sizeof(lit) - 1)

/* ------------------------------------------------------------ guard page */

static char *g_map;
static size_t g_map_len, g_page;

/* Copy data so that its last byte is the last readable one. */
static char *guard(const void *data, size_t n)
{
    size_t room = g_map_len ? g_map_len - g_page : 0;
    char *p;

    if (n > room || !g_map) {
        size_t need = (n + g_page - 1) / g_page * g_page;
        if (need == 0)
            need = g_page;
        if (g_map)
            munmap(g_map, g_map_len);
        g_map_len = need + g_page;
        g_map = mmap(NULL, g_map_len, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (g_map == MAP_FAILED) {
            perror("mmap");
            exit(2);
        }
        if (mprotect(g_map + need, g_page, PROT_NONE) != 0) {
            perror("mprotect");
            exit(2);
        }
        room = need;
    }
    p = g_map + room - n;
    if (n)
        memcpy(p, data, n);
    return p;
}

/* ----------------------------------------------------------- head helpers */

static const nw_parse_limits default_limits = {
    NW_DEFAULT_MAX_REQUEST_LINE, NW_DEFAULT_MAX_HEADER_BYTES,
    NW_DEFAULT_MAX_HEADERS
};

static nw_request req;
static nw_header *hdrs;     /* exactly max_headers entries, so ASan sees overruns */

static int parse_lim(const char *s, size_t n, const nw_parse_limits *lim)
{
    free(hdrs);
    hdrs = malloc((lim->max_headers ? lim->max_headers : 1) * sizeof *hdrs);
    memset(&req, 0x5a, sizeof req);
    return nw_http_parse_head(guard(s, n), n, &req, hdrs, lim);
}

static int parse(const char *s, size_t n)
{
    return parse_lim(s, n, &default_limits);
}

/* Expect an error with this status. */
static void parse_err(const char *s, size_t n, int status, const char *name)
{
    int r = parse(s, n);
    if (!ok(r == NW_PARSE_ERROR && req.error_status == status, name))
        diag("returned %d, error_status %d", r,
             r == NW_PARSE_ERROR ? req.error_status : 0);
}

static void parse_ok(const char *s, size_t n, const char *name)
{
    int r = parse(s, n);
    if (!ok(r == (int)n, name))
        diag("returned %d (status %d, %s), expected %zu", r,
             r == NW_PARSE_ERROR ? req.error_status : 0,
             r == NW_PARSE_ERROR ? req.error_reason : "", n);
}

#define PARSE_ERR(lit, status, name) parse_err(S(lit), status, name)
#define PARSE_OK(lit, name) parse_ok(S(lit), name)

/* Every proper prefix is incomplete, the whole is complete. */
static void all_prefixes(const char *s, size_t n, const char *name)
{
    size_t k;
    int bad = 0;
    for (k = 0; k < n; k++) {
        int r = parse(s, k);
        if (r != NW_PARSE_INCOMPLETE) {
            if (!bad)
                diag("prefix of %zu bytes returned %d", k, r);
            bad++;
        }
    }
    ok(!bad && parse(s, n) == (int)n, name);
}

/* --------------------------------------------------------- request line */

static void test_request_line(void)
{
    static const char get[] = "GET /index.html?a=1 HTTP/1.1\r\nHost: example.com\r\n\r\n";
    int r = parse(S(get));
    is(r, sizeof get - 1, "simple GET: whole head consumed");
    is_str(req.method, req.method_len, "GET", "method");
    is_str(req.target, req.target_len, "/index.html?a=1", "target");
    is_str(req.path, req.path_len, "/index.html", "path");
    is_str(req.query, req.query_len, "a=1", "query");
    is(req.minor_version, 1, "minor version 1");
    is(req.num_headers, 1, "one header");
    ok(req.headers == hdrs, "headers points at the array given");
    is_str(req.headers[0].name, req.headers[0].name_len, "Host", "header name as sent");
    is_str(req.headers[0].value, req.headers[0].value_len, "example.com", "header value");

    r = parse(S("POST / HTTP/1.0\r\n\r\nbody"));
    is(r, 19, "HTTP/1.0, no headers; body bytes not consumed");
    is(req.minor_version, 0, "minor version 0");
    is(req.num_headers, 0, "zero headers");

    PARSE_OK("!#$%&'*+-.^_`|~09azAZ / HTTP/1.1\r\n\r\n", "method: every tchar class");
    PARSE_ERR("GE(T / HTTP/1.1\r\n\r\n", 400, "method: '(' is not a tchar");
    PARSE_ERR("GET\t/ HTTP/1.1\r\n\r\n", 400, "method: HTAB separator");
    PARSE_ERR(" / HTTP/1.1\r\n\r\n", 400, "method: empty");
    PARSE_ERR("GE\x80T / HTTP/1.1\r\n\r\n", 400, "method: obs-text");
    PARSE_OK("ABCDEFGHIJKLMNOPQRSTUVWXYZABCDEF / HTTP/1.0\r\n\r\n", "method: 32 chars ok");
    PARSE_ERR("ABCDEFGHIJKLMNOPQRSTUVWXYZABCDEFG / HTTP/1.0\r\n\r\n", 400, "method: 33 chars is 400");
    PARSE_ERR("ABCDEFGHIJKLMNOPQRSTUVWXYZABCDEFG", 400, "method: 33 chars, incomplete, is 400");
    r = parse(S("ABCDEFGHIJKLMNOPQRSTUVWXYZABCDEF"));
    is(r, NW_PARSE_INCOMPLETE, "method: 32 chars, incomplete");

    PARSE_ERR("GET  / HTTP/1.1\r\n\r\n", 400, "two SP after method");
    PARSE_ERR("GET /  HTTP/1.1\r\n\r\n", 400, "two SP after target");
    PARSE_ERR("GET / HTTP/1.1 \r\n\r\n", 400, "SP after version");
    PARSE_ERR("GET /\r\n\r\n", 400, "no version (HTTP/0.9 style)");
    PARSE_ERR("GET / \r\n\r\n", 400, "empty version");
    PARSE_ERR("GET\r\n\r\n", 400, "method only");

    PARSE_ERR("GET /a\x7f HTTP/1.1\r\n\r\n", 400, "target: DEL");
    PARSE_ERR("GET /a\x80 HTTP/1.1\r\n\r\n", 400, "target: obs-text");
    PARSE_ERR("GET /a\tb HTTP/1.1\r\n\r\n", 400, "target: HTAB");
    PARSE_ERR("GET /a\x01 HTTP/1.1\r\n\r\n", 400, "target: control byte");

    PARSE_OK("GET / HTTP/1.0\r\n\r\n", "version HTTP/1.0");
    PARSE_ERR("GET / HTTP/1.2\r\n\r\n", 505, "version HTTP/1.2 is 505");
    PARSE_ERR("GET / HTTP/2.0\r\n\r\n", 505, "version HTTP/2.0 is 505");
    PARSE_ERR("GET / HTTP/0.9\r\n\r\n", 505, "version HTTP/0.9 is 505");
    PARSE_ERR("GET / HTTP/9.9\r\n\r\n", 505, "version HTTP/9.9 is 505");
    PARSE_ERR("GET / HTTP/1.x\r\n\r\n", 400, "version HTTP/1.x is 400");
    PARSE_ERR("GET / http/1.1\r\n\r\n", 400, "version is case-sensitive");
    PARSE_ERR("GET / HTTP/1.10\r\n\r\n", 400, "version HTTP/1.10 is 400");
    PARSE_ERR("GET / HTTP/11\r\n\r\n", 400, "version HTTP/11 is 400");
    PARSE_ERR("GET / HTTP/1,1\r\n\r\n", 400, "version HTTP/1,1 is 400");
    PARSE_ERR("GET / HTTPS/1.1\r\n\r\n", 400, "version HTTPS/1.1 is 400");
    PARSE_ERR("GET / HTTP/1.1x\r\n\r\n", 400, "junk after version");
}

static void test_request_line_limit(void)
{
    nw_parse_limits lim = { 20, 1000, 10 };
    int r;

    /* "GET /aaaaaaa HTTP/1.1" is exactly 21 bytes; "GET /aaaaaa HTTP/1.1" 20. */
    r = parse_lim(S("GET /aaaaaa HTTP/1.1\r\nHost: a\r\n\r\n"), &lim);
    is(r, 33, "request line of exactly max_request_line bytes");
    r = parse_lim(S("GET /aaaaaa HTTP/1.1\n\n"), &lim);
    is(r, 22, "request line of exactly max_request_line bytes, LF");
    r = parse_lim(S("GET /aaaaaaa HTTP/1.1\r\nHost: a\r\n\r\n"), &lim);
    ok(r == NW_PARSE_ERROR && req.error_status == 414, "one byte over max_request_line: 414");
    r = parse_lim(S("GET /aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"), &lim);
    ok(r == NW_PARSE_ERROR && req.error_status == 414, "incomplete and over the limit: 414");
    r = parse_lim(S("GET /aaaaaaa HTTP/1.1"), &lim);
    ok(r == NW_PARSE_ERROR && req.error_status == 414, "incomplete, 21 bytes, no line end: 414");
    r = parse_lim(S("GET /aaaaaa HTTP/1.1"), &lim);
    is(r, NW_PARSE_INCOMPLETE, "incomplete, exactly at the limit: incomplete");
    r = parse_lim(S("GET /aaaaaa HTTP/1.1\r"), &lim);
    is(r, NW_PARSE_INCOMPLETE, "incomplete, at the limit plus CR: incomplete");
    r = parse_lim(S("\r\n\r\nGET /aaaaaa HTTP/1.1\r\n\r\n"), &lim);
    is(r, 28, "leading empty lines do not count toward max_request_line");
    r = parse(S("GET /" "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"));
    is(r, NW_PARSE_INCOMPLETE, "long incomplete target under the default limit");
}

static void test_leading_lines(void)
{
    int r = parse(S("\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n"));
    is(r, 31, "leading CRLFs skipped and counted");
    is_str(req.method, req.method_len, "GET", "method after leading CRLFs");
    r = parse(S("\n\nGET / HTTP/1.1\r\nHost: a\r\n\r\n"));
    is(r, 29, "leading LFs skipped and counted");
    PARSE_ERR("\rGET / HTTP/1.1\r\n\r\n", 400, "leading bare CR");
    r = parse(S("\r\n\r\n"));
    is(r, NW_PARSE_INCOMPLETE, "only empty lines: incomplete");
    r = parse(S("\r"));
    is(r, NW_PARSE_INCOMPLETE, "lone CR at end: incomplete");
    r = parse(S(""));
    is(r, NW_PARSE_INCOMPLETE, "empty input: incomplete");
}

static void test_line_endings(void)
{
    int r = parse(S("GET / HTTP/1.1\nHost: a\nX: b\n\n"));
    is(r, 29, "lone LF accepted everywhere");
    is(req.num_headers, 2, "lone LF: both headers");
    is_str(req.headers[1].value, req.headers[1].value_len, "b", "lone LF: value");
    r = parse(S("GET / HTTP/1.1\r\nHost: a\n\r\n"));
    is(r, 26, "mixed CRLF and LF");
    PARSE_ERR("GET / HTTP/1.1\rHost: a\r\n\r\n", 400, "bare CR after request line");
    PARSE_ERR("GET / HTTP/1.1\r\nHost: a\rb\r\n\r\n", 400, "bare CR inside a value");
    PARSE_ERR("GET / HTTP/1.1\r\nHost: a\r\n\rX", 400, "bare CR on the final line");
    PARSE_ERR("GET /\r HTTP/1.1\r\n\r\n", 400, "bare CR in target");
    PARSE_ERR("GE\rT / HTTP/1.1\r\n\r\n", 400, "bare CR in method");
    PARSE_ERR("GET / HTTP/1.1\r\nHo\rst: a\r\n\r\n", 400, "bare CR in a name");
    PARSE_ERR("GET / HTTP/1.1\r\r\n\r\n", 400, "CR CR LF");

    PARSE_ERR("G\0T / HTTP/1.1\r\n\r\n", 400, "NUL in method");
    PARSE_ERR("GET /\0 HTTP/1.1\r\n\r\n", 400, "NUL in target");
    PARSE_ERR("GET / HTTP/1.1\0\r\n\r\n", 400, "NUL after version");
    PARSE_ERR("GET / HTTP/1.1\r\nH\0st: a\r\n\r\n", 400, "NUL in a name");
    PARSE_ERR("GET / HTTP/1.1\r\nHost: a\0b\r\n\r\n", 400, "NUL in a value");
    PARSE_ERR("GET / HTTP/1.1\r\nHost: a\r\n\0\r\n", 400, "NUL at a line start");
    PARSE_ERR("\0GET / HTTP/1.1\r\n\r\n", 400, "NUL first");
}

/* -------------------------------------------------------------- headers */

static void test_headers(void)
{
    int r = parse(S("GET / HTTP/1.1\r\nHost:example.com\r\nX-A: \t a b \t \r\n"
                    "X-Empty:\r\nX-Blank:   \t\r\nX-Obs: caf\xc3\xa9\r\n\r\n"));
    ok(r > 0, "headers parsed");
    is(req.num_headers, 5, "five headers");
    is_str(req.headers[0].value, req.headers[0].value_len, "example.com", "no OWS after colon");
    is_str(req.headers[1].value, req.headers[1].value_len, "a b", "OWS stripped both sides, inner kept");
    is(req.headers[2].value_len, 0, "empty value");
    is(req.headers[3].value_len, 0, "value of only OWS is empty");
    is_str(req.headers[4].value, req.headers[4].value_len, "caf\xc3\xa9", "obs-text allowed in a value");

    PARSE_ERR("GET / HTTP/1.1\r\n: a\r\n\r\n", 400, "empty name");
    PARSE_ERR("GET / HTTP/1.1\r\nHost : a\r\n\r\n", 400, "SP between name and colon");
    PARSE_ERR("GET / HTTP/1.1\r\nHost\t: a\r\n\r\n", 400, "HTAB between name and colon");
    PARSE_ERR("GET / HTTP/1.1\r\nHo st: a\r\n\r\n", 400, "SP inside a name");
    PARSE_ERR("GET / HTTP/1.1\r\nHo@st: a\r\n\r\n", 400, "'@' in a name");
    PARSE_ERR("GET / HTTP/1.1\r\nHost\r\n\r\n", 400, "no colon");
    PARSE_ERR("GET / HTTP/1.1\r\nHost: a\r\n b\r\n\r\n", 400, "obs-fold (SP)");
    PARSE_ERR("GET / HTTP/1.1\r\nHost: a\r\n\tb\r\n\r\n", 400, "obs-fold (HTAB)");
    PARSE_ERR("GET / HTTP/1.1\r\n Host: a\r\n\r\n", 400, "first field line starts with SP");
    PARSE_ERR("GET / HTTP/1.1\r\nX: a\x01" "b\r\n\r\n", 400, "control byte in a value");
    PARSE_ERR("GET / HTTP/1.1\r\nX: a\x7f" "b\r\n\r\n", 400, "DEL in a value");
    PARSE_ERR("GET / HTTP/1.1\r\nX: a\x1b\r\n\r\n", 400, "ESC in a value");
}

/* Each byte value in each position, against the RFC 9110 definitions. */
static void test_every_byte(void)
{
    static const char tchars[] = "!#$%&'*+-.^_`|~";
    int c, bad_m = 0, bad_t = 0, bad_n = 0, bad_v = 0;

    for (c = 0; c < 256; c++) {
        char buf[64];
        int alnum = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
        int tchar = alnum || (c && strchr(tchars, c));
        int vchar = c >= 0x21 && c <= 0x7e;
        int value = c == '\t' || c == ' ' || vchar || c >= 0x80;
        int r;

        memcpy(buf, "GxT / HTTP/1.0\r\n\r\n", 18);
        buf[1] = (char)c;
        r = parse(buf, 18);
        if ((r == 18) != tchar || (r < 0 && req.error_status != 400)) bad_m++;

        memcpy(buf, "GET /x HTTP/1.0\r\n\r\n", 19);
        buf[5] = (char)c;
        r = parse(buf, 19);
        if ((r == 19) != vchar || (r < 0 && req.error_status != 400)) bad_t++;

        memcpy(buf, "GET / HTTP/1.0\r\nAxB: v\r\n\r\n", 26);
        buf[17] = (char)c;
        r = parse(buf, 26);
        if (c != ':' && ((r == 26) != tchar || (r < 0 && req.error_status != 400))) bad_n++;

        memcpy(buf, "GET / HTTP/1.0\r\nA: vxv\r\n\r\n", 26);
        buf[20] = (char)c;
        r = parse(buf, 26);
        if ((r == 26) != value || (r < 0 && req.error_status != 400)) bad_v++;
    }
    is(bad_m, 0, "every byte in a method: allowed iff tchar");
    is(bad_t, 0, "every byte in a target: allowed iff VCHAR");
    is(bad_n, 0, "every byte in a field name: allowed iff tchar");
    is(bad_v, 0, "every byte in a field value: allowed iff HTAB/SP/VCHAR/obs-text");
}

static void test_header_limits(void)
{
    nw_parse_limits lim = { 100, 1000, 3 };
    static const char three[] = "GET / HTTP/1.1\r\nA: 1\r\nB: 2\r\nC: 3\r\n\r\n";
    static const char four[] = "GET / HTTP/1.1\r\nA: 1\r\nB: 2\r\nC: 3\r\nD: 4\r\n\r\n";
    static const char four_inc[] = "GET / HTTP/1.1\r\nA: 1\r\nB: 2\r\nC: 3\r\nD";
    int r;

    r = parse_lim(S(three), &lim);
    is(r, sizeof three - 1, "exactly max_headers fields");
    r = parse_lim(S(four), &lim);
    ok(r == NW_PARSE_ERROR && req.error_status == 431, "max_headers + 1 fields: 431");
    r = parse_lim(S(four_inc), &lim);
    ok(r == NW_PARSE_ERROR && req.error_status == 431, "max_headers + 1 fields, incomplete: 431");
    lim.max_headers = 0;
    r = parse_lim(S("GET / HTTP/1.0\r\n\r\n"), &lim);
    is(r, 18, "max_headers 0, no fields");

    /* Head size: three is 37 bytes. */
    lim.max_headers = 10;
    lim.max_header_bytes = sizeof three - 1;
    r = parse_lim(S(three), &lim);
    is(r, sizeof three - 1, "head of exactly max_header_bytes");
    lim.max_header_bytes = sizeof three - 2;
    r = parse_lim(S(three), &lim);
    ok(r == NW_PARSE_ERROR && req.error_status == 431, "head one byte over max_header_bytes: 431");
    r = parse_lim(three, sizeof three - 2, &lim);
    ok(r == NW_PARSE_ERROR && req.error_status == 431, "incomplete, len == max_header_bytes: 431");
    r = parse_lim(three, sizeof three - 3, &lim);
    is(r, NW_PARSE_INCOMPLETE, "incomplete, len < max_header_bytes");
    lim.max_header_bytes = 20;
    r = parse_lim(S(three), &lim);
    ok(r == NW_PARSE_ERROR && req.error_status == 431, "complete head, well over: 431");
    r = parse_lim(S("\r\n\r\n\r\n\r\n\r\n\r\n\r\n\r\n\r\n\r\n\r\n"), &lim);
    ok(r == NW_PARSE_ERROR && req.error_status == 431, "endless empty lines: 431");

    {   /* A big head under the default limits, then over them. */
        static char big[70000];
        size_t n = 0;
        n += (size_t)sprintf(big, "GET / HTTP/1.1\r\nHost: a\r\n");
        while (n < 65000) {     /* 100-byte field lines */
            memcpy(big + n, "X-Filler: ", 10);
            memset(big + n + 10, 'f', 88);
            memcpy(big + n + 98, "\r\n", 2);
            n += 100;
        }
        memcpy(big + n, "\r\n", 2);
        r = parse(big, n + 2);
        ok(r == NW_PARSE_ERROR && req.error_status == 431, "many fields under default limits: 431 (count)");
        lim.max_request_line = 8192;
        lim.max_header_bytes = 65536;
        lim.max_headers = 1024;
        r = parse_lim(big, n + 2, &lim);
        is(r, (int)(n + 2), "64K head with 1024 max_headers");
        while (n < 65600) {
            memcpy(big + n, "X-Filler: ", 10);
            memset(big + n + 10, 'f', 88);
            memcpy(big + n + 98, "\r\n", 2);
            n += 100;
        }
        r = parse_lim(big, n, &lim);
        ok(r == NW_PARSE_ERROR && req.error_status == 431, "head over 64K, incomplete: 431");
    }
}

/* ------------------------------------------------------------ path/query */

static void test_path_query(void)
{
    int r = parse(S("GET /a?b?c HTTP/1.1\r\nHost: a\r\n\r\n"));
    ok(r > 0, "parsed");
    is_str(req.path, req.path_len, "/a", "split on the first '?': path");
    is_str(req.query, req.query_len, "b?c", "split on the first '?': query");

    r = parse(S("GET /a/b HTTP/1.1\r\nHost: a\r\n\r\n"));
    is_str(req.path, req.path_len, "/a/b", "no '?': path is the target");
    ok(req.query == NULL && req.query_len == 0, "no '?': query is NULL");

    r = parse(S("GET /a? HTTP/1.1\r\nHost: a\r\n\r\n"));
    is_str(req.query, req.query_len, "", "trailing '?': empty query, not NULL");

    r = parse(S("GET ?x HTTP/1.1\r\nHost: a\r\n\r\n"));
    ok(r > 0 && req.path_len == 0, "target '?x': empty path");

    r = parse(S("GET http://example.com/p/q?x=1 HTTP/1.1\r\nHost: example.com\r\n\r\n"));
    is_str(req.target, req.target_len, "http://example.com/p/q?x=1", "absolute-form: raw target");
    is_str(req.path, req.path_len, "/p/q", "absolute-form: path");
    is_str(req.query, req.query_len, "x=1", "absolute-form: query");

    r = parse(S("GET HTTPS://u@example.com:8443/ HTTP/1.1\r\nHost: example.com\r\n\r\n"));
    is_str(req.path, req.path_len, "/", "absolute-form with userinfo and port");

    r = parse(S("GET http://example.com HTTP/1.1\r\nHost: example.com\r\n\r\n"));
    ok(r > 0 && req.path_len == 0 && req.path != NULL, "absolute-form without path: path_len 0");
    ok(req.query == NULL, "absolute-form without path: no query");

    r = parse(S("GET http://example.com?q HTTP/1.1\r\nHost: example.com\r\n\r\n"));
    ok(r > 0 && req.path_len == 0, "absolute-form, no path, query: path_len 0");
    is_str(req.query, req.query_len, "q", "absolute-form, no path, query");

    r = parse(S("OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n"));
    is_str(req.path, req.path_len, "*", "asterisk-form: path is '*'");

    r = parse(S("CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n"));
    is_str(req.path, req.path_len, "example.com:443", "authority-form: path is the target");

    r = parse(S("GET x:/y HTTP/1.1\r\nHost: a\r\n\r\n"));
    is_str(req.path, req.path_len, "x:/y", "scheme without '//': not absolute-form");
}

/* The buffer a head was parsed from moves (it grew while the body was
 * read): every pointer of the request follows it, and the old block is
 * never read (ASan would say so: it is freed first). */
static void test_request_moved(void)
{
    static const char head[] = "POST http://h.example:81/up/load?x=1 HTTP/1.1\r\n"
                               "Host: h.example\r\nUser-Agent: agent-c\r\n"
                               "Transfer-Encoding: chunked\r\n\r\n";
    size_t n = sizeof head - 1;
    char *old = malloc(n);
    memcpy(old, head, n);
    nw_header h[8];
    nw_request r;
    nw_parse_limits lim = default_limits;
    lim.max_headers = 8;
    ok(nw_http_parse_head(old, n, &r, h, &lim) == (int)n, "moved: parsed");
    char *now = malloc(n + 100);
    memcpy(now, old, n);
    uintptr_t from = (uintptr_t)old;
    free(old);
    nw_http_request_moved(&r, from, now);
    is_str(r.method, r.method_len, "POST", "moved: method");
    is_str(r.target, r.target_len, "http://h.example:81/up/load?x=1", "moved: target");
    is_str(r.path, r.path_len, "/up/load", "moved: path");
    is_str(r.query, r.query_len, "x=1", "moved: query");
    is_str(r.authority, r.authority_len, "h.example:81", "moved: authority");
    ok(r.num_headers == 3, "moved: three headers");
    is_str(r.headers[1].name, r.headers[1].name_len, "User-Agent", "moved: a header's name");
    is_str(r.headers[1].value, r.headers[1].value_len, "agent-c", "moved: its value");
    ok(r.headers[2].value >= now && r.headers[2].value < now + n, "moved: into the new block");

    static const char plain[] = "GET / HTTP/1.1\r\nHost: a\r\n\r\n";
    old = malloc(sizeof plain);
    memcpy(old, plain, sizeof plain);
    ok(nw_http_parse_head(old, sizeof plain - 1, &r, h, &lim) > 0, "moved: parsed, no query");
    memcpy(now, old, sizeof plain);
    from = (uintptr_t)old;
    free(old);
    nw_http_request_moved(&r, from, now);
    ok(r.query == NULL && r.authority == NULL, "moved: absent parts stay NULL");
    is_str(r.path, r.path_len, "/", "moved: path");
    free(now);
}

/* ------------------------------------------------------------- prefixes */

static void test_prefixes(void)
{
    static const char a[] = "GET /p?q=1 HTTP/1.1\r\nHost: example.com\r\nX-A:  v  \r\n\r\n";
    static const char b[] = "\r\n\nPOST /x HTTP/1.0\nContent-Length: 3\nA:\n\n";
    static const char c[] = "OPTIONS * HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n";
    static const char d[] = "PUT http://h/x HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n";
    all_prefixes(S(a), "every prefix incomplete: GET with query");
    all_prefixes(S(b), "every prefix incomplete: LF endings, leading empty lines");
    all_prefixes(S(c), "every prefix incomplete: OPTIONS *");
    all_prefixes(S(d), "every prefix incomplete: absolute-form PUT");
}

/* -------------------------------------------------------------- framing */

static nw_framing fr;

/* Parse (must succeed) then frame; returns nw_http_framing's result. */
static int frame(const char *s, size_t n)
{
    int r = parse(s, n);
    if (r <= 0) {
        diag("head did not parse: %d (%d %s)", r, req.error_status,
             r == NW_PARSE_ERROR ? req.error_reason : "");
        return -1000;
    }
    memset(&fr, 0x5a, sizeof fr);
    return nw_http_framing(&req, &fr);
}

#define H11 "POST / HTTP/1.1\r\nHost: h\r\n"
#define H10 "POST / HTTP/1.0\r\n"
#define FRAME_IS(lit, status, name) do {                                \
    int fr_r_ = frame(S(lit));                                          \
    if (!ok(fr_r_ == (status) && (status == 0 || fr.error_status == (status)), name)) \
        diag("returned %d", fr_r_);                                     \
} while (0)

static void test_content_length(void)
{
    int r = frame(S(H11 "Content-Length: 42\r\n\r\n"));
    ok(r == 0 && fr.body == NW_BODY_LENGTH && fr.content_length == 42, "Content-Length: 42");
    r = frame(S(H11 "Content-Length: 0\r\n\r\n"));
    ok(r == 0 && fr.body == NW_BODY_LENGTH && fr.content_length == 0,
       "Content-Length: 0 is NW_BODY_LENGTH with 0");
    r = frame(S(H11 "content-LENGTH:  7 \r\n\r\n"));
    ok(r == 0 && fr.content_length == 7, "name case-insensitive, OWS around the value");
    r = frame(S(H11 "Content-Length: 999999999999999999\r\n\r\n"));
    ok(r == 0 && fr.content_length == 999999999999999999LL, "18 digits");
    r = frame(S(H11 "Content-Length: 007\r\n\r\n"));
    ok(r == 0 && fr.content_length == 7, "leading zeros");
    /* 1*DIGIT (RFC 9110 8.6): the value is bounded, not its spelling */
    r = frame(S(H11 "Content-Length: 000000000000000000005\r\n\r\n"));
    ok(r == 0 && fr.content_length == 5 && fr.length_padded,
       "21 digits, 20 of them leading zeros: 5 (spelt padded: CONTENT_LENGTH is the value)");
    r = frame(S(H11 "Content-Length: 0\r\n\r\n"));
    ok(r == 0 && !fr.length_padded, "0 is not padded");
    r = frame(S(H11 "Content-Length: 0000000000000000000000000000000000000000\r\n\r\n"));
    ok(r == 0 && fr.body == NW_BODY_LENGTH && fr.content_length == 0, "40 zeros: 0");
    r = frame(S(H11 "Content-Length: 1000000000000000000\r\n\r\n"));
    ok(r == 0 && fr.content_length == 1000000000000000000LL, "19 digits");
    r = frame(S(H11 "Content-Length: 9223372036854775807\r\n\r\n"));
    ok(r == 0 && fr.content_length == INT64_MAX, "2^63 - 1, the largest length");
    FRAME_IS(H11 "Content-Length: 9223372036854775808\r\n\r\n", 413, "2^63: too large, 413");
    FRAME_IS(H11 "Content-Length: 99999999999999999999999\r\n\r\n", 413, "23 nines: too large, 413");
    FRAME_IS(H11 "Content-Length: 99999999999999999999x\r\n\r\n", 400, "too large, then junk: 400");
    {
        int64_t v = -1;
        ok(nw_http_parse_length("0000000000000000000000042", 25, &v) == 0 && v == 42,
           "nw_http_parse_length: leading zeros");
        ok(nw_http_parse_length("18446744073709551616", 20, &v) == NW_LENGTH_TOO_LARGE,
           "nw_http_parse_length: 2^64 is too large, not wrapped");
        ok(nw_http_parse_length("", 0, &v) == NW_LENGTH_INVALID, "nw_http_parse_length: empty");
    }
    FRAME_IS(H11 "Content-Length: +5\r\n\r\n", 400, "sign '+': 400");
    FRAME_IS(H11 "Content-Length: -5\r\n\r\n", 400, "sign '-': 400");
    FRAME_IS(H11 "Content-Length: 5 5\r\n\r\n", 400, "space inside: 400");
    FRAME_IS(H11 "Content-Length: 5,5\r\n\r\n", 400, "comma list: 400");
    FRAME_IS(H11 "Content-Length: 5, 5\r\n\r\n", 400, "comma list with OWS: 400");
    FRAME_IS(H11 "Content-Length: \r\n\r\n", 400, "empty: 400");
    FRAME_IS(H11 "Content-Length: 0x10\r\n\r\n", 400, "hex: 400");
    FRAME_IS(H11 "Content-Length: 5a\r\n\r\n", 400, "trailing junk: 400");
    /* two lines, even alike, are refused as one line "5, 5" is: the app
     * would see CONTENT_LENGTH "5, 5" */
    FRAME_IS(H11 "Content-Length: 5\r\nContent-Length: 5\r\n\r\n", 400, "repeated, identical: 400");
    FRAME_IS(H11 "Content-Length: 0\r\ncontent-length: 0\r\n\r\n", 400, "repeated 0, any case: 400");
    FRAME_IS(H11 "Content-Length: 5\r\nContent-Length: 6\r\n\r\n", 400, "repeated, differing: 400");
    FRAME_IS(H11 "Content-Length: 5\r\nContent-Length: x\r\n\r\n", 400, "repeated, second bad: 400");
    r = frame(S(H11 "\r\n"));
    ok(r == 0 && fr.body == NW_BODY_NONE && fr.content_length == -1, "neither CL nor TE: NONE, -1");
}

static void test_transfer_encoding(void)
{
    int r = frame(S(H11 "Transfer-Encoding: chunked\r\n\r\n"));
    ok(r == 0 && fr.body == NW_BODY_CHUNKED && fr.content_length == -1, "chunked");
    r = frame(S(H11 "transfer-encoding: ChUnKeD\r\n\r\n"));
    ok(r == 0 && fr.body == NW_BODY_CHUNKED, "chunked, case-insensitive");
    r = frame(S(H11 "Transfer-Encoding: , chunked ,\r\n\r\n"));
    ok(r == 0 && fr.body == NW_BODY_CHUNKED, "empty list elements and OWS ignored");
    FRAME_IS(H11 "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n", 400, "TE with CL: 400");
    FRAME_IS(H11 "Content-Length: 5\r\nTransfer-Encoding: gzip\r\n\r\n", 400, "CL with TE gzip: 400");
    FRAME_IS(H11 "Transfer-Encoding: gzip, chunked\r\n\r\n", 501, "gzip, chunked: 501");
    FRAME_IS(H11 "Transfer-Encoding: chunked, chunked\r\n\r\n", 501, "chunked, chunked: 501");
    FRAME_IS(H11 "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n", 501,
             "chunked in two header lines: 501");
    FRAME_IS(H11 "Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n", 501,
             "gzip then chunked in two lines: 501");
    FRAME_IS(H11 "Transfer-Encoding: gzip\r\n\r\n", 400, "gzip (chunked not final): 400");
    FRAME_IS(H11 "Transfer-Encoding: identity\r\n\r\n", 400, "identity: 400");
    FRAME_IS(H11 "Transfer-Encoding: chunked;q=1\r\n\r\n", 400, "chunked with a parameter (not chunked): 400");
    FRAME_IS(H11 "Transfer-Encoding: chunkedx\r\n\r\n", 400, "chunkedx: 400");
    FRAME_IS(H11 "Transfer-Encoding: \r\n\r\n", 400, "empty Transfer-Encoding: 400");
    FRAME_IS(H10 "Transfer-Encoding: chunked\r\n\r\n", 400, "TE in HTTP/1.0: 400");
    FRAME_IS(H11 "Transfer-Encoding: chunked, gzip\r\n\r\n", 400, "chunked, gzip (not final): 400");
    FRAME_IS(H11 "Transfer-Encoding: chunked\r\nTransfer-Encoding: gzip\r\n\r\n", 400,
             "chunked then gzip in two lines: 400");
}

static void test_host(void)
{
    FRAME_IS("GET / HTTP/1.1\r\n\r\n", 400, "HTTP/1.1 without Host: 400");
    FRAME_IS("GET / HTTP/1.1\r\nHost: a\r\nHost: a\r\n\r\n", 400, "two Host: 400");
    FRAME_IS("GET / HTTP/1.0\r\nHost: a\r\nhost: b\r\n\r\n", 400, "two Host in HTTP/1.0: 400");
    FRAME_IS("GET / HTTP/1.0\r\n\r\n", 0, "HTTP/1.0 without Host: ok");
    FRAME_IS("GET / HTTP/1.1\r\nHOST: a\r\n\r\n", 0, "Host name case-insensitive");
    FRAME_IS("GET / HTTP/1.1\r\nHost:\r\n\r\n", 0, "empty Host value: ok");
    FRAME_IS("GET / HTTP/1.1\r\nHostx: a\r\n\r\n", 400, "'Hostx' is not Host");
    /* RFC 9112 3.2: an invalid Host value is 400 (host [":" port], RFC 3986) */
    static const char *const good[] = {
        "example.com", "example.com:8080", "a:", "1.2.3.4:80", "[::1]", "[::1]:5000",
        "[2001:db8::1.2.3.4]", "[v1.fe:x]", "xn--bcher-kva.example", "a%2Eb", "a_b~c-d.e",
        "!$&'()*+,;=", "localhost:65535",
    };
    static const char *const bad[] = {
        "a b", "a/b", "a?b", "a#b", "a@b", "user@host", "a:b", "a:80:80", "a:8 0", "[::1",
        "[]", "[::1]x", "[::1]:x", "[::1%eth0]", "a%zz", "a%2", "a\"b", "a<b", "a\\b",
        "\x80host", "a\tb", ":80x",
    };
    int wrong = 0;
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
        if (!nw_http_host_valid(good[i], strlen(good[i]))) {
            diag("valid Host refused: %s", good[i]);
            wrong++;
        }
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (nw_http_host_valid(bad[i], strlen(bad[i]))) {
            diag("invalid Host accepted: %s", bad[i]);
            wrong++;
        }
    is(wrong, 0, "Host values: host[:port] accepted, anything else refused");
    FRAME_IS("GET / HTTP/1.1\r\nHost: a b\r\n\r\n", 400, "Host: a b: 400");
    FRAME_IS("GET / HTTP/1.1\r\nHost: a/b\r\n\r\n", 400, "Host: a/b: 400");
    FRAME_IS("GET / HTTP/1.0\r\nHost: a/b\r\n\r\n", 400, "an invalid Host in HTTP/1.0: 400");
    FRAME_IS("GET / HTTP/1.1\r\nHost: [::1]:80\r\n\r\n", 0, "Host: [::1]:80: ok");
}

/* RFC 9112 3.2: origin-form; absolute-form; "*" only with OPTIONS;
 * authority-form only with CONNECT, which Narwhal does not implement. */
static void test_target_forms(void)
{
    int r = frame(S("OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n"));
    ok(r == 0 && fr.options_asterisk == 1, "OPTIONS *: ok, the server's to answer");
    r = frame(S("OPTIONS / HTTP/1.1\r\nHost: a\r\n\r\n"));
    ok(r == 0 && fr.options_asterisk == 0, "OPTIONS /: the app's");
    r = frame(S("GET /p HTTP/1.1\r\nHost: a\r\n\r\n"));
    ok(r == 0 && fr.options_asterisk == 0, "origin-form: the app's");
    FRAME_IS("GET * HTTP/1.1\r\nHost: a\r\n\r\n", 400, "GET *: 400");
    FRAME_IS("OPTIONS *x HTTP/1.1\r\nHost: a\r\n\r\n", 400, "OPTIONS *x: 400");
    FRAME_IS("CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\n\r\n", 501, "CONNECT host:port: 501");
    FRAME_IS("CONNECT / HTTP/1.1\r\nHost: a\r\n\r\n", 501, "CONNECT /: 501");
    FRAME_IS("GET a:443 HTTP/1.1\r\nHost: a\r\n\r\n", 400, "authority-form with GET: 400");
    FRAME_IS("GET a HTTP/1.1\r\nHost: a\r\n\r\n", 400, "a bare word: 400");
    FRAME_IS("GET ?q HTTP/1.1\r\nHost: a\r\n\r\n", 400, "only a query: 400");
    FRAME_IS("GET http://h/p?q HTTP/1.1\r\nHost: a\r\n\r\n", 0, "absolute-form: ok");
    FRAME_IS("GET http://h HTTP/1.1\r\nHost: a\r\n\r\n", 0, "absolute-form without a path: ok");
    FRAME_IS("GET http:///p HTTP/1.1\r\nHost: a\r\n\r\n", 400, "absolute-form, empty authority: 400");
    FRAME_IS("GET http://h<x/p HTTP/1.1\r\nHost: a\r\n\r\n", 400, "absolute-form, bad authority: 400");
}

/* nw_http_empty_lines: the one rule for what may precede a request line. */
static void test_empty_lines(void)
{
    static const struct { const char *in; size_t want; int bad; } cases[] = {
        { "", 0, 0 }, { "GET", 0, 0 }, { "\r\n", 2, 0 }, { "\n", 1, 0 },
        { "\n\r\nGET", 3, 0 }, { "\r", 0, 0 }, { "\r\n\r", 2, 0 },
        { "\rG", 0, 1 }, { "\r\n\rX", 2, 1 }, { "\r\r\n", 0, 1 }, { "\n\r\r", 1, 1 },
        { "\n\nG", 2, 0 }, { "\r\n\r\n\r\n", 6, 0 },
    };
    int wrong = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int bad = -1;
        size_t n = nw_http_empty_lines(cases[i].in, strlen(cases[i].in), &bad);
        if (n != cases[i].want || bad != cases[i].bad) {
            diag("case %zu: %zu bytes, bad %d", i, n, bad);
            wrong++;
        }
    }
    is(wrong, 0, "empty lines: CRLF and LF counted, a CR at the end waits, a bare CR is bad");
}

static void test_connection(void)
{
    int r = frame(S(H11 "\r\n"));
    ok(r == 0 && fr.keep_alive == 1, "HTTP/1.1 default: keep-alive");
    r = frame(S(H10 "\r\n"));
    ok(r == 0 && fr.keep_alive == 0, "HTTP/1.0 default: close");
    r = frame(S(H11 "Connection: close\r\n\r\n"));
    ok(r == 0 && fr.keep_alive == 0, "HTTP/1.1 close");
    r = frame(S(H11 "Connection: Upgrade, CLOSE\r\n\r\n"));
    ok(r == 0 && fr.keep_alive == 0, "close in a list, case-insensitive");
    r = frame(S(H11 "Connection: upgrade\r\nConnection: close\r\n\r\n"));
    ok(r == 0 && fr.keep_alive == 0, "close in a second Connection line");
    r = frame(S(H11 "Connection: closed\r\n\r\n"));
    ok(r == 0 && fr.keep_alive == 1, "'closed' is not close");
    r = frame(S(H10 "Connection: keep-alive\r\n\r\n"));
    ok(r == 0 && fr.keep_alive == 1, "HTTP/1.0 keep-alive");
    r = frame(S(H10 "Connection: Keep-Alive \r\n\r\n"));
    ok(r == 0 && fr.keep_alive == 1, "HTTP/1.0 Keep-Alive, case-insensitive");
    r = frame(S(H10 "Connection: keep-alive, close\r\n\r\n"));
    ok(r == 0 && fr.keep_alive == 0, "HTTP/1.0 keep-alive and close: close wins");
    r = frame(S(H10 "Connection: close\r\nConnection: keep-alive\r\n\r\n"));
    ok(r == 0 && fr.keep_alive == 0, "close wins regardless of order");
    r = frame(S(H10 "Connection: ,keep-alive,\r\n\r\n"));
    ok(r == 0 && fr.keep_alive == 1, "empty list elements ignored");
}

static void test_expect(void)
{
    int r = frame(S(H11 "Content-Length: 5\r\nExpect: 100-continue\r\n\r\n"));
    ok(r == 0 && fr.expect_continue == 1, "Expect: 100-continue");
    r = frame(S(H11 "Expect: 100-Continue\r\n\r\n"));
    ok(r == 0 && fr.expect_continue == 1, "case-insensitive, set without a body");
    r = frame(S(H11 "\r\n"));
    ok(r == 0 && fr.expect_continue == 0, "no Expect");
    r = frame(S(H10 "Expect: 100-continue\r\n\r\n"));
    ok(r == 0 && fr.expect_continue == 0, "HTTP/1.0: 100-continue ignored");
    FRAME_IS(H11 "Expect: 200-ok\r\n\r\n", 417, "other expectation: 417");
    FRAME_IS(H11 "Expect: 100-continue, x\r\n\r\n", 417, "list with another: 417");
    FRAME_IS(H11 "Expect:\r\n\r\n", 417, "empty Expect: 417");
    FRAME_IS(H10 "Expect: foo\r\n\r\n", 417, "HTTP/1.0 other expectation: 417");
}

/* -------------------------------------------------------------- chunked */

#define CK_MAX_PAYLOAD 1000000
#define CK_MAX_TRAILER 256

typedef struct {
    long ret;               /* total consumed, or the error */
    char out[40000];
    size_t out_len;
} ck_result;

/* Decode s[0..n) fed as the pieces ending at cuts[0..ncuts) (then n).
 * in_place: decode into the input buffer itself. */
static void ck_run(const char *s, size_t n, const size_t *cuts, size_t ncuts,
                   int in_place, uint64_t max_payload, size_t max_trailer,
                   ck_result *res)
{
    static char outbuf[40000];
    nw_chunked d;
    size_t start = 0, k;

    nw_chunked_init(&d, max_payload, max_trailer);
    res->ret = 0;
    res->out_len = 0;
    for (k = 0; k <= ncuts; k++) {
        size_t end = k < ncuts ? cuts[k] : n, got = 0;
        char *in = guard(s + start, end - start);
        char *out = in_place ? in : outbuf;
        long r = nw_chunked_decode(&d, in, end - start, out, &got);
        if (r < 0) {
            res->ret = r;
            return;
        }
        if (got > (size_t)r || res->out_len + got > sizeof res->out) {
            res->ret = -100;    /* impossible output length */
            return;
        }
        memcpy(res->out + res->out_len, out, got);
        res->out_len += got;
        res->ret += r;
        if (d.done != 0 || (size_t)r != end - start) {
            if ((size_t)r != end - start && !d.done)
                res->ret = -101;    /* stopped early without being done */
            return;
        }
        start = end;
    }
    if (!d.done)
        res->ret = NW_PARSE_INCOMPLETE;     /* "not done" marker */
}

static int ck_same(const ck_result *a, const ck_result *b)
{
    return a->ret == b->ret && (a->ret < 0 || (a->out_len == b->out_len
                                 && memcmp(a->out, b->out, a->out_len) == 0));
}

/* Whole, in place, byte by byte, and every split in two (copying and in
 * place) all agree with the expected result. */
static void ck_check(const char *s, size_t n, long want_ret, const char *want_out,
                     size_t want_len, uint64_t max_payload, size_t max_trailer,
                     int splits, const char *name)
{
    static ck_result whole, other;
    static size_t cuts[40000];
    size_t k;
    int bad = 0;

    ck_run(s, n, NULL, 0, 0, max_payload, max_trailer, &whole);
    if (whole.ret != want_ret
        || (want_ret >= 0 && (whole.out_len != want_len
                              || memcmp(whole.out, want_out, want_len) != 0))) {
        diag("%s: whole input returned %ld (want %ld), %zu payload bytes (want %zu)",
             name, whole.ret, want_ret, whole.out_len, want_len);
        bad++;
    }
    ck_run(s, n, NULL, 0, 1, max_payload, max_trailer, &other);
    if (!ck_same(&whole, &other)) {
        diag("%s: in place differs", name);
        bad++;
    }
    for (k = 0; k + 1 < n && k < sizeof cuts / sizeof cuts[0]; k++)
        cuts[k] = k + 1;
    ck_run(s, n, cuts, k, 0, max_payload, max_trailer, &other);
    if (!ck_same(&whole, &other)) {
        diag("%s: byte by byte returned %ld", name, other.ret);
        bad++;
    }
    for (k = 0; splits && k <= n; k++) {
        ck_run(s, n, &k, 1, (int)(k & 1), max_payload, max_trailer, &other);
        if (!ck_same(&whole, &other)) {
            if (bad < 5)
                diag("%s: split at %zu returned %ld", name, k, other.ret);
            bad++;
        }
    }
    ok(!bad, name);
}

#define CK_OK(lit, payload, name) \
    ck_check(S(lit), (long)(sizeof(lit) - 1), S(payload), CK_MAX_PAYLOAD, CK_MAX_TRAILER, 1, name)
#define CK_ERR(lit, err, name) \
    ck_check(S(lit), err, "", 0, CK_MAX_PAYLOAD, CK_MAX_TRAILER, 1, name)

static void test_chunked_basic(void)
{
    CK_OK("5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n", "hello world", "two chunks");
    CK_OK("0\r\n\r\n", "", "empty body");
    CK_OK("a\r\n0123456789\r\nA\r\nabcdefghij\r\n0\r\n\r\n", "0123456789abcdefghij",
          "hex digits, lower and upper case");
    CK_OK("000000000000000a\r\n0123456789\r\n0\r\n\r\n", "0123456789", "16 hex digits");
    /* chunk-size = 1*HEXDIG: the value is bounded, not its spelling */
    CK_OK("0000000000000000a\r\n0123456789\r\n0\r\n\r\n", "0123456789",
          "17 hex digits, leading zeros: the size is 10");
    CK_OK("00000000000000000000000000000005\r\nhello\r\n"
          "000000000000000000000000000000000\r\n\r\n", "hello",
          "32 hex digits, and a last-chunk of 33 zeros");
    CK_ERR("ffffffffffffffffff\r\n", NW_CHUNKED_TOO_LARGE, "size over 2^64: too large (413)");
    CK_ERR("10000000000000000\r\n", NW_CHUNKED_TOO_LARGE, "size 2^64: too large (413), not wrapped to 0");
    CK_OK("5\nhello\n0\n\n", "hello", "lone LF line endings");
    CK_OK("5\r\nhello\n0\r\n\n", "hello", "mixed line endings");
    CK_OK("00000\r\n\r\n", "", "last-chunk with leading zeros");
    CK_OK("5;name=value\r\nhello\r\n0;x\r\n\r\n", "hello", "chunk extensions");
    CK_OK("5 ; a=\"q;u\\\"o t\" ;b\r\nhello\r\n0\r\n\r\n", "hello", "BWS and quoted-string extension");
    CK_OK("5;\t\x80\r\nhello\r\n0\r\n\r\n", "hello", "HTAB and obs-text in an extension");
    CK_ERR("5;a\x01\r\nhello\r\n0\r\n\r\n", NW_CHUNKED_ERROR, "control byte in an extension");
    CK_ERR("5;a\0\r\nhello\r\n0\r\n\r\n", NW_CHUNKED_ERROR, "NUL in an extension");
    CK_ERR("5;a\rb\r\nhello\r\n0\r\n\r\n", NW_CHUNKED_ERROR, "bare CR in an extension");
    CK_ERR("5\rhello\r\n0\r\n\r\n", NW_CHUNKED_ERROR, "bare CR after the size");
    CK_ERR("5 \r\nhello\r\n0\r\n\r\n", NW_CHUNKED_ERROR, "whitespace after the size, no extension");
    CK_ERR(" 5\r\nhello\r\n0\r\n\r\n", NW_CHUNKED_ERROR, "whitespace before the size");
    CK_ERR("\r\nhello\r\n0\r\n\r\n", NW_CHUNKED_ERROR, "empty size");
    CK_ERR(";x\r\nhello\r\n0\r\n\r\n", NW_CHUNKED_ERROR, "extension without a size");
    CK_ERR("+5\r\nhello\r\n0\r\n\r\n", NW_CHUNKED_ERROR, "sign before the size");
    CK_ERR("0x5\r\nhello\r\n0\r\n\r\n", NW_CHUNKED_ERROR, "0x prefix");
    CK_ERR("5g\r\nhello\r\n0\r\n\r\n", NW_CHUNKED_ERROR, "non-hex after the size");
    CK_ERR("5\r\nhelloX\r\n0\r\n\r\n", NW_CHUNKED_ERROR, "data longer than the size");
    CK_ERR("5\r\nhello\rX0\r\n\r\n", NW_CHUNKED_ERROR, "CR then junk after data");
    CK_ERR("5\r\nhello\r\r\n0\r\n\r\n", NW_CHUNKED_ERROR, "CR CR LF after data");
    CK_ERR("5\r\nhel\r\n0\r\n\r\n", NW_CHUNKED_ERROR, "data shorter than the size");
    CK_ERR("5\r\nhello0\r\n\r\n", NW_CHUNKED_ERROR, "no line ending after data");
    CK_ERR("0\r\n\r\r\n", NW_CHUNKED_ERROR, "bare CR on the final line");
}

static void test_chunked_trailers(void)
{
    CK_OK("5\r\nhello\r\n0\r\nX-Sum: abc\r\nY:\r\n\r\n", "hello", "trailer fields discarded");
    CK_OK("5\r\nhello\r\n0\nX-Sum: abc\n\n", "hello", "trailer with lone LF");
    CK_ERR("0\r\n X: a\r\n\r\n", NW_CHUNKED_ERROR, "trailer obs-fold");
    CK_ERR("0\r\nX: a\r\n\tb\r\n\r\n", NW_CHUNKED_ERROR, "trailer obs-fold after a field");
    CK_ERR("0\r\nX : a\r\n\r\n", NW_CHUNKED_ERROR, "trailer: SP before colon");
    CK_ERR("0\r\n: a\r\n\r\n", NW_CHUNKED_ERROR, "trailer: empty name");
    CK_ERR("0\r\nXa\r\n\r\n", NW_CHUNKED_ERROR, "trailer: no colon");
    CK_ERR("0\r\nX: a\x01\r\n\r\n", NW_CHUNKED_ERROR, "trailer: control byte in value");
    CK_ERR("0\r\nX: a\rb\r\n\r\n", NW_CHUNKED_ERROR, "trailer: bare CR");

    /* "X: ab\r\n" is 7 trailer bytes. */
    ck_check(S("0\r\nX: ab\r\n\r\n"), 12, "", 0, 0, 7, 1, "trailer of exactly max_trailer_bytes");
    ck_check(S("0\r\nX: ab\r\n\r\n"), NW_CHUNKED_ERROR, "", 0, 0, 6, 1,
             "trailer over max_trailer_bytes: error");
    ck_check(S("0\r\n\r\n"), 5, "", 0, 0, 0, 1, "max_trailer_bytes 0, no trailer");
    ck_check(S("0\r\nX:\r\n\r\n"), NW_CHUNKED_ERROR, "", 0, 0, 0, 1,
             "max_trailer_bytes 0, a trailer: error");
}

static void test_chunked_limits(void)
{
    static char big[40000];
    size_t n;
    int i;

    /* Chunk line of exactly NW_MAX_CHUNK_LINE bytes, then one more. */
    n = 0;
    big[n++] = '1';
    big[n++] = ';';
    while (n < NW_MAX_CHUNK_LINE)
        big[n++] = 'e';
    memcpy(big + n, "\r\nX\r\n0\r\n\r\n", 10);
    ck_check(big, n + 10, (long)(n + 10), "X", 1, 0, 0, 0, "chunk line of NW_MAX_CHUNK_LINE bytes");
    memmove(big + n + 1, big + n, 10);
    big[n] = 'e';
    ck_check(big, n + 11, NW_CHUNKED_ERROR, "", 0, 0, 0, 0, "chunk line one byte longer: error");

    /* Many tiny chunks with long extensions: overhead outgrows the payload. */
    n = 0;
    while (n < 30000) {
        memcpy(big + n, "1;aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\nX\r\n", 67);
        n += 67;
    }
    memcpy(big + n, "0\r\n\r\n", 5);
    ck_check(big, n + 5, NW_CHUNKED_ERROR, "", 0, 0, 0, 0, "framing overhead beyond allowance: error");
    {
        nw_chunked d;
        size_t got;
        long r;
        char *in = guard(big, n + 5);
        nw_chunked_init(&d, 0, 0);
        r = nw_chunked_decode(&d, in, n + 5, in, &got);
        ok(r == NW_CHUNKED_ERROR && d.overhead == d.payload + NW_CHUNK_OVERHEAD_ALLOWANCE + 1,
           "overhead error exactly when overhead > payload + allowance");
    }

    /* The same overhead with enough payload is fine. */
    n = 0;
    memcpy(big + n, "3e80\r\n", 6);            /* 16000 bytes */
    n += 6;
    memset(big + n, 'p', 16000);
    n += 16000;
    memcpy(big + n, "\r\n", 2);
    n += 2;
    for (i = 0; i < 300; i++) {
        memcpy(big + n, "1;aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\nX\r\n", 67);
        n += 67;
    }
    memcpy(big + n, "0\r\n\r\n", 5);
    {
        nw_chunked d;
        size_t got;
        char *in = guard(big, n + 5);
        long r;
        nw_chunked_init(&d, 0, 0);
        r = nw_chunked_decode(&d, in, n + 5, in, &got);
        ok(r == (long)(n + 5) && d.done && got == 16300 && d.payload == 16300,
           "overhead within payload + allowance: ok");
    }

    ck_check(S("5\r\nhello\r\n5\r\nworld\r\n0\r\n\r\n"), 25, "helloworld", 10, 10, 0, 1,
             "payload of exactly max_payload");
    ck_check(S("5\r\nhello\r\n5\r\nworld\r\n0\r\n\r\n"), NW_CHUNKED_TOO_LARGE, "", 0, 9, 0, 1,
             "payload over max_payload: too large");
    ck_check(S("ffffffffffffffff\r\n"), NW_CHUNKED_TOO_LARGE, "", 0, 1000, 0, 1,
             "huge chunk size over max_payload: too large at once");
    ck_check(S("5\r\nhello\r\nffffffffffffffff\r\n"), NW_CHUNKED_TOO_LARGE, "", 0, 1000, 0, 1,
             "huge second chunk: no overflow in the limit check");
    ck_check(S("ffffffffffffffff\r\nabc"), NW_PARSE_INCOMPLETE, "", 0, 0, 0, 1,
             "huge chunk size without a limit: waits for data");
    ck_check(S("0000000000000000ffffffffffffffff\r\nabc"), NW_PARSE_INCOMPLETE, "", 0, 0, 0, 1,
             "2^64 - 1 spelt with 32 digits, without a limit: waits for data");
    ck_check(S("10000000000000000\r\nabc"), NW_CHUNKED_TOO_LARGE, "", 0, 0, 0, 1,
             "2^64 without a limit: too large, not wrapped");
}

static void test_chunked_stream(void)
{
    static const char msg[] = "4\r\nabcd\r\n0\r\n\r\nGET / HTTP/1.1\r\n";
    nw_chunked d;
    char out[64];
    size_t got = 99;
    long r;
    char *in = guard(S(msg));

    nw_chunked_init(&d, 0, 64);
    r = nw_chunked_decode(&d, in, sizeof msg - 1, out, &got);
    is(r, 14, "stops right after the message; pipelined bytes left");
    ok(d.done == 1 && got == 4 && memcmp(out, "abcd", 4) == 0, "done, payload decoded");
    ok(d.payload == 4 && d.overhead == 10, "payload and overhead counters");
    r = nw_chunked_decode(&d, in + 14, sizeof msg - 15, out, &got);
    ok(r == 0 && got == 0, "after done: consumes nothing");

    nw_chunked_init(&d, 0, 64);
    r = nw_chunked_decode(&d, in, 0, out, &got);
    ok(r == 0 && got == 0 && !d.done, "empty input");

    in = guard(S("5\r\nhelXo\r\n"));
    nw_chunked_init(&d, 0, 64);
    r = nw_chunked_decode(&d, in, 7, out, &got);
    ok(r == 7 && got == 4 && !d.done, "partial data");
    r = nw_chunked_decode(&d, in + 7, 3, out, &got);
    ok(r == 3 && got == 1 && out[0] == 'o', "rest of the data");

    in = guard(S("zz\r\n0\r\n\r\n"));
    nw_chunked_init(&d, 0, 64);
    r = nw_chunked_decode(&d, in, 9, out, &got);
    is(r, NW_CHUNKED_ERROR, "bad size: error");
    r = nw_chunked_decode(&d, in + 4, 5, out, &got);
    is(r, NW_CHUNKED_ERROR, "errors are sticky");

    in = guard(S("5\r\nhello\r\n"));
    nw_chunked_init(&d, 4, 64);
    r = nw_chunked_decode(&d, in, 10, out, &got);
    is(r, NW_CHUNKED_TOO_LARGE, "too large");
    r = nw_chunked_decode(&d, in, 10, out, &got);
    is(r, NW_CHUNKED_TOO_LARGE, "too large is sticky");
}

/* ---------------------------------------------------------- percent/name */

static void pd(const char *s, size_t n, const char *want, const char *name)
{
    char out[256];
    char *in = guard(s, n);
    size_t got = nw_percent_decode(in, n, out);
    is_str(out, got, want, name);
}

#define PD(lit, want, name) pd(S(lit), want, name)

static void test_percent_decode(void)
{
    char *in;
    size_t got;

    PD("/a%20b", "/a b", "%20");
    PD("%41%42%43", "ABC", "consecutive escapes");
    PD("%2f%2F", "//", "hex case-insensitive");
    PD("a+b", "a+b", "'+' is not decoded");
    PD("%", "%", "lone % at the end");
    PD("%4", "%4", "% and one digit at the end");
    PD("a%4", "a%4", "% and one digit at the end, after text");
    PD("%zz", "%zz", "malformed escape copied");
    PD("%4g", "%4g", "half-valid escape copied");
    PD("%%41", "%A", "% before a valid escape");
    PD("", "", "empty");
    PD("%e2%9c%93", "\xe2\x9c\x93", "UTF-8 bytes");

    in = guard(S("%00x"));
    {
        char out[8];
        got = nw_percent_decode(in, 4, out);
        ok(got == 2 && out[0] == 0 && out[1] == 'x', "%00 decodes to a NUL byte");
    }
    in = guard(S("/p%41th%2"));
    got = nw_percent_decode(in, 9, in);
    is_str(in, got, "/pAth%2", "in place");
}

static void test_header_is(void)
{
    nw_header h;
    char *name = guard(S("Content-TYPE"));
    h.name = name;
    h.name_len = 12;
    h.value = NULL;
    h.value_len = 0;
    ok(nw_header_is(&h, "content-type", 12), "case-insensitive match");
    ok(!nw_header_is(&h, "content-typ", 11), "shorter literal");
    ok(!nw_header_is(&h, "content-types", 13), "longer literal");
    ok(!nw_header_is(&h, "content_type", 12), "different byte");
    h.name = guard(S("A["));
    h.name_len = 2;
    ok(!nw_header_is(&h, "a{", 2), "only letters fold ('[' is not '{')");
}

/* nw_http_head_end fed a head in two pieces, cut at every point, finds
 * the end where one call over the whole finds it, and never earlier. */
static void test_head_end(void)
{
    static const char *const heads[] = {
        "GET / HTTP/1.1\r\nHost: x\r\n\r\nGET /next HTTP/1.1\r\n",
        "GET / HTTP/1.1\nHost: x\n\nbody",
        "\r\n\r\n\nGET / HTTP/1.1\r\nA: b\n\r\n",
        "GET / HTTP/1.1\r\nA: b\n\rC: d\r\n\r\n",
        "\n\n",
        "GET / HTTP/1.1\r\nA: b\r\n",
        "\n\r\r\n\nGET / HTTP/1.1\r\n\r\n",   /* from the bare CR on: a head */
    };
    static const size_t want[] = { 27, 24, 28, 30, 0, 0, 5 };
    int bad = 0;
    for (size_t h = 0; h < sizeof heads / sizeof heads[0]; h++) {
        size_t len = strlen(heads[h]);
        nw_head_scan whole = { 0, 0 };
        if (nw_http_head_end(heads[h], len, &whole) != want[h]) {
            diag("head %zu: whole scan says %zu", h, nw_http_head_end(heads[h], len, &whole));
            bad++;
        }
        for (size_t cut = 0; cut <= len; cut++) {
            nw_head_scan sc = { 0, 0 };
            size_t first = nw_http_head_end(heads[h], cut, &sc);
            size_t end = first ? first : nw_http_head_end(heads[h], len, &sc);
            if (end != want[h] || (first && first > cut)) {
                diag("head %zu cut at %zu: %zu then %zu", h, cut, first, end);
                bad++;
            }
        }
    }
    is(bad, 0, "head end: the same wherever the bytes are cut, empty lines before skipped");
}

/* Every prefix of a valid request line can start one; bytes that are not
 * HTTP are refused as soon as they show it. */
static void test_line_can_start(void)
{
    static const char *const good[] = {
        "GET /a?b=c HTTP/1.1\r\nHost: x\r\n\r\n", "\r\n\r\nPOST * HTTP/1.0\n",
        "OPTIONS http://h:8/p HTTP/1.1\r\n",
    };
    int bad = 0;
    for (size_t g = 0; g < sizeof good / sizeof good[0]; g++)
        for (size_t n = 0; n <= strlen(good[g]); n++)
            if (!nw_http_line_can_start(good[g], n)) {
                diag("prefix %zu of good line %zu refused", n, g);
                bad++;
            }
    is(bad, 0, "line start: every prefix of a valid request line is accepted");
    ok(!nw_http_line_can_start("\x16\x03\x01\x00\xa5\x01", 6), "line start: a TLS ClientHello is refused");
    ok(!nw_http_line_can_start("PROXY TCP4 1.2.3.4 5.6.7.8 1 2\r\n", 32), "line start: a PROXY protocol line is refused");
    ok(!nw_http_line_can_start("\r\n\x00\x01", 4), "line start: binary junk after empty lines is refused");
    ok(!nw_http_line_can_start("\rGET", 4), "line start: a bare CR before the line is refused");
    ok(!nw_http_line_can_start("\r\n\r\r", 4), "line start: a bare CR after an empty line is refused");
    ok(nw_http_line_can_start("\r\n\r", 3), "line start: a CR at the end may begin an empty line");
    ok(nw_http_line_can_start("GET /a HTTP/2", 13), "line start: HTTP/2 so far could still be a version");
    ok(!nw_http_line_can_start("GET /a HTTX", 11), "line start: a bad version is refused before the line ends");
    ok(nw_http_line_can_start("GE T", 4), "line start: \"GE T\" could be a method and a target");
    ok(!nw_http_line_can_start("GET  /", 6), "line start: two spaces are refused");
    ok(!nw_http_line_can_start("AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", 39), "line start: a method over 32 bytes is refused");
}

int main(void)
{
    g_page = (size_t)sysconf(_SC_PAGESIZE);
    test_request_line();
    test_request_line_limit();
    test_leading_lines();
    test_line_endings();
    test_headers();
    test_every_byte();
    test_header_limits();
    test_path_query();
    test_request_moved();
    test_prefixes();
    test_content_length();
    test_transfer_encoding();
    test_host();
    test_target_forms();
    test_empty_lines();
    test_connection();
    test_expect();
    test_chunked_basic();
    test_chunked_trailers();
    test_chunked_limits();
    test_chunked_stream();
    test_percent_decode();
    test_header_is();
    test_head_end();
    test_line_can_start();
    free(hdrs);
    if (g_map)
        munmap(g_map, g_map_len);
    return done_testing();
}
