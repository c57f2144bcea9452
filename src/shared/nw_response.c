#include "nw_response.h"
#include "nw_http.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

const char *nw_status_reason(int status, size_t *len)
{
    const char *r;
    switch (status) {
    case 100: r = "Continue"; break;
    case 101: r = "Switching Protocols"; break;
    case 102: r = "Processing"; break;
    case 103: r = "Early Hints"; break;
    case 200: r = "OK"; break;
    case 201: r = "Created"; break;
    case 202: r = "Accepted"; break;
    case 203: r = "Non-Authoritative Information"; break;
    case 204: r = "No Content"; break;
    case 205: r = "Reset Content"; break;
    case 206: r = "Partial Content"; break;
    case 207: r = "Multi-Status"; break;
    case 300: r = "Multiple Choices"; break;
    case 301: r = "Moved Permanently"; break;
    case 302: r = "Found"; break;
    case 303: r = "See Other"; break;
    case 304: r = "Not Modified"; break;
    case 307: r = "Temporary Redirect"; break;
    case 308: r = "Permanent Redirect"; break;
    case 400: r = "Bad Request"; break;
    case 401: r = "Unauthorized"; break;
    case 402: r = "Payment Required"; break;
    case 403: r = "Forbidden"; break;
    case 404: r = "Not Found"; break;
    case 405: r = "Method Not Allowed"; break;
    case 406: r = "Not Acceptable"; break;
    case 408: r = "Request Timeout"; break;
    case 409: r = "Conflict"; break;
    case 410: r = "Gone"; break;
    case 411: r = "Length Required"; break;
    case 412: r = "Precondition Failed"; break;
    case 413: r = "Content Too Large"; break;
    case 414: r = "URI Too Long"; break;
    case 415: r = "Unsupported Media Type"; break;
    case 416: r = "Range Not Satisfiable"; break;
    case 417: r = "Expectation Failed"; break;
    case 421: r = "Misdirected Request"; break;
    case 422: r = "Unprocessable Content"; break;
    case 425: r = "Too Early"; break;
    case 426: r = "Upgrade Required"; break;
    case 428: r = "Precondition Required"; break;
    case 429: r = "Too Many Requests"; break;
    case 431: r = "Request Header Fields Too Large"; break;
    case 500: r = "Internal Server Error"; break;
    case 501: r = "Not Implemented"; break;
    case 502: r = "Bad Gateway"; break;
    case 503: r = "Service Unavailable"; break;
    case 504: r = "Gateway Timeout"; break;
    case 505: r = "HTTP Version Not Supported"; break;
    default:  r = "Unknown"; break;
    }
    *len = strlen(r);
    return r;
}

static const char day_names[] = "SunMonTueWedThuFriSat";
static const char month_names[] = "JanFebMarAprMayJunJulAugSepOctNovDec";

static char *two_digits(char *p, unsigned v)
{
    p[0] = (char)('0' + v / 10 % 10);
    p[1] = (char)('0' + v % 10);
    return p + 2;
}

/* The proleptic Gregorian date of a day counted from 1970-01-01
 * (civil_from_days, after Howard Hinnant's date algorithms). */
static void civil_date(int64_t days, int64_t *year, unsigned *month, unsigned *day)
{
    int64_t z = days + 719468;
    int64_t era = (z >= 0 ? z : z - 146096) / 146097;
    unsigned doe = (unsigned)(z - era * 146097);
    unsigned yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    unsigned doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    unsigned mp = (5 * doy + 2) / 153;
    *day = doy - (153 * mp + 2) / 5 + 1;
    *month = mp < 10 ? mp + 3 : mp - 9;
    *year = (int64_t)yoe + era * 400 + (*month <= 2);
}

size_t nw_date_field(char *out, time_t t)
{
    int64_t days = (int64_t)t / 86400, secs = (int64_t)t % 86400, year;
    unsigned month, day;
    if (secs < 0) {
        secs += 86400;
        days--;
    }
    civil_date(days, &year, &month, &day);
    unsigned wday = (unsigned)(((days + 4) % 7 + 7) % 7);     /* 1970-01-01 was a Thursday */
    unsigned y = year < 0 ? 0 : year > 9999 ? 9999 : (unsigned)year;
    char *p = out;
    memcpy(p, "Date: ", 6);
    memcpy(p + 6, day_names + 3 * wday, 3);
    memcpy(p + 9, ", ", 2);
    p = two_digits(p + 11, day);
    *p++ = ' ';
    memcpy(p, month_names + 3 * (month - 1), 3);
    p[3] = ' ';
    p = two_digits(two_digits(p + 4, y / 100), y % 100);
    *p++ = ' ';
    p = two_digits(p, (unsigned)(secs / 3600));
    *p++ = ':';
    p = two_digits(p, (unsigned)(secs / 60 % 60));
    *p++ = ':';
    p = two_digits(p, (unsigned)(secs % 60));
    memcpy(p, " GMT\r\n", 6);
    return (size_t)(p + 6 - out);
}

