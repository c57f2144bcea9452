/* The access log: one line per request, formatted in C by the worker after
 * the response, into a buffer written with one write() when it is full or
 * a second old (and when the worker goes idle or leaves). See "The access
 * log" in docs/DESIGN.md for the line layouts and the rules. */
#ifndef NW_ACCESSLOG_H
#define NW_ACCESSLOG_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>
#include "nw_io.h"

#define NW_ACCESS_LOG_BUFFER   65536   /* bytes held before a write */
#define NW_ACCESS_LOG_FLUSH_MS 1000    /* a line waits at most this long while requests come */
#define NW_ACCESS_LOG_FIELD    2048    /* bytes a field (target, referer, agent...) takes at most,
                                        * escaped; a longer one is cut there */
#define NW_ACCESS_LOG_LINE     (6 * NW_ACCESS_LOG_FIELD + 512) /* longest line (six such fields) */

enum nw_access_format { NW_ACCESS_COMBINED = 0, NW_ACCESS_JSON = 1 };

typedef struct {
    const char *p;
    size_t len;         /* p NULL: absent */
} nw_str;

/* What one line says. */
typedef struct {
    nw_str   remote_addr, method, target, referer, user_agent, request_id;
    int      minor_version;     /* HTTP/1.<minor>; -1: no request line was parsed */
    int      status;
    uint64_t bytes;             /* response body bytes sent */
    uint64_t duration_us;
    int      pid;
} nw_access_entry;

typedef struct nw_access_log nw_access_log;

/* Open path for appending ("-": standard error). NULL with errno. */
nw_access_log *nw_access_log_open(const char *path, int format);

/* Format e into the buffer (now_ms: the monotonic clock, for the flush
 * rule; the wall clock is read here, once a second at most formatted). */
void nw_access_log_record(nw_access_log *log, const nw_access_entry *e, nw_msec now_ms);

/* Write what is buffered. 0, or -1 when a write failed (the lines are
 * dropped and counted: a log must never stop the worker). */
int nw_access_log_flush(nw_access_log *log);

/* The worker is idle: flush if anything waits. */
void nw_access_log_tick(nw_access_log *log, nw_msec now_ms);

/* USR1: flush, then open the path anew. -1 with errno (the old file is kept). */
int nw_access_log_reopen(nw_access_log *log);

/* Lines dropped because a write failed. */
uint64_t nw_access_log_lost(const nw_access_log *log);

/* Flush and close. */
void nw_access_log_close(nw_access_log *log);

/* The length of the valid UTF-8 sequence at p (left bytes there): 1 to 4,
 * or 0 when it is not one (a stray continuation byte, an overlong form, a
 * surrogate, above U+10FFFF, cut short). */
size_t nw_utf8_seq_len(const unsigned char *p, size_t left);

/* --access-log-client forwarded: the last address of an X-Forwarded-For
 * value (the one the trusted proxy in front added), copied into buf (size
 * bytes, NUL-terminated); absent (p NULL) when there is none or it is not
 * an IPv4 or IPv6 address. */
nw_str nw_access_forwarded_for(nw_str xff, char *buf, size_t size);

#endif
