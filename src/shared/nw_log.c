/* Narwhal's own error-log lines (nw_log.h). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "nw_log.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *log_role = "master";

void nw_log_set_role(const char *role)
{
    if (role && *role)
        log_role = role;
}

static char *put_num(char *o, unsigned long v, int width)
{
    char d[24];
    int k = 0;
    do {
        d[k++] = (char)('0' + v % 10);
        v /= 10;
    } while (v && k < (int)sizeof d);
    while (k < width && k < (int)sizeof d)
        d[k++] = '0';
    while (k)
        *o++ = d[--k];
    return o;
}

static char *put_str(char *o, const char *end, const char *s)
{
    while (*s && o < end)
        *o++ = *s++;
    return o;
}

/* Days since 1970-01-01 to a proleptic Gregorian date (civil calendar in
 * 400-year eras of 146097 days, the era starting on 1 March). */
static void civil_from_days(long days, long *y, unsigned *m, unsigned *d)
{
    days += 719468;
    long era = (days >= 0 ? days : days - 146096) / 146097;
    unsigned doe = (unsigned)(days - era * 146097);                 /* [0, 146096] */
    unsigned yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365; /* [0, 399] */
    unsigned doy = doe - (365 * yoe + yoe / 4 - yoe / 100);         /* [0, 365] */
    unsigned mp = (5 * doy + 2) / 153;                              /* [0, 11], from March */
    *d = doy - (153 * mp + 2) / 5 + 1;
    *m = mp < 10 ? mp + 3 : mp - 9;
    *y = (long)yoe + era * 400 + (*m <= 2);
}

size_t nw_log_stamp(char *out, long long secs, unsigned msec)
{
    char *o = out;
    long long days = secs / 86400, rem = secs % 86400;
    if (rem < 0) {
        rem += 86400;
        days--;
    }
    long y;
    unsigned mo, d;
    civil_from_days((long)days, &y, &mo, &d);
    o = put_num(o, (unsigned long)(y < 0 ? 0 : y % 10000), 4);
    *o++ = '-';
    o = put_num(o, mo, 2);
    *o++ = '-';
    o = put_num(o, d, 2);
    *o++ = 'T';
    o = put_num(o, (unsigned long)(rem / 3600), 2);
    *o++ = ':';
    o = put_num(o, (unsigned long)(rem / 60 % 60), 2);
    *o++ = ':';
    o = put_num(o, (unsigned long)(rem % 60), 2);
    *o++ = '.';
    o = put_num(o, msec % 1000, 3);
    *o++ = 'Z';
    return (size_t)(o - out);
}

size_t nw_log_prefix(char *buf, size_t size, const char *level)
{
    char tmp[NW_LOG_PREFIX_MAX + 64];
    char *o = tmp, *end = tmp + NW_LOG_PREFIX_MAX;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    o += nw_log_stamp(o, (long long)ts.tv_sec, (unsigned)(ts.tv_nsec / 1000000));
    o = put_str(o, end, " narwhal[");
    o = put_num(o, (unsigned long)getpid(), 1);
    o = put_str(o, end, "] ");
    o = put_str(o, end - 24, log_role);
    o = put_str(o, end, " ");
    o = put_str(o, end - 8, level ? level : "info");
    o = put_str(o, end, ": ");
    size_t n = (size_t)(o - tmp);
    if (n > size)
        n = size;
    memcpy(buf, tmp, n);
    return n;
}

size_t nw_log_format(char *out, size_t cap, const char *level, const char *msg, size_t len)
{
    char prefix[NW_LOG_PREFIX_MAX];
    size_t plen = nw_log_prefix(prefix, sizeof prefix, level), n = 0, i = 0;
    while (len && msg[len - 1] == '\n')
        len--;
    do {
        const char *nl = len > i ? memchr(msg + i, '\n', len - i) : NULL;
        size_t line = nl ? (size_t)(nl - (msg + i)) : len - i;
        if (n + plen + 1 > cap)
            break;
        memcpy(out + n, prefix, plen);
        n += plen;
        if (line > cap - n - 1)
            line = cap - n - 1;
        memcpy(out + n, msg + i, line);
        n += line;
        out[n++] = '\n';
        if (!nl)
            break;
        i = (size_t)(nl - msg) + 1;
    } while (i < len);
    return n;
}

long nw_log_write(int fd, const char *level, const char *msg, size_t len)
{
    char out[NW_LOG_LINE_MAX + NW_LOG_PREFIX_MAX + 2];
    return (long)write(fd, out, nw_log_format(out, sizeof out, level, msg, len));
}

void nw_log(const char *level, const char *fmt, ...)
{
    char msg[NW_LOG_LINE_MAX];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (k < 0)
        return;
    size_t len = (size_t)k < sizeof msg ? (size_t)k : sizeof msg - 1;
    (void)!nw_log_write(2, level, msg, len);
}

static void limited_summary(nw_log_limit *l, const char *level, const char *what)
{
    if (l->more)
        nw_log(level, "%lu more %s in the last %d s", l->more, what, NW_LOG_LIMIT_MS / 1000);
    l->more = 0;
}

static nw_log_limit *limiters[NW_LOG_LIMITERS];
static int nlimiters;

int nw_log_limited(nw_log_limit *l, long long now_ms, const char *level, const char *fmt, ...)
{
    l->level = level;
    if (!l->listed && nlimiters < NW_LOG_LIMITERS) {
        l->listed = 1;
        limiters[nlimiters++] = l;
    }
    if (now_ms < l->until_ms) {
        l->more++;
        return 0;
    }
    limited_summary(l, level, "like it");
    char msg[NW_LOG_LINE_MAX];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (k >= 0) {
        (void)!nw_log_write(2, level, msg, (size_t)k < sizeof msg ? (size_t)k : sizeof msg - 1);
        size_t n = strnlen(msg, sizeof l->said - 1);
        memcpy(l->said, msg, n);
        l->said[n] = 0;
    }
    l->until_ms = now_ms + NW_LOG_LIMIT_MS;
    return 1;
}

void nw_log_limited_flush(nw_log_limit *l, long long now_ms, const char *level, const char *what)
{
    if (l->more && now_ms >= l->until_ms) {
        limited_summary(l, level, what);
        l->until_ms = 0;
    }
}

void nw_log_limited_flush_all(long long now_ms, int now_anyway)
{
    for (int i = 0; i < nlimiters; i++) {
        nw_log_limit *l = limiters[i];
        if (l->more && (now_anyway || now_ms >= l->until_ms)) {
            char what[sizeof l->said + 16];
            snprintf(what, sizeof what, "like \"%s%s\"", l->said,
                     strlen(l->said) + 1 == sizeof l->said ? "..." : "");
            limited_summary(l, l->level ? l->level : "error", what);
            l->until_ms = 0;
        }
    }
}

void nw_log_limited_unlist(nw_log_limit *l)
{
    for (int i = 0; i < nlimiters; i++)
        if (limiters[i] == l) {
            limiters[i] = limiters[--nlimiters];
            l->listed = 0;
            return;
        }
}