static char date_line[NW_DATE_FIELD_LEN];
static time_t date_at = -1;

const char *nw_date_header(size_t *len)
{
    time_t now = time(NULL);
    if (now != date_at) {
        nw_date_field(date_line, now);
        date_at = now;
    }
    *len = NW_DATE_FIELD_LEN;
    return date_line;
}

int nw_header_valid(const char *name, size_t nlen, const char *val, size_t vlen)
{
    if (!nw_http_is_token(name, nlen))
        return 0;
    for (size_t i = 0; i < vlen; i++) {
        unsigned char c = (unsigned char)val[i];
        if (c == '\r' || c == '\n' || c == '\0')
            return 0;
    }
    return 1;
}

int nw_head_status(nw_buf *b, int minor, int status)
{
    size_t rlen;
    const char *reason = nw_status_reason(status, &rlen);
    if (nw_buf_reserve(b, rlen + 32) < 0)
        return -1;
    char *p = b->data + b->len;
    memcpy(p, minor ? "HTTP/1.1 " : "HTTP/1.0 ", 9);
    p[9] = (char)('0' + status / 100 % 10);     /* status is 100-999 */
    p[10] = (char)('0' + status / 10 % 10);
    p[11] = (char)('0' + status % 10);
    p[12] = ' ';
    b->len += 13;
    memcpy(b->data + b->len, reason, rlen);
    b->len += rlen;
    b->data[b->len++] = '\r';
    b->data[b->len++] = '\n';
    return 0;
}

static int name_is(const char *name, size_t nlen, const char *lower)
{
    size_t n = strlen(lower);
    if (n != nlen)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        if (c >= 'A' && c <= 'Z')
            c += 'a' - 'A';
        if (c != lower[i])
            return 0;
    }
    return 1;
}

static int has_token(const char *v, size_t n, const char *lower)
{
    size_t t = strlen(lower);
    for (size_t i = 0; i + t <= n; i++) {
        if ((i == 0 || v[i - 1] == ',' || v[i - 1] == ' ')
            && name_is(v + i, t, lower)
            && (i + t == n || v[i + t] == ',' || v[i + t] == ' '))
            return 1;
    }
    return 0;
}

/* Whether the last coding of a Transfer-Encoding value is chunked
 * (empty list elements and OWS around them ignored, RFC 9110 5.6.1). */
static int last_coding_chunked(const char *v, size_t n)
{
    size_t end = n, start;
    while (end > 0 && (v[end - 1] == ' ' || v[end - 1] == '\t' || v[end - 1] == ','))
        end--;
    start = end;
    while (start > 0 && v[start - 1] != ',' && v[start - 1] != ' ' && v[start - 1] != '\t')
        start--;
    return name_is(v + start, end - start, "chunked");
}

int nw_head_app_header(nw_buf *b, nw_app_headers *seen, const char *name,
                       size_t nlen, const char *val, size_t vlen)
{
    if (!nw_header_valid(name, nlen, val, vlen))
        return -1;
    switch (name[0] | 0x20) {
    case 'c':
        if (name_is(name, nlen, "content-length")) {
            /* digits only (leading zeros too), within int64; else invalid */
            if (nw_http_parse_length(val, vlen, &seen->content_length) != 0)
                return -1;
            if (seen->bodiless)
                return 0;       /* a 1xx or 204 must not carry it */
            seen->has_content_length = 1;
        } else if (name_is(name, nlen, "connection")) {
            if (has_token(val, vlen, "close"))
                seen->wants_close = 1;
            return 0;   /* Narwhal writes its own Connection header */
        }
        break;
    case 'd':
        if (name_is(name, nlen, "date"))
            seen->has_date = 1;
        break;
    case 't':
        if (name_is(name, nlen, "transfer-encoding")) {
            if (seen->bodiless || seen->http10)
                return 0;
            seen->has_transfer_encoding = 1;
            seen->te_chunked = last_coding_chunked(val, vlen);
        }
        break;
    }
    if (nw_buf_reserve(b, nlen + vlen + 4) < 0)
        return -1;
    memcpy(b->data + b->len, name, nlen);
    b->len += nlen;
    b->data[b->len++] = ':';
    b->data[b->len++] = ' ';
    memcpy(b->data + b->len, val, vlen);
    b->len += vlen;
    b->data[b->len++] = '\r';
    b->data[b->len++] = '\n';
    return 0;
}

static int status_has_body(int status)
{
    return !(status < 200 || status == 204 || status == 304);
}

