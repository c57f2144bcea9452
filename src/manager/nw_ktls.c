/* See nw_ktls.h. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "nw_ktls.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#ifndef TCP_ULP
#define TCP_ULP 31      /* linux/tcp.h: older libc headers lack it */
#endif

/* A connected loopback pair: *client and *server, or -1 with errno. */
static int loopback_pair(int *client, int *server)
{
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t alen = sizeof a;
    int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    *client = *server = -1;
    if (l < 0)
        return -1;
    int r = -1;
    if (bind(l, (struct sockaddr *)&a, sizeof a) == 0 && listen(l, 1) == 0
        && getsockname(l, (struct sockaddr *)&a, &alen) == 0
        && (*client = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) >= 0
        && connect(*client, (struct sockaddr *)&a, sizeof a) == 0
        && (*server = accept4(l, NULL, NULL, SOCK_CLOEXEC)) >= 0)
        r = 0;
    int saved = errno;
    close(l);
    errno = saved;
    return r;
}

int nw_ktls_offered(char *why, size_t len)
{
    int client, server, offered = 0;
    if (loopback_pair(&client, &server) < 0) {
        snprintf(why, len, "kTLS unknown: no loopback connection to ask on: %s", strerror(errno));
    } else if (setsockopt(server, IPPROTO_TCP, TCP_ULP, "tls", sizeof "tls") == 0) {
        offered = 1;
        snprintf(why, len, "kTLS offered by the kernel, not used yet");
    } else if (errno == ENOENT) {
        snprintf(why, len, "no kTLS in this kernel: no tls module");
    } else {
        snprintf(why, len, "kTLS refused by the kernel: %s", strerror(errno));
    }
    if (client >= 0)
        close(client);
    if (server >= 0)
        close(server);
    return offered;
}
