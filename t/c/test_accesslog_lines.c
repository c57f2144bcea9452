/* Unit tests of src/worker/nw_accesslog.c: the combined and JSON lines (fields,
 * absent fields, the stamps and their offset), the escaping of hostile
 * bytes and the cut of long fields, and the buffering: when the buffer is
 * written (full, a second old, idle, reopen, close), in whole lines of at
 * most PIPE_BUF on anything but a regular file, and what a failed or
 * short write costs (the lines are counted, never retried). Run by
 * t/06-c-units.t (under ASan and UBSan), or by hand:
 *   cc -std=gnu99 -g -Wall -Wextra -Werror -Isrc/shared -Isrc/worker -Isrc/manager -It/c t/c/test_accesslog_lines.c \
 *      src/worker/nw_accesslog.c src/shared/nw_io.c -o /tmp/test_accesslog_lines && /tmp/test_accesslog_lines
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "nw_accesslog.h"
#include "tap.h"

static char dir[] = "/tmp/nw-accesslog-XXXXXX";

#define S(lit) ((nw_str){ (lit), sizeof(lit) - 1 })
#define ABSENT ((nw_str){ NULL, 0 })

static nw_access_entry entry(void)
{
    nw_access_entry e = {
        .remote_addr = S("127.0.0.1"), .method = S("GET"), .target = S("/a?b=1"),
        .referer = S("http://ref/"), .user_agent = S("curl/7.88.1"), .request_id = ABSENT,
        .minor_version = 1, .status = 200, .bytes = 6, .duration_us = 244, .pid = 6560,
    };
    return e;
}

static char *path_of(const char *name)
{
    static char buf[256];
    snprintf(buf, sizeof buf, "%s/%s", dir, name);
    return buf;
}

/* The whole file (NUL-terminated; its length in *len). */
static char *slurp(const char *path, size_t *len)
{
    static char buf[1 << 20];
    *len = 0;
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return buf;
    ssize_t r;
    while ((r = read(fd, buf + *len, sizeof buf - 1 - *len)) > 0)
        *len += (size_t)r;
    close(fd);
    buf[*len] = 0;
    return buf;
}

static off_t size_of(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? st.st_size : -1;
}

static int count_char(const char *p, size_t n, char c)
{
    int k = 0;
    for (size_t i = 0; i < n; i++)
        k += p[i] == c;
    return k;
}

static int lines_in(const char *path)
{
    size_t len;
    const char *p = slurp(path, &len);
    return count_char(p, len, '\n');
}

/* The stamps the log should write for the second t, made independently
 * with strftime. */
static void stamps(time_t t, char *clf, size_t clfn, char *iso, size_t ison)
{
    struct tm tm;
    localtime_r(&t, &tm);
    char zone[8], tmp[40];
    strftime(zone, sizeof zone, "%z", &tm);           /* +0530 */
    strftime(clf, clfn, "[%d/%b/%Y:%H:%M:%S %z]", &tm);   /* (the C locale's month names) */
    strftime(tmp, sizeof tmp, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(iso, ison, "%s%.3s:%s", tmp, zone, zone + 3);
}

/* The second of the wall clock the log reads (CLOCK_REALTIME). Not
 * time(NULL): that is the kernel's coarse seconds, moved on at the next
 * timer tick, so for up to a tick (4.6 ms measured on a 2-core VM) after
 * a second begins it still says the last one while CLOCK_REALTIME, and
 * the log's stamp, say the new one. */
static time_t now_sec(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ts.tv_sec;
}

/* One line recorded into a fresh log and flushed: the line, in buf; the
 * seconds of the clock just before and just after the record in t0, t1. */
static size_t one_line(int format, const nw_access_entry *e, char *out, size_t outn,
                       time_t *t0, time_t *t1)
{
    const char *path = path_of("one.log");
    unlink(path);
    nw_access_log *log = nw_access_log_open(path, format);
    if (!log)
        return 0;
    *t0 = now_sec();
    nw_access_log_record(log, e, 1000);
    *t1 = now_sec();
    nw_access_log_close(log);
    size_t len;
    char *got = slurp(path, &len);
    if (len >= outn)
        len = outn - 1;
    memcpy(out, got, len);
    out[len] = 0;
    return len;
}

/* One diagnostic line: label, then s (n bytes) quoted, with '\n' as \n
 * and other bytes outside printable ASCII as \xHH, so a line that ends in
 * a newline (or holds one) stays one TAP comment line. */
static void print_escaped(const char *label, const char *s, size_t n)
{
    printf("# %s'", label);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n')
            printf("\\n");
        else if (c < 0x20 || c >= 0x7f)
            printf("\\x%02x", c);
        else
            putchar(c);
    }
    printf("'\n");
}

