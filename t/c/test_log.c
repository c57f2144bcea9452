/* Unit tests for src/shared/nw_log.c (Narwhal's own error-log lines), printing
 * TAP: the time stamp against gmtime_r over a range of dates, the prefix's
 * shape, and the formatter's line splitting. */
#define _GNU_SOURCE
#include "nw_log.h"
#include "tap.h"

#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int stamp_matches(long long secs, unsigned ms)
{
    char got[NW_LOG_STAMP_LEN + 1], want[64];
    size_t n = nw_log_stamp(got, secs, ms);
    got[n] = 0;
    time_t t = (time_t)secs;
    struct tm tm;
    gmtime_r(&t, &tm);
    size_t k = strftime(want, sizeof want, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(want + k, sizeof want - k, ".%03uZ", ms);
    if (n != NW_LOG_STAMP_LEN || strcmp(got, want)) {
        printf("# %lld: got '%s', want '%s'\n", secs, got, want);
        return 0;
    }
    return 1;
}

static int matches(const char *re, const char *s)
{
    regex_t r;
    if (regcomp(&r, re, REG_EXTENDED | REG_NEWLINE))
        return 0;
    int ok = regexec(&r, s, 0, NULL, 0) == 0;
    regfree(&r);
    return ok;
}

int main(void)
{
    /* every day from 1970 to 2110, at a time of day that moves, and the
     * edges: leap days, the turn of centuries, the end of a day */
    int bad = 0;
    for (long long d = 0; d < 141 * 366; d++)
        bad += !stamp_matches(d * 86400 + (d * 7919) % 86400, (unsigned)(d % 1000));
    ok(bad == 0, "the stamp agrees with gmtime_r on every day 1970-2110");
    ok(stamp_matches(951782400LL, 0), "2000-02-29 (a leap day in a century divisible by 400)");
    ok(stamp_matches(4107456000LL + 86400LL * 59, 5), "2100-03-01 (2100 is no leap year)");
    ok(stamp_matches(1795708799LL, 999), "the last millisecond of a day");

    char buf[NW_LOG_PREFIX_MAX];
    nw_log_set_role("manager");
    size_t n = nw_log_prefix(buf, sizeof buf, "warn");
    buf[n < sizeof buf ? n : sizeof buf - 1] = 0;
    char re[128];
    snprintf(re, sizeof re,
             "^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3}Z narwhal\\[%d\\] manager warn: $",
             (int)getpid());
    if (!ok(matches(re, buf), "the prefix: time, narwhal[pid], role, level"))
        diag("got '%s'", buf);

    /* CLOCK_REALTIME, the clock the prefix reads: time(NULL) is coarse
     * and lags its second by up to a timer tick after each boundary. */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    time_t before = ts.tv_sec;
    n = nw_log_prefix(buf, sizeof buf, "info");
    clock_gettime(CLOCK_REALTIME, &ts);
    time_t after = ts.tv_sec;
    int now_ok = 0;
    for (time_t t = before; t <= after; t++) {
        char s[NW_LOG_STAMP_LEN];
        nw_log_stamp(s, (long long)t, 0);
        now_ok |= !memcmp(s, buf, 19);
    }
    ok(now_ok, "the prefix carries the current time (to the second)");

    char out[1024];
    const char *msg = "first line\n  at app.psgi line 3\n\n";
    n = nw_log_format(out, sizeof out, "error", msg, strlen(msg));
    out[n] = 0;
    snprintf(re, sizeof re, "^[^ ]+Z narwhal\\[%d\\] manager error: first line\n"
                            "[^ ]+Z narwhal\\[%d\\] manager error:   at app.psgi line 3\n$",
             (int)getpid(), (int)getpid());
    if (!ok(matches(re, out), "each line of a message gets the prefix; trailing newlines go"))
        diag("got '%s'", out);

    n = nw_log_format(out, sizeof out, "info", "", 0);
    ok(n > 0 && out[n - 1] == '\n' && memchr(out, '\n', n) == out + n - 1,
       "an empty message is one line");

    /* the limiter: the first line at once, the rest of the interval
     * counted, the count with the next line after it or at a flush */
    int pipefd[2], saved = dup(2);
    if (pipe(pipefd) == 0 && saved >= 0) {
        dup2(pipefd[1], 2);
        static nw_log_limit l;     /* (limiters live as long as the process: flush_all) */
        int wrote = nw_log_limited(&l, 1000, "error", "disk full %d", 1);
        wrote += nw_log_limited(&l, 2000, "error", "disk full %d", 2);
        wrote += nw_log_limited(&l, 10999, "error", "disk full %d", 3);
        nw_log_limited_flush(&l, 5000, "error", "disk failures");     /* too early: nothing */
        wrote += nw_log_limited(&l, 11000, "error", "disk full %d", 4);
        nw_log_limited(&l, 12000, "error", "disk full %d", 5);
        nw_log_limited_flush(&l, 21000, "error", "disk failures");
        nw_log_limited_flush(&l, 40000, "error", "disk failures");    /* nothing left */
        dup2(saved, 2);
        close(pipefd[1]);
        char got[4096];
        ssize_t r = read(pipefd[0], got, sizeof got - 1);
        got[r > 0 ? r : 0] = 0;
        ok(wrote == 2, "limited: 2 of the first 4 lines written (at 0 and 10 s)");
        ok(matches("error: disk full 1\n.*error: 2 more like it in the last 10 s\n"
                   ".*error: disk full 4\n.*error: 1 more disk failures in the last 10 s\n$", got),
           "limited: the first line, then the count with the next, then at a flush");
        if (!matches("disk full 4", got))
            diag("got '%s'", got);
        ok(!matches("disk full [235]", got), "limited: the counted lines are not written");
        close(pipefd[0]);
    }

    /* flush_all: every limiter used, its count written now at an exit
     * (a stop), quoting the line it was counting; once over, nothing */
    if (pipe(pipefd) == 0 && saved >= 0) {
        dup2(pipefd[1], 2);
        static nw_log_limit a, b;
        nw_log_limited(&a, 1000, "warn", "shed GET /x HTTP/1.1: waited %d ms", 300);
        nw_log_limited(&a, 1100, "warn", "shed GET /y HTTP/1.1: waited %d ms", 300);
        nw_log_limited(&a, 1200, "warn", "shed GET /z HTTP/1.1: waited %d ms", 300);
        nw_log_limited(&b, 1000, "error", "cannot spool %s", "POST /u");
        nw_log_limited_flush_all(2000, 0);      /* within the interval: nothing */
        nw_log_limited_flush_all(2000, 1);      /* at an exit: now */
        nw_log_limited_flush_all(3000, 1);      /* nothing left */
        dup2(saved, 2);
        close(pipefd[1]);
        char got[4096];
        ssize_t r = read(pipefd[0], got, sizeof got - 1);
        got[r > 0 ? r : 0] = 0;
        ok(matches("warn: shed GET /x HTTP/1.1: waited 300 ms\n.*error: cannot spool POST /u\n"
                   ".*warn: 2 more like \"shed GET /x HTTP/1.1: waited 300 ms\" in the last 10 s\n$", got),
           "flush_all: a count open at an exit is written, with its level and its line");
        if (!matches("2 more like", got))
            diag("got '%s'", got);
        close(pipefd[0]);
    }

    char small[NW_LOG_PREFIX_MAX + 10];
    n = nw_log_format(small, sizeof small, "info", "0123456789abcdefghij", 20);
    ok(n <= sizeof small && small[n - 1] == '\n', "a message longer than the buffer is cut, still one line");
    return done_testing();
}
