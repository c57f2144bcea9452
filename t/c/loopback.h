/* Loopback sockets for the C unit tests: a listener on an ephemeral port
 * of 127.0.0.1, clients of it, and writes that must go whole. A failure
 * ends the test binary (status 2): the test could not be set up. */
#ifndef NW_TEST_LOOPBACK_H
#define NW_TEST_LOOPBACK_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static inline void loopback_die(const char *what)
{
    perror(what);
    exit(2);
}

/* A listener (backlog 64); its address in *addr. */
static inline int loopback_listener(struct sockaddr_in *addr)
{
    int l = socket(AF_INET, SOCK_STREAM, 0);
    memset(addr, 0, sizeof *addr);
    addr->sin_family = AF_INET;
    addr->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof *addr;
    if (l < 0 || bind(l, (struct sockaddr *)addr, sizeof *addr) < 0 || listen(l, 64) < 0
        || getsockname(l, (struct sockaddr *)addr, &len) < 0)
        loopback_die("listener");
    return l;
}

static inline int loopback_client(const struct sockaddr_in *addr)
{
    int s = socket(AF_INET, SOCK_STREAM, 0);
    if (s < 0 || connect(s, (const struct sockaddr *)addr, sizeof *addr) < 0)
        loopback_die("connect");
    return s;
}

static inline void loopback_say(int s, const char *bytes)
{
    if (write(s, bytes, strlen(bytes)) != (ssize_t)strlen(bytes))
        loopback_die("write");
}

#endif