/* The line of e, in format, against want with "%T" standing for the
 * stamp (either second the record may have read). */
static void line_is(int format, const nw_access_entry *e, const char *want, const char *name)
{
    static char got[NW_ACCESS_LOG_LINE + 64], exp0[NW_ACCESS_LOG_LINE + 64], exp1[NW_ACCESS_LOG_LINE + 64];
    time_t t0, t1;
    size_t len = one_line(format, e, got, sizeof got, &t0, &t1);
    char clf[64], iso[64];
    char *exps[2] = { exp0, exp1 };
    time_t ts[2] = { t0, t1 };
    for (int k = 0; k < 2; k++) {
        stamps(ts[k], clf, sizeof clf, iso, sizeof iso);
        const char *stamp = format == NW_ACCESS_JSON ? iso : clf;
        char *o = exps[k];
        for (const char *p = want; *p; p++) {
            if (p[0] == '%' && p[1] == 'T') {
                o += sprintf(o, "%s", stamp);
                p++;
            } else {
                *o++ = *p;
            }
        }
        *o = 0;
    }
    int pass = (len == strlen(exp0) && !memcmp(got, exp0, len))
            || (len == strlen(exp1) && !memcmp(got, exp1, len));
    if (!ok(pass, name)) {
        print_escaped("         got: ", got, len);
        print_escaped("    expected: ", exp0, strlen(exp0));
        if (strcmp(exp0, exp1))
            print_escaped("          or: ", exp1, strlen(exp1));
        printf("#   (seconds read before and after the record: %lld, %lld)\n",
               (long long)t0, (long long)t1);
    }
}

static void test_combined(void)
{
    nw_access_entry e = entry();
    line_is(NW_ACCESS_COMBINED, &e,
            "127.0.0.1 - - %T \"GET /a?b=1 HTTP/1.1\" 200 6 \"http://ref/\" \"curl/7.88.1\" 244 6560\n",
            "combined: the classic fields, then microseconds and pid");
    e.minor_version = 0;
    e.bytes = 0;
    e.referer = ABSENT;
    e.user_agent = ABSENT;
    e.request_id = S("abc");
    e.status = 304;
    line_is(NW_ACCESS_COMBINED, &e,
            "127.0.0.1 - - %T \"GET /a?b=1 HTTP/1.0\" 304 - \"-\" \"-\" 244 6560\n",
            "combined: HTTP/1.0, no body is '-', absent headers are '-', no request id");
    e = entry();
    e.remote_addr = (nw_str){ "", 0 };
    e.minor_version = -1;
    e.status = 400;
    e.referer = (nw_str){ "", 0 };
    e.duration_us = 0;
    e.bytes = 18446744073709551615ULL;
    line_is(NW_ACCESS_COMBINED, &e,
            "- - - %T \"-\" 400 18446744073709551615 \"\" \"curl/7.88.1\" 0 6560\n",
            "combined: no address, no request line, an empty Referer, the largest count");
}

