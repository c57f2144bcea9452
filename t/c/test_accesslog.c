/* Unit tests for src/worker/nw_accesslog.c's escaping, printing TAP: the JSON
 * format keeps valid UTF-8 as it is and escapes only invalid bytes and
 * control characters; the combined format escapes every byte outside
 * printable ASCII; the forwarded client address is the last address of
 * X-Forwarded-For. */
#define _GNU_SOURCE
#include "nw_accesslog.h"
#include "tap.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char path[] = "/tmp/nw-test-accesslog-XXXXXX";

/* The line the log writes for a request whose User-Agent is agent. */
static char *line_for(int format, const char *agent, size_t len)
{
    static char buf[16384];
    if (truncate(path, 0) != 0)
        return NULL;
    nw_access_log *log = nw_access_log_open(path, format);
    nw_access_entry e;
    memset(&e, 0, sizeof e);
    e.remote_addr = (nw_str){ "127.0.0.1", 9 };
    e.method = (nw_str){ "GET", 3 };
    e.target = (nw_str){ "/", 1 };
    e.minor_version = 1;
    e.status = 200;
    e.user_agent = (nw_str){ agent, len };
    nw_access_log_record(log, &e, 1);
    nw_access_log_close(log);
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f)
        fclose(f);
    buf[n] = 0;
    return buf;
}

/* The JSON user_agent field's contents as written. */
static const char *json_agent(const char *agent, size_t len)
{
    static char field[4096];
    char *l = line_for(NW_ACCESS_JSON, agent, len);
    char *p = l ? strstr(l, "\"user_agent\":\"") : NULL;
    if (!p)
        return "(none)";
    p += strlen("\"user_agent\":\"");
    char *end = strstr(p, "\"}");
    size_t n = end ? (size_t)(end - p) : 0;
    memcpy(field, p, n);
    field[n] = 0;
    return field;
}

#define JSON_IS(in, want, name) do {                                         \
    const char *got_ = json_agent((in), sizeof(in) - 1);                     \
    if (!ok(!strcmp(got_, (want)), (name)))                                  \
        diag("got '%s', want '%s'", got_, (want));                           \
} while (0)

int main(void)
{
    int fd = mkstemp(path);
    if (fd < 0)
        return 1;
    close(fd);

    JSON_IS("caf\xc3\xa9", "caf\xc3\xa9", "valid UTF-8 stays UTF-8 (cafe with an acute e)");
    JSON_IS("\xe2\x82\xac \xf0\x9f\x90\xb3", "\xe2\x82\xac \xf0\x9f\x90\xb3", "three- and four-byte sequences");
    JSON_IS("a\xff" "b", "a\\u00ffb", "an invalid byte is escaped");
    JSON_IS("\xc3", "\\u00c3", "a sequence cut short at the end");
    JSON_IS("\xc3" "A", "\\u00c3A", "a lead byte without its continuation");
    JSON_IS("\xc0\xaf", "\\u00c0\\u00af", "an overlong form is not UTF-8");
    JSON_IS("\xed\xa0\x80", "\\u00ed\\u00a0\\u0080", "a surrogate is not UTF-8");
    JSON_IS("\xf4\x90\x80\x80", "\\u00f4\\u0090\\u0080\\u0080", "above U+10FFFF is not UTF-8");
    JSON_IS("\x80", "\\u0080", "a stray continuation byte");
    JSON_IS("a\x01\x1f\x7f" "b", "a\\u0001\\u001f\\u007fb", "control characters are escaped");
    JSON_IS("\xc2\x85x", "\\u0085x", "a C1 control character is escaped as its code point");
    JSON_IS("\xc2\xa0", "\xc2\xa0", "U+00A0 is no control: kept");
    JSON_IS("q\"b\\s", "q\\\"b\\\\s", "quote and backslash escaped");

    /* a long value is cut between sequences, never inside one */
    char longv[3 * NW_ACCESS_LOG_FIELD];
    for (size_t i = 0; i + 1 < sizeof longv; i += 2) {
        longv[i] = (char)0xc3;
        longv[i + 1] = (char)0xa9;
    }
    const char *cut = json_agent(longv, sizeof longv);
    size_t n = strlen(cut);
    ok(n > 0 && n <= NW_ACCESS_LOG_FIELD && n % 2 == 0, "a long field is cut at a sequence boundary");

    char *l = line_for(NW_ACCESS_COMBINED, "caf\xc3\xa9", 5);
    ok(l && strstr(l, "\"caf\\xc3\\xa9\""), "combined escapes bytes outside ASCII as \\xHH");

    char buf[64];
    nw_str f = nw_access_forwarded_for((nw_str){ "198.51.100.1, 203.0.113.9", 25 }, buf, sizeof buf);
    is_str(f.p, f.len, "203.0.113.9", "X-Forwarded-For: the last address");
    f = nw_access_forwarded_for((nw_str){ " 2001:db8::1 ", 13 }, buf, sizeof buf);
    is_str(f.p, f.len, "2001:db8::1", "an IPv6 address, spaces around");
    f = nw_access_forwarded_for((nw_str){ "10.0.0.1, evil\"", 15 }, buf, sizeof buf);
    ok(f.p == NULL, "a last entry that is no address: none");
    f = nw_access_forwarded_for((nw_str){ "10.0.0.1,", 9 }, buf, sizeof buf);
    ok(f.p == NULL, "an empty last entry: none");
    f = nw_access_forwarded_for((nw_str){ NULL, 0 }, buf, sizeof buf);
    ok(f.p == NULL, "no header: none");
    unlink(path);
    return done_testing();
}
