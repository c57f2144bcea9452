/* The access log (see nw_accesslog.h). Formatting is by hand, not printf:
 * it runs once per request, and a line costs a few hundred instructions
 * this way (bench/accesslog-cost counts them). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "nw_accesslog.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct nw_access_log {
    int      fd;
    int      owns_fd;           /* 0 for standard error */
    int      format;
    int      atomic_whole;      /* a regular file: one write of any size lands whole */
    char    *path;
    size_t   len;
    nw_msec  first_at;          /* when the oldest buffered line was written (0: none) */
    uint64_t lost;
    time_t   stamp_sec;         /* the second the stamps are for */
    char     stamp_clf[32];     /* [24/Nov/2026:03:05:06 +0000] */
    size_t   stamp_clf_len;
    char     stamp_iso[32];     /* 2026-11-24T03:05:06+00:00 */
    size_t   stamp_iso_len;
    char     buf[NW_ACCESS_LOG_BUFFER];
};

/* ------------------------------------------------------------ files */

static int open_path(const char *path, int *owns)
{
    if (!strcmp(path, "-")) {
        *owns = 0;
        return 2;
    }
    *owns = 1;
    return open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
}

static int is_regular(int fd)
{
    struct stat st;
    return fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
}

nw_access_log *nw_access_log_open(const char *path, int format)
{
    nw_access_log *log = calloc(1, sizeof *log);
    if (!log || !(log->path = strdup(path))) {
        free(log);
        errno = ENOMEM;
        return NULL;
    }
    log->fd = open_path(path, &log->owns_fd);
    if (log->fd < 0) {
        int e = errno;
        free(log->path);
        free(log);
        errno = e;
        return NULL;
    }
    log->format = format;
    log->atomic_whole = is_regular(log->fd);
    log->stamp_sec = (time_t)-1;
    return log;
}

/* ------------------------------------------------------------ writing */

static uint64_t count_lines(const char *p, size_t n)
{
    uint64_t lines = 0;
    for (const char *end = p + n; (p = memchr(p, '\n', (size_t)(end - p))); p++)
        lines++;
    return lines;
}

/* How much of buf[0..len) one write may take: all of it for a regular file
 * (appends land whole), else whole lines up to PIPE_BUF (so the lines of
 * workers sharing a pipe never interleave), or one longer line alone. */
static size_t piece(const nw_access_log *log, const char *p, size_t len)
{
    if (log->atomic_whole || len <= PIPE_BUF)
        return len;
    const char *cut = memrchr(p, '\n', PIPE_BUF);
    if (cut)
        return (size_t)(cut - p) + 1;
    const char *nl = memchr(p, '\n', len);
    return nl ? (size_t)(nl - p) + 1 : len;
}

int nw_access_log_flush(nw_access_log *log)
{
    size_t done = 0;
    int rc = 0;
    while (done < log->len) {
        size_t n = piece(log, log->buf + done, log->len - done);
        ssize_t w = write(log->fd, log->buf + done, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            log->lost += count_lines(log->buf + done, log->len - done);
            rc = -1;
            break;
        }
        done += (size_t)w;
        if ((size_t)w < n) {        /* a short write: never wait for the rest */
            log->lost += count_lines(log->buf + done, log->len - done);
            rc = -1;
            break;
        }
    }
    log->len = 0;
    log->first_at = 0;
    return rc;
}

void nw_access_log_tick(nw_access_log *log, nw_msec now_ms)
{
    (void)now_ms;
    if (log && log->len)
        nw_access_log_flush(log);
}

int nw_access_log_reopen(nw_access_log *log)
{
    int owns;
    nw_access_log_flush(log);
    int fd = open_path(log->path, &owns);
    if (fd < 0)
        return -1;
    if (log->owns_fd)
        close(log->fd);
    log->fd = fd;
    log->owns_fd = owns;
    log->atomic_whole = is_regular(fd);
    return 0;
}

uint64_t nw_access_log_lost(const nw_access_log *log)
{
    return log->lost;
}

void nw_access_log_close(nw_access_log *log)
{
    if (!log)
        return;
    nw_access_log_flush(log);
    if (log->owns_fd)
        close(log->fd);
    free(log->path);
    free(log);
}

/* ------------------------------------------------------------ formatting */

