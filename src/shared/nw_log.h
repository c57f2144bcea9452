/* Narwhal's own error-log lines: one format for the master, the manager
 * and the workers, so that an operator can grep them and a log shipper
 * can split them:
 *
 *   2026-11-26T13:40:01.123Z narwhal[1234] manager warn: text
 *
 * (UTC time to the millisecond, the process's pid, its role, the level).
 * What the app writes to stderr (warn, psgi.errors) is left as it is, so
 * a line that does not start like this is the app's. The Perl side
 * formats its lines with the same function (Narwhal::log_line, through
 * the XS). No perl.h here. */
#ifndef NW_LOG_H
#define NW_LOG_H

#include <stddef.h>

/* The prefix is at most this long (with the longest role and level). */
#define NW_LOG_PREFIX_MAX 96

/* This process's role in the prefix: "master", "worker", "manager" (a
 * pointer to a string that lives as long as the process). */
void nw_log_set_role(const char *role);

/* "YYYY-MM-DDTHH:MM:SS.mmmZ" (24 bytes, no NUL) for a Unix time in
 * seconds and milliseconds, UTC; years after 9999 wrap. Async-signal-safe. */
#define NW_LOG_STAMP_LEN 24
size_t nw_log_stamp(char *out, long long secs, unsigned msec);

/* Writes "TIME narwhal[PID] ROLE LEVEL: " into buf (size at least
 * NW_LOG_PREFIX_MAX) and returns its length. Async-signal-safe: no stdio,
 * no locale, no malloc (the time is converted by hand). */
size_t nw_log_prefix(char *buf, size_t size, const char *level);

/* One line (or several, each with its own prefix, when the message has
 * newlines) to fd 2 in a single write(2), so that lines from several
 * processes appending to one file never interleave. Longer messages are
 * cut at NW_LOG_LINE_MAX. level: "error", "warn" or "info". */
#define NW_LOG_LINE_MAX 4096
void nw_log(const char *level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The lines of msg (len bytes; newlines split it, trailing ones are
 * dropped), each with the prefix and a newline, into out (cap bytes, cut
 * there); returns the length. The one formatter: nw_log, nw_log_write
 * and the Perl side's Narwhal::log_format all come here. A buffer of
 * len + (newlines + 1) * (NW_LOG_PREFIX_MAX + 1) bytes is never cut. */
size_t nw_log_format(char *out, size_t cap, const char *level, const char *msg, size_t len);

/* One kind of failure that can repeat in a loop (a full disk, the
 * open-file limit): its first line is written at once, the next ones in
 * the following NW_LOG_LIMIT_MS are counted, and the count is written
 * ("N more like it in the last 10 s") with the next line after that, or
 * by nw_log_limited_flush once the interval is over. Zeroed: ready. */
#define NW_LOG_LIMIT_MS 10000
typedef struct {
    long long until_ms;     /* lines are counted, not written, until then */
    unsigned long more;     /* counted so far */
    const char *level;      /* (set by nw_log_limited: for nw_log_limited_flush_all) */
    int listed;             /* (in the process's list of limiters) */
    char said[80];          /* the start of the last line written (for the summary) */
} nw_log_limit;

/* nw_log through l, at now_ms (a monotonic clock). Returns 1 when the line
 * was written, 0 when it was counted. l is kept in the process's list for
 * nw_log_limited_flush_all: it must live as long as the process (static,
 * or in a structure that does), or be taken out with
 * nw_log_limited_unlist before it goes. From one thread (a worker's
 * main thread; the manager). */
int nw_log_limited(nw_log_limit *l, long long now_ms, const char *level, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Write the count of l's lines not written, once its interval is over
 * (what: the kind, for the line). */
void nw_log_limited_flush(nw_log_limit *l, long long now_ms, const char *level, const char *what);

/* Every limiter of this process that nw_log_limited has used (the first
 * NW_LOG_LIMITERS of them): the count of its lines not written, now when
 * now_anyway (the process is about to exit: a stop must not lose it),
 * else once its interval is over. */
#define NW_LOG_LIMITERS 32
void nw_log_limited_flush_all(long long now_ms, int now_anyway);

/* Take l out of that list (a limiter in a structure that goes away). */
void nw_log_limited_unlist(nw_log_limit *l);

/* Writes an already formatted message (may hold newlines) with the
 * prefix to fd; returns what write returned. */
long nw_log_write(int fd, const char *level, const char *msg, size_t len);

#endif