static void test_json(void)
{
    nw_access_entry e = entry();
    e.request_id = S("req-1");
    line_is(NW_ACCESS_JSON, &e,
            "{\"time\":\"%T\",\"remote_addr\":\"127.0.0.1\",\"method\":\"GET\",\"target\":\"/a?b=1\","
            "\"protocol\":\"HTTP/1.1\",\"status\":200,\"bytes\":6,\"duration_us\":244,\"pid\":6560,"
            "\"referer\":\"http://ref/\",\"user_agent\":\"curl/7.88.1\",\"request_id\":\"req-1\"}\n",
            "json: every field");
    e.minor_version = -1;
    e.status = 408;
    e.bytes = 0;
    e.referer = ABSENT;
    e.user_agent = ABSENT;
    e.request_id = ABSENT;
    line_is(NW_ACCESS_JSON, &e,
            "{\"time\":\"%T\",\"remote_addr\":\"127.0.0.1\",\"status\":408,\"bytes\":0,"
            "\"duration_us\":244,\"pid\":6560}\n",
            "json: no request line, no headers: those keys are left out; 0 bytes is 0");
}

static void test_escaping(void)
{
    nw_access_entry e = entry();
    e.target = S("/\"q\"\\\n\r\t\x01\x7f\x80\xff");
    e.user_agent = S("x\" 200 0 \"evil\nforged line");
    e.referer = S("a\0b");
    line_is(NW_ACCESS_COMBINED, &e,
            "127.0.0.1 - - %T \"GET /\\\"q\\\"\\\\\\x0a\\x0d\\x09\\x01\\x7f\\x80\\xff HTTP/1.1\" 200 6 "
            "\"a\\x00b\" \"x\\\" 200 0 \\\"evil\\x0aforged line\" 244 6560\n",
            "combined: quote and backslash escaped, other bytes as \\xHH: no forged field or line");
    e.request_id = S("\x1f\"");
    line_is(NW_ACCESS_JSON, &e,
            "{\"time\":\"%T\",\"remote_addr\":\"127.0.0.1\",\"method\":\"GET\","
            "\"target\":\"/\\\"q\\\"\\\\\\u000a\\u000d\\u0009\\u0001\\u007f\\u0080\\u00ff\","
            "\"protocol\":\"HTTP/1.1\",\"status\":200,\"bytes\":6,\"duration_us\":244,\"pid\":6560,"
            "\"referer\":\"a\\u0000b\",\"user_agent\":\"x\\\" 200 0 \\\"evil\\u000aforged line\","
            "\"request_id\":\"\\u001f\\\"\"}\n",
            "json: quote and backslash escaped, other bytes as \\u00XX (valid JSON whatever the bytes)");
}

/* A field is cut at NW_ACCESS_LOG_FIELD bytes at most once escaped (less
 * the longest escape at least), never inside an escape; six longest
 * fields make a line within NW_ACCESS_LOG_LINE. */
