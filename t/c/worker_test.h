/* What the worker's C unit tests (test_worker.c, test_worker_signals.c)
 * share: one loopback listener whose clients their workers accept, and
 * the connection configuration they run with: the server's default
 * limits, 5 s timeouts, and custody on (as the server runs it: parked
 * connections' copies go to the "manager", the test's end of the
 * handoff queue). Single translation unit only (state is static). */
#ifndef NW_TEST_WORKER_TEST_H
#define NW_TEST_WORKER_TEST_H

#include <string.h>

#include "loopback.h"
#include "nw_conn.h"
#include "nw_limits.h"

static int g_listener = -1;
static struct sockaddr_in g_addr;

static void die(const char *what)
{
    loopback_die(what);
}

static void listen_once(void)
{
    g_listener = loopback_listener(&g_addr);
}

static int client(void)
{
    return loopback_client(&g_addr);
}

static inline nw_conn_config test_worker_config(void)
{
    nw_conn_config c;
    memset(&c, 0, sizeof c);
    c.parse.max_request_line = NW_DEFAULT_MAX_REQUEST_LINE;
    c.parse.max_header_bytes = NW_DEFAULT_MAX_HEADER_BYTES;
    c.parse.max_headers = NW_DEFAULT_MAX_HEADERS;
    c.body_in_memory = NW_DEFAULT_BODY_IN_MEMORY;
    c.timeout = 5;
    c.read_timeout = 5;
    c.keepalive_timeout = 5;
    c.custody = 1;
    return c;
}

#endif