static const char hex[] = "0123456789abcdef";
static const char *const months[] = { "Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                      "Jul", "Aug", "Sep", "Oct", "Nov", "Dec" };

static char *put_mem(char *o, const char *s, size_t n)
{
    memcpy(o, s, n);
    return o + n;
}

#define PUT_LIT(o, lit) put_mem((o), (lit), sizeof(lit) - 1)

static char *put_u64(char *o, uint64_t v)
{
    char tmp[20];
    int n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (n)
        *o++ = tmp[--n];
    return o;
}

static char *put_2(char *o, int v)
{
    *o++ = (char)('0' + v / 10 % 10);
    *o++ = (char)('0' + v % 10);
    return o;
}

/* The stamps of the current second, made when the second changes. */
static void refresh_stamps(nw_access_log *log)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (ts.tv_sec == log->stamp_sec)
        return;
    struct tm tm;
    localtime_r(&ts.tv_sec, &tm);
    long off = tm.tm_gmtoff / 60;
    char sign = off < 0 ? '-' : '+';
    if (off < 0)
        off = -off;
    char *o = log->stamp_clf;
    *o++ = '[';
    o = put_2(o, tm.tm_mday);
    *o++ = '/';
    o = put_mem(o, months[tm.tm_mon], 3);
    *o++ = '/';
    o = put_u64(o, (uint64_t)tm.tm_year + 1900);
    *o++ = ':';
    o = put_2(o, tm.tm_hour);
    *o++ = ':';
    o = put_2(o, tm.tm_min);
    *o++ = ':';
    o = put_2(o, tm.tm_sec);
    *o++ = ' ';
    *o++ = sign;
    o = put_2(o, (int)(off / 60));
    o = put_2(o, (int)(off % 60));
    *o++ = ']';
    log->stamp_clf_len = (size_t)(o - log->stamp_clf);
    o = log->stamp_iso;
    o = put_u64(o, (uint64_t)tm.tm_year + 1900);
    *o++ = '-';
    o = put_2(o, tm.tm_mon + 1);
    *o++ = '-';
    o = put_2(o, tm.tm_mday);
    *o++ = 'T';
    o = put_2(o, tm.tm_hour);
    *o++ = ':';
    o = put_2(o, tm.tm_min);
    *o++ = ':';
    o = put_2(o, tm.tm_sec);
    *o++ = sign;
    o = put_2(o, (int)(off / 60));
    *o++ = ':';
    o = put_2(o, (int)(off % 60));
    log->stamp_iso_len = (size_t)(o - log->stamp_iso);
    log->stamp_sec = ts.tv_sec;
}

/* A field inside combined's quotes: '"' and '\' escaped with '\', bytes
 * outside printable ASCII as \xHH (a hostile header cannot end the line or
 * forge a field). At most NW_ACCESS_LOG_FIELD bytes out. */
static char *put_clf(char *o, nw_str s)
{
    char *end = o + NW_ACCESS_LOG_FIELD;
    for (size_t i = 0; i < s.len && o + 4 <= end; i++) {
        unsigned char c = (unsigned char)s.p[i];
        if (c == '"' || c == '\\') {
            *o++ = '\\';
            *o++ = (char)c;
        } else if (c < 0x20 || c >= 0x7f) {
            *o++ = '\\';
            *o++ = 'x';
            *o++ = hex[c >> 4];
            *o++ = hex[c & 15];
        } else {
            *o++ = (char)c;
        }
    }
    return o;
}

size_t nw_utf8_seq_len(const unsigned char *p, size_t left)
{
    unsigned char c = p[0];
    size_t n;
    unsigned char lo = 0x80, hi = 0xbf;     /* the second byte's range */
    if (c < 0x80)
        return 1;
    if (c >= 0xc2 && c <= 0xdf)
        n = 2;
    else if (c >= 0xe0 && c <= 0xef) {
        n = 3;
        if (c == 0xe0)
            lo = 0xa0;                      /* no overlong forms */
        else if (c == 0xed)
            hi = 0x9f;                      /* no surrogates */
    } else if (c >= 0xf0 && c <= 0xf4) {
        n = 4;
        if (c == 0xf0)
            lo = 0x90;                      /* no overlong forms */
        else if (c == 0xf4)
            hi = 0x8f;                      /* nothing above U+10FFFF */
    } else {
        return 0;                           /* 80-C1 (continuations, overlong), F5-FF */
    }
    if (left < n || p[1] < lo || p[1] > hi)
        return 0;
    for (size_t k = 2; k < n; k++)
        if ((p[k] & 0xc0) != 0x80)
            return 0;
    return n;
}

/* A JSON string's contents: valid UTF-8 as it is; '"' and '\' escaped;
 * control characters (below 0x20, 0x7f, and U+0080-U+009F) as \u00XX; a
 * byte that is not part of valid UTF-8 as \u00XX of its value (valid JSON
 * whatever the bytes were). At most NW_ACCESS_LOG_FIELD bytes out, never
 * a sequence cut in two. */
static char *put_json(char *o, nw_str s)
{
    char *end = o + NW_ACCESS_LOG_FIELD;
    const unsigned char *p = (const unsigned char *)s.p;
    for (size_t i = 0; i < s.len && o + 6 <= end;) {
        unsigned char c = p[i];
        if (c >= 0x20 && c < 0x7f) {
            if (c == '"' || c == '\\')
                *o++ = '\\';
            *o++ = (char)c;
            i++;
            continue;
        }
        size_t n = c < 0x80 ? 0 : nw_utf8_seq_len(p + i, s.len - i);
        if (n == 2 && c == 0xc2 && p[i + 1] < 0xa0) {
            c = p[i + 1];                   /* a C1 control: its code point */
            n = 0;
            i++;
        }
        if (n) {
            o = put_mem(o, s.p + i, n);
            i += n;
            continue;
        }
        o = PUT_LIT(o, "\\u00");
        *o++ = hex[c >> 4];
        *o++ = hex[c & 15];
        i++;
    }
    return o;
}