static void test_cut(void)
{
    static char plain[3 * NW_ACCESS_LOG_FIELD], ctl[3 * NW_ACCESS_LOG_FIELD];
    static char got[2 * NW_ACCESS_LOG_LINE];
    memset(plain, 'a', sizeof plain);
    memset(ctl, 1, sizeof ctl);
    nw_access_entry e = entry();
    time_t t0, t1;

    e.target = (nw_str){ plain, sizeof plain };
    size_t len = one_line(NW_ACCESS_COMBINED, &e, got, sizeof got, &t0, &t1);
    char *q = strstr(got, "\"GET ");
    char *sp = q ? strchr(q + 5, ' ') : NULL;
    long cut = sp ? sp - (q + 5) : -1;
    ok(cut > NW_ACCESS_LOG_FIELD - 4 && cut <= NW_ACCESS_LOG_FIELD,
       "combined: a long target is cut at the field size");
    ok(sp && !strncmp(sp, " HTTP/1.1\" 200", 14), "... and the line goes on after it");

    e.target = (nw_str){ ctl, sizeof ctl };
    len = one_line(NW_ACCESS_COMBINED, &e, got, sizeof got, &t0, &t1);
    q = strstr(got, "\"GET ");
    sp = q ? strchr(q + 5, ' ') : NULL;
    is(sp ? sp - (q + 5) : -1, NW_ACCESS_LOG_FIELD, "combined: escaped, cut at the field size (512 \\x01)");
    ok(sp && !memcmp(sp - 4, "\\x01 ", 5), "... after a whole escape");

    ctl[0] = 'a';                /* one byte, then escapes: 2048 is no longer a whole number of them */
    len = one_line(NW_ACCESS_COMBINED, &e, got, sizeof got, &t0, &t1);
    q = strstr(got, "\"GET ");
    sp = q ? strchr(q + 5, ' ') : NULL;
    cut = sp ? sp - (q + 5) : -1;
    ok(cut > NW_ACCESS_LOG_FIELD - 4 && cut <= NW_ACCESS_LOG_FIELD && sp && !memcmp(sp - 4, "\\x01 ", 5),
       "combined: 'a' then escapes: within the field size, after a whole escape");
    ctl[0] = 1;

    e.target = (nw_str){ ctl, sizeof ctl };
    len = one_line(NW_ACCESS_JSON, &e, got, sizeof got, &t0, &t1);
    q = strstr(got, "\"target\":\"");
    char *end = q ? strstr(q + 10, "\",\"protocol\"") : NULL;
    is(end ? end - (q + 10) : -1, NW_ACCESS_LOG_FIELD / 6 * 6,
       "json: cut within the field size, after a whole \\u0001");

    nw_str longest = { ctl, sizeof ctl };
    e.remote_addr = e.method = e.target = e.referer = e.user_agent = e.request_id = longest;
    e.bytes = e.duration_us = UINT64_MAX;
    e.status = 999;
    e.pid = INT_MAX;
    len = one_line(NW_ACCESS_JSON, &e, got, sizeof got, &t0, &t1);
    ok(len > 6 * (NW_ACCESS_LOG_FIELD - 6) && len <= NW_ACCESS_LOG_LINE,
       "json: six longest fields make a line within NW_ACCESS_LOG_LINE");
    is(count_char(got, len, '\n'), 1, "... one line");
    len = one_line(NW_ACCESS_COMBINED, &e, got, sizeof got, &t0, &t1);
    ok(len > 5 * (NW_ACCESS_LOG_FIELD - 4) && len <= NW_ACCESS_LOG_LINE,
       "combined: five longest fields make a line within NW_ACCESS_LOG_LINE");
    is(count_char(got, len, '\n'), 1, "... one line");
}

/* The offset of the local zone, both signs and half hours. */
static void test_zones(void)
{
    static const struct { const char *tz, *clf, *iso; } zones[] = {
        { "UTC0", "+0000]", "+00:00\"" },
        { "<+0530>-5:30", "+0530]", "+05:30\"" },
        { "<-0330>3:30", "-0330]", "-03:30\"" },
    };
    char got[NW_ACCESS_LOG_LINE];
    time_t t0, t1;
    nw_access_entry e = entry();
    for (size_t i = 0; i < sizeof zones / sizeof zones[0]; i++) {
        setenv("TZ", zones[i].tz, 1);
        tzset();
        char name[128];
        snprintf(name, sizeof name, "TZ=%s: the combined stamp, right to the second", zones[i].tz);
        line_is(NW_ACCESS_COMBINED, &e,
                "127.0.0.1 - - %T \"GET /a?b=1 HTTP/1.1\" 200 6 \"http://ref/\" \"curl/7.88.1\" 244 6560\n",
                name);
        one_line(NW_ACCESS_COMBINED, &e, got, sizeof got, &t0, &t1);
        snprintf(name, sizeof name, "TZ=%s: offset %.5s", zones[i].tz, zones[i].clf);
        ok(strstr(got, zones[i].clf) != NULL, name);
        one_line(NW_ACCESS_JSON, &e, got, sizeof got, &t0, &t1);
        snprintf(name, sizeof name, "TZ=%s: json offset %.6s", zones[i].tz, zones[i].iso);
        ok(strstr(got, zones[i].iso) != NULL, name);
    }
    setenv("TZ", "UTC0", 1);
    tzset();
}