static enum nw_out_framing choose_framing(const nw_app_headers *seen, int minor,
                                          int status, int64_t known_length)
{
    if (!status_has_body(status))
        return NW_OUT_NONE;
    if (seen->has_transfer_encoding)    /* (HTTP/1.1 only: see http10) */
        return seen->te_chunked ? NW_OUT_CHUNKED : NW_OUT_CLOSE;
    if (seen->has_content_length || known_length >= 0)
        return NW_OUT_LENGTH;
    return minor ? NW_OUT_CHUNKED : NW_OUT_CLOSE;
}

/* Take the app's Content-Length lines out of the head built so far (the
 * status line and the app's fields, one "Name: value\r\n" each). */
static void drop_content_length(nw_buf *b)
{
    size_t at = 0, kept = 0;
    while (at < b->len) {
        const char *line = b->data + at;
        const char *lf = memchr(line, '\n', b->len - at);
        size_t len = lf ? (size_t)(lf - line) + 1 : b->len - at;
        const char *colon = memchr(line, ':', len);
        if (at == 0 || !colon || !name_is(line, (size_t)(colon - line), "content-length")) {
            memmove(b->data + kept, line, len);
            kept += len;
        }
        at += len;
    }
    b->len = kept;
}

/* n >= 0 in decimal, without printf's generality (this runs per response).
 * Returns the length written (at most 20). */
static size_t format_decimal(char *out, int64_t n)
{
    char tmp[24];
    size_t len = 0;
    uint64_t u = n < 0 ? 0 : (uint64_t)n;
    do {
        tmp[len++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    for (size_t i = 0; i < len; i++)
        out[i] = tmp[len - 1 - i];
    return len;
}

int nw_head_finish(nw_buf *b, const nw_app_headers *seen,
                   int minor, int status, int is_head,
                   int64_t known_length, int *keep_alive)
{
    enum nw_out_framing f = choose_framing(seen, minor, status, known_length);
    int ka = *keep_alive && !seen->wants_close && f != NW_OUT_CLOSE;
    char num[32];

    if (seen->has_transfer_encoding && seen->has_content_length)
        drop_content_length(b);     /* never both (RFC 9112 6.2): the coding frames it */
    if (!seen->has_date) {
        size_t dlen;
        const char *d = nw_date_header(&dlen);
        if (nw_buf_append(b, d, dlen) < 0)
            return -1;
    }
    /* (HEAD with an empty body: the app left the body out, and the GET's
     * length is not known; none is said rather than a wrong 0, RFC 9110 8.6) */
    if (f == NW_OUT_LENGTH && !seen->has_content_length && !(is_head && known_length == 0)) {
        if (nw_buf_append(b, "Content-Length: ", 16) < 0
            || nw_buf_append(b, num, format_decimal(num, known_length)) < 0
            || nw_buf_append(b, "\r\n", 2) < 0)
            return -1;
    }
    if (f == NW_OUT_CHUNKED && !is_head && !seen->has_transfer_encoding
        && nw_buf_append(b, "Transfer-Encoding: chunked\r\n", 28) < 0)
        return -1;
    if (!ka) {
        if (nw_buf_append(b, "Connection: close\r\n\r\n", 21) < 0)
            return -1;
    } else if (!minor) {
        if (nw_buf_append(b, "Connection: keep-alive\r\n\r\n", 26) < 0)
            return -1;
    } else if (nw_buf_append(b, "\r\n", 2) < 0) {
        return -1;
    }
    *keep_alive = ka;
    if (is_head)
        return NW_OUT_NONE;
    return f;
}

int nw_head_error(nw_buf *b, int status)
{
    size_t rlen;
    const char *reason = nw_status_reason(status, &rlen);
    char body[96];
    int blen = snprintf(body, sizeof body, "%d %s\n", status, reason);
    if (nw_head_status(b, 1, status) < 0)
        return -1;
    size_t dlen;
    const char *d = nw_date_header(&dlen);
    char tail[160];
    int tlen = snprintf(tail, sizeof tail,
                        "Content-Type: text/plain\r\nContent-Length: %d\r\n%s"
                        "Connection: close\r\n\r\n", blen,
                        status == 503 ? "Retry-After: 1\r\n" : "");
    if (nw_buf_append(b, d, dlen) < 0 || nw_buf_append(b, tail, (size_t)tlen) < 0)
        return -1;
    return nw_buf_append(b, body, (size_t)blen);
}

int nw_head_options(nw_buf *b)
{
    static const char rest[] =
        "Allow: " NW_SERVER_METHODS "\r\n"
        "Content-Length: 0\r\nConnection: close\r\n\r\n";
    size_t dlen;
    const char *d = nw_date_header(&dlen);
    if (nw_head_status(b, 1, 200) < 0 || nw_buf_append(b, d, dlen) < 0)
        return -1;
    return nw_buf_append(b, rest, sizeof rest - 1);
}