nw_str nw_access_forwarded_for(nw_str xff, char *buf, size_t size)
{
    nw_str none = { NULL, 0 };
    if (!xff.p)
        return none;
    size_t end = xff.len;
    while (end && (xff.p[end - 1] == ' ' || xff.p[end - 1] == '\t'))
        end--;
    size_t start = end;
    while (start && xff.p[start - 1] != ',')
        start--;
    while (start < end && (xff.p[start] == ' ' || xff.p[start] == '\t'))
        start++;
    size_t n = end - start;
    if (n == 0 || n >= size)
        return none;
    memcpy(buf, xff.p + start, n);
    buf[n] = 0;
    unsigned char addr[sizeof(struct in6_addr)];
    if (inet_pton(AF_INET, buf, addr) != 1 && inet_pton(AF_INET6, buf, addr) != 1)
        return none;
    return (nw_str){ buf, n };
}

static char *put_protocol(char *o, int minor)
{
    o = PUT_LIT(o, "HTTP/1.");
    *o++ = (char)('0' + minor);
    return o;
}

/* host - - [time] "METHOD target HTTP/1.x" status bytes "referer" "agent" us pid */
static char *format_combined(const nw_access_log *log, char *o, const nw_access_entry *e)
{
    o = e->remote_addr.len ? put_clf(o, e->remote_addr) : PUT_LIT(o, "-");
    o = PUT_LIT(o, " - - ");
    o = put_mem(o, log->stamp_clf, log->stamp_clf_len);
    o = PUT_LIT(o, " \"");
    if (e->minor_version >= 0) {
        o = put_clf(o, e->method);
        *o++ = ' ';
        o = put_clf(o, e->target);
        *o++ = ' ';
        o = put_protocol(o, e->minor_version);
    } else {
        *o++ = '-';
    }
    o = PUT_LIT(o, "\" ");
    o = put_u64(o, (uint64_t)e->status);
    *o++ = ' ';
    o = e->bytes ? put_u64(o, e->bytes) : PUT_LIT(o, "-");
    o = PUT_LIT(o, " \"");
    o = e->referer.p ? put_clf(o, e->referer) : PUT_LIT(o, "-");
    o = PUT_LIT(o, "\" \"");
    o = e->user_agent.p ? put_clf(o, e->user_agent) : PUT_LIT(o, "-");
    o = PUT_LIT(o, "\" ");
    o = put_u64(o, e->duration_us);
    *o++ = ' ';
    o = put_u64(o, (uint64_t)e->pid);
    *o++ = '\n';
    return o;
}

static char *json_field(char *o, const char *key_and_quote, size_t klen, nw_str v)
{
    o = put_mem(o, key_and_quote, klen);
    o = put_json(o, v);
    *o++ = '"';
    return o;
}

#define JSON_FIELD(o, lit, v) json_field((o), (lit), sizeof(lit) - 1, (v))

static char *format_json(const nw_access_log *log, char *o, const nw_access_entry *e)
{
    o = PUT_LIT(o, "{\"time\":\"");
    o = put_mem(o, log->stamp_iso, log->stamp_iso_len);
    o = JSON_FIELD(o, "\",\"remote_addr\":\"", e->remote_addr);
    if (e->minor_version >= 0) {
        o = JSON_FIELD(o, ",\"method\":\"", e->method);
        o = JSON_FIELD(o, ",\"target\":\"", e->target);
        o = PUT_LIT(o, ",\"protocol\":\"");
        o = put_protocol(o, e->minor_version);
        *o++ = '"';
    }
    o = PUT_LIT(o, ",\"status\":");
    o = put_u64(o, (uint64_t)e->status);
    o = PUT_LIT(o, ",\"bytes\":");
    o = put_u64(o, e->bytes);
    o = PUT_LIT(o, ",\"duration_us\":");
    o = put_u64(o, e->duration_us);
    o = PUT_LIT(o, ",\"pid\":");
    o = put_u64(o, (uint64_t)e->pid);
    if (e->referer.p)
        o = JSON_FIELD(o, ",\"referer\":\"", e->referer);
    if (e->user_agent.p)
        o = JSON_FIELD(o, ",\"user_agent\":\"", e->user_agent);
    if (e->request_id.p)
        o = JSON_FIELD(o, ",\"request_id\":\"", e->request_id);
    o = PUT_LIT(o, "}\n");
    return o;
}

void nw_access_log_record(nw_access_log *log, const nw_access_entry *e, nw_msec now_ms)
{
    if (!log)
        return;
    if (NW_ACCESS_LOG_BUFFER - log->len < NW_ACCESS_LOG_LINE)
        nw_access_log_flush(log);
    refresh_stamps(log);
    char *start = log->buf + log->len;
    char *end = log->format == NW_ACCESS_JSON ? format_json(log, start, e)
                                              : format_combined(log, start, e);
    log->len += (size_t)(end - start);
    if (!log->first_at)
        log->first_at = now_ms;
    else if (now_ms - log->first_at >= NW_ACCESS_LOG_FLUSH_MS)
        nw_access_log_flush(log);
}