/* Whether line carries the combined stamp of t0 or of t1. */
static int has_stamp(const char *line, time_t t0, time_t t1)
{
    char clf[64], iso[64];
    stamps(t0, clf, sizeof clf, iso, sizeof iso);
    if (strstr(line, clf))
        return 1;
    stamps(t1, clf, sizeof clf, iso, sizeof iso);
    return strstr(line, clf) != NULL;
}

/* One log kept open across a second: the stamps made for the first line
 * are not reused for the second. */
static void test_stamp_follows_clock(void)
{
    const char *path = path_of("sec.log");
    unlink(path);
    nw_access_log *log = nw_access_log_open(path, NW_ACCESS_COMBINED);
    if (!ok(log != NULL, "open a log to keep across a second"))
        return;
    nw_access_entry e = entry();
    time_t a0 = now_sec();
    nw_access_log_record(log, &e, 1000);
    time_t a1 = now_sec();
    struct timespec ts, nap;
    clock_gettime(CLOCK_REALTIME, &ts);             /* on to 1 ms into the next second */
    nap.tv_sec = 0;
    nap.tv_nsec = 1000000000L - ts.tv_nsec + 1000000L;
    if (nap.tv_nsec >= 1000000000L) {
        nap.tv_sec = 1;
        nap.tv_nsec -= 1000000000L;
    }
    while (nanosleep(&nap, &nap) < 0 && errno == EINTR)
        ;
    time_t b0 = now_sec();
    nw_access_log_record(log, &e, 1000);            /* same monotonic ms: no flush between */
    time_t b1 = now_sec();
    nw_access_log_close(log);
    size_t len;
    char *got = slurp(path, &len);
    char *second = memchr(got, '\n', len);
    ok(second && b0 > a1, "two lines, the second recorded a second later");
    if (!second)
        return;
    *second++ = 0;
    if (!ok(has_stamp(got, a0, a1), "the first line: its second"))
        print_escaped("         got: ", got, strlen(got));
    if (!ok(has_stamp(second, b0, b1), "the second line: the new second, not the cached stamp"))
        print_escaped("         got: ", second, strlen(second));
}

/* When the buffer is written. */
static void test_buffering(void)
{
    const char *path = path_of("buf.log");
    unlink(path);
    nw_access_log *log = nw_access_log_open(path, NW_ACCESS_COMBINED);
    ok(log != NULL, "open a file");
    if (!log)
        return;
    nw_access_entry e = entry();
    nw_access_log_record(log, &e, 5000);
    nw_access_log_record(log, &e, 5500);
    nw_access_log_record(log, &e, 5999);
    is(size_of(path), 0, "three lines within a second stay in the buffer");
    nw_access_log_record(log, &e, 6000);
    size_t len;
    char *got = slurp(path, &len);
    is(count_char(got, len, '\n'), 4, "the line a second after the oldest writes all four");
    nw_access_log_record(log, &e, 6000);
    is(lines_in(path), 4, "the next line waits again");
    nw_access_log_record(log, &e, 6999);
    is(lines_in(path), 4, "... counted from it (999 ms later: still buffered)");
    nw_access_log_tick(log, 7000);
    is(lines_in(path), 6, "idle (tick): what waits is written");
    off_t before = size_of(path);
    nw_access_log_tick(log, 9000);
    is(size_of(path), before, "idle with nothing buffered: nothing written");
    is(nw_access_log_flush(log), 0, "flushing nothing: 0");

    /* Full: a line that may not fit writes the buffer first, whole lines. */
    static char big[1000];
    memset(big, 'u', sizeof big);
    e.user_agent = (nw_str){ big, sizeof big };
    unlink(path);
    nw_access_log_reopen(log);
    int n = 0;
    while (size_of(path) == 0 && n < 1000) {
        nw_access_log_record(log, &e, 10000);
        n++;
    }
    got = slurp(path, &len);
    is(count_char(got, len, '\n'), n - 1, "a full buffer is written before the line that may not fit");
    ok(len <= NW_ACCESS_LOG_BUFFER && len + NW_ACCESS_LOG_LINE + 1100 > NW_ACCESS_LOG_BUFFER,
       "... once less than a longest line's room is left");
    ok(len && got[len - 1] == '\n', "... in whole lines");
    nw_access_log_close(log);
    got = slurp(path, &len);
    is(count_char(got, len, '\n'), n, "close writes the rest");

    nw_access_log_record(NULL, &e, 1);
    nw_access_log_tick(NULL, 1);
    nw_access_log_close(NULL);
    ok(1, "no log: record, tick and close do nothing");
}

/* USR1: flush, then open the path anew; a failed reopen keeps the file. */
static void test_reopen(void)
{
    char path[256], old[256], gone[256];
    snprintf(path, sizeof path, "%s", path_of("r.log"));
    snprintf(old, sizeof old, "%s", path_of("r.log.1"));
    snprintf(gone, sizeof gone, "%s", path_of("sub"));
    mkdir(gone, 0700);
    strcat(gone, "/r.log");
    nw_access_log *log = nw_access_log_open(path, NW_ACCESS_JSON);
    nw_access_entry e = entry();
    nw_access_log_record(log, &e, 100);
    rename(path, old);
    is(nw_access_log_reopen(log), 0, "reopen after the file was renamed");
    is(lines_in(old), 1, "the buffered line went to the old file first");
    nw_access_log_record(log, &e, 200);
    nw_access_log_flush(log);
    is(lines_in(path), 1, "new lines go to the new file");
    nw_access_log_close(log);

    log = nw_access_log_open(gone, NW_ACCESS_COMBINED);
    ok(log != NULL, "open in a directory");
    unlink(gone);
    rmdir(path_of("sub"));
    nw_access_log_record(log, &e, 300);
    errno = 0;
    is(nw_access_log_reopen(log), -1, "reopen when the directory is gone: -1");
    is(errno, ENOENT, "... ENOENT");
    is(nw_access_log_lost(log), 0, "... the line buffered before was written, not lost");
    nw_access_log_record(log, &e, 400);
    is(nw_access_log_flush(log), 0, "the old file is kept: writing still works");
    nw_access_log_close(log);

    errno = 0;
    ok(nw_access_log_open(path_of("no/such/dir.log"), NW_ACCESS_COMBINED) == NULL,
       "open in a missing directory: NULL");
    is(errno, ENOENT, "... with errno");
}

/* A write that fails drops the lines and counts them; never a retry. */
static void test_failures(void)
{
    nw_access_log *log = nw_access_log_open("/dev/full", NW_ACCESS_COMBINED);
    ok(log != NULL, "open /dev/full");
    if (!log)
        return;
    nw_access_entry e = entry();
    for (int i = 0; i < 3; i++)
        nw_access_log_record(log, &e, 100);
    is(nw_access_log_flush(log), -1, "a failed write: -1");
    is(nw_access_log_lost(log), 3, "... its three lines counted as lost");
    is(nw_access_log_flush(log), 0, "the buffer is empty afterwards");
    nw_access_log_record(log, &e, 100);
    nw_access_log_close(log);    /* (the last line is lost too; nothing to read) */
}

/* Standard error ("-") as a socket or a pipe, in place of fd 2 for the
 * length of f; restored afterwards (sanitizer reports go there). */
static int saved_stderr = -1;
static void swap_stderr(int fd)
{
    if (saved_stderr < 0)
        saved_stderr = dup(2);
    dup2(fd, 2);
}
static void restore_stderr(void)
{
    dup2(saved_stderr, 2);
    close(saved_stderr);
    saved_stderr = -1;
}

/* Not a regular file: pieces of whole lines of at most PIPE_BUF, one
 * longer line alone. A SOCK_SEQPACKET pair shows each write as it was. */
static void test_pieces(void)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) {
        ok(0, "socketpair");
        return;
    }
    int sz = 1 << 20;
    setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz);
    setsockopt(sv[1], SOL_SOCKET, SO_RCVBUF, &sz, sizeof sz);
    swap_stderr(sv[0]);
    nw_access_log *log = nw_access_log_open("-", NW_ACCESS_COMBINED);
    nw_access_entry e = entry();
    static char mid[1500], huge[2000];
    memset(mid, 'm', sizeof mid);
    memset(huge, 'h', sizeof huge);
    int lines = 0;
    for (int i = 0; i < 20; i++, lines++) {
        nw_str h = { huge, sizeof huge }, m = { mid, sizeof mid };
        e.user_agent = i == 9 ? h : m;     /* line 9: three fields of 2000, over PIPE_BUF */
        e.referer = e.target = i == 9 ? h : S("/");
        nw_access_log_record(log, &e, 100);
    }
    int rc = nw_access_log_flush(log);
    nw_access_log_close(log);
    int still_open = fcntl(2, F_GETFD) >= 0;
    restore_stderr();
    is(rc, 0, "standard error (a socket): written");
    ok(still_open, "... and not closed by close");
    close(sv[0]);

    /* Each piece whole lines; at most PIPE_BUF unless one line alone;
     * and no piece that could have taken the next one's first line. */
    static char msg[1 << 16];
    ssize_t r, prev = 0;
    int pieces = 0, bad = 0, got_lines = 0, alone = 0;
    while ((r = recv(sv[1], msg, sizeof msg, MSG_DONTWAIT)) > 0) {
        pieces++;
        int nl = count_char(msg, (size_t)r, '\n');
        got_lines += nl;
        const char *first_end = memchr(msg, '\n', (size_t)r);
        ssize_t first = first_end ? first_end - msg + 1 : r;
        if (msg[r - 1] != '\n')
            bad++;
        else if (r > PIPE_BUF && nl != 1)
            bad++;
        else if (r > PIPE_BUF)
            alone++;
        if (prev && prev <= PIPE_BUF && prev + first <= PIPE_BUF)
            bad++;
        prev = r;
    }
    close(sv[1]);
    is(got_lines, lines, "every line arrived");
    is(bad, 0, "in whole lines, each piece at most PIPE_BUF, as full as lines allow");
    is(alone, 1, "the line longer than PIPE_BUF went alone");
    ok(pieces >= 20 * 1600 / PIPE_BUF, "several pieces");
}

/* A short write (a non-blocking pipe with room for part of a line) drops
 * the rest at once; a pipe with no room drops all. */
static void test_short_write(void)
{
    int p[2];
    if (pipe2(p, O_NONBLOCK | O_CLOEXEC) < 0 || fcntl(p[1], F_SETPIPE_SZ, 4096) < 0) {
        ok(0, "a pipe of one page");
        return;
    }
    swap_stderr(p[1]);
    nw_access_log *log = nw_access_log_open("-", NW_ACCESS_JSON);
    nw_access_entry e = entry();
    static char huge[2000];
    memset(huge, 'h', sizeof huge);
    e.user_agent = e.referer = e.target = (nw_str){ huge, sizeof huge };   /* over 4096 */
    nw_access_log_record(log, &e, 100);
    int rc1 = nw_access_log_flush(log);
    uint64_t lost1 = nw_access_log_lost(log);
    e = entry();
    nw_access_log_record(log, &e, 100);
    nw_access_log_record(log, &e, 100);
    int rc2 = nw_access_log_flush(log);   /* the pipe is full */
    uint64_t lost2 = nw_access_log_lost(log);
    nw_access_log_close(log);
    restore_stderr();
    is(rc1, -1, "a short write: -1");
    is(lost1, 1, "... the line it cut counted as lost");
    is(rc2, -1, "a full pipe (EAGAIN): -1");
    is(lost2, 3, "... both lines counted, nothing waits for room");
    static char buf[8192];
    ssize_t r = read(p[0], buf, sizeof buf);
    is(r, 4096, "the pipe got what fitted, once");
    close(p[0]);
    close(p[1]);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    setenv("TZ", "UTC0", 1);
    tzset();
    test_combined();
    test_json();
    test_escaping();
    test_cut();
    test_zones();
    test_stamp_follows_clock();
    test_buffering();
    test_reopen();
    test_failures();
    test_pieces();
    test_short_write();
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        diag("could not remove %s", dir);
    return done_testing();
}
