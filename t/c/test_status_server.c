/* Unit tests of the status server (src/manager/nw_status_server.c): a real TCP
 * listener on 127.0.0.1 and a real epoll set, driven as the manager's loop
 * drives it. A page is answered once its head is in (whole or in pieces),
 * with the manager's numbers asked for at render time and a board of real
 * slots; a client that sends nothing is closed at its deadline; no more
 * than NW_STATUS_CLIENTS are served at once, the rest wait in the listen
 * queue; an event that is not the server's is left alone; closing closes
 * everything. Run by t/13-status-unit.t (under ASan and UBSan). */
#define _GNU_SOURCE
#include "loopback.h"
#include "tap.h"
#include "nw_scoreboard.h"
#include "nw_status_server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define WAIT_MS 2000

static struct sockaddr_in g_addr;
static int g_numbers_asked;

static void die(const char *what)
{
    perror(what);
    exit(2);
}

/* The manager's part: a number to find on the page. */
static void numbers(void *arg, nw_status_manager *sm)
{
    g_numbers_asked++;
    sm->held_idle = *(const uint64_t *)arg;
}

static int listener(void)
{
    return loopback_listener(&g_addr);
}

static int client(void)
{
    return loopback_client(&g_addr);
}

static void say(int s, const char *bytes)
{
    loopback_say(s, bytes);
}

/* One round of the manager's loop: the events of up to wait_ms, each to
 * the server. Returns how many it took, or -1 when one was not its own. */
static int loop_once(nw_status_server *s, int ep, int wait_ms)
{
    struct epoll_event ev[32];
    int n = epoll_wait(ep, ev, 32, wait_ms), took = 0;
    for (int i = 0; i < n; i++) {
        if (!nw_status_server_event(s, ev[i].data.fd, nw_now_ms()))
            return -1;
        took++;
    }
    return took;
}

/* Run the loop until the client c reads end-of-stream (or WAIT_MS); what
 * it read, NUL-terminated, in buf. */
static size_t answer(nw_status_server *s, int ep, int c, char *buf, size_t cap)
{
    size_t len = 0;
    nw_msec until = nw_now_ms() + WAIT_MS;
    fcntl(c, F_SETFL, O_NONBLOCK);
    while (nw_now_ms() < until) {
        loop_once(s, ep, 10);
        ssize_t r = read(c, buf + len, cap - 1 - len);
        if (r == 0)
            break;
        if (r > 0)
            len += (size_t)r;
        else if (errno != EAGAIN)
            break;
    }
    buf[len] = 0;
    return len;
}

/* Run the loop for 100 ms. */
static void settle(nw_status_server *s, int ep)
{
    nw_msec until = nw_now_ms() + 100;
    while (nw_now_ms() < until)
        loop_once(s, ep, 10);
}

static void test_no_listener(void)
{
    nw_status_server s;
    int ep = epoll_create1(EPOLL_CLOEXEC);
    nw_status_server_init(&s, -1);
    is(nw_status_server_start(&s, ep, NULL, NULL, NULL), 0, "no listener: starts, serving nothing");
    is(nw_status_server_event(&s, 0, nw_now_ms()), 0, "an event on another fd is not its own");
    nw_status_server_expire(&s, nw_now_ms());
    nw_status_server_close(&s);
    nw_status_server_close(&s);
    ok(1, "closed twice");
    close(ep);
}

static void test_pages(void)
{
    int fd = -1;
    nw_scoreboard *b = nw_scoreboard_create(2, &fd);
    if (!b)
        die("scoreboard");
    nw_scoreboard_claim(&b->slot[0], 4242, 1, 0, nw_now_ms());
    b->slot[0].state = NW_WORKER_IDLE;
    b->h.ready = 1;
    uint64_t held = 7;
    int ep = epoll_create1(EPOLL_CLOEXEC), l = listener();
    nw_status_server s;
    nw_status_server_init(&s, l);
    is(nw_status_server_start(&s, ep, b, numbers, &held), 0, "starts on a listener");
    ok(fcntl(l, F_GETFL) & O_NONBLOCK, "the listener is made non-blocking");

    char buf[65536];
    int c = client();
    say(c, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
    answer(&s, ep, c, buf, sizeof buf);
    ok(strncmp(buf, "HTTP/1.1 200 ", 13) == 0, "GET /health: 200, then end-of-stream");
    is(s.active, 0, "the client is let go once answered");
    close(c);

    g_numbers_asked = 0;
    c = client();
    say(c, "GET /metrics HTTP/1.1\r\n");
    settle(&s, ep);
    is(g_numbers_asked, 0, "half a head: no answer yet");
    is(s.active, 1, "the client is held meanwhile");
    say(c, "Host: x\r\n\r\n");
    answer(&s, ep, c, buf, sizeof buf);
    is(g_numbers_asked, 1, "the head completed: the manager's numbers are asked for once");
    ok(strstr(buf, "narwhal_connections{state=\"idle\"} 7\n") != NULL,
       "and the page shows them");
    close(c);

    c = client();
    say(c, "GET /status.json HTTP/1.1\r\nHost: x\r\n\r\n");
    answer(&s, ep, c, buf, sizeof buf);
    ok(strncmp(buf, "HTTP/1.1 200 ", 13) == 0 && s.rates != NULL,
       "/status.json: answered, with the rates' samples kept for the next");
    ok(strstr(buf, "{\"pid\":4242,") != NULL, "and the board's worker is on it");
    close(c);

    nw_status_server_close(&s);
    ok(fcntl(l, F_GETFD) < 0 && errno == EBADF, "closing closes the listener");
    is(s.rates, NULL, "and frees the rates");
    close(ep);
    nw_scoreboard_unmap(b);
    close(fd);
}

static void test_deadlines_and_limit(void)
{
    int ep = epoll_create1(EPOLL_CLOEXEC), l = listener();
    nw_status_server s;
    nw_status_server_init(&s, l);
    nw_status_server_start(&s, ep, NULL, NULL, NULL);

    int c[NW_STATUS_CLIENTS + 1];
    for (int i = 0; i <= NW_STATUS_CLIENTS; i++)
        c[i] = client();
    settle(&s, ep);
    is(s.active, NW_STATUS_CLIENTS, "as many clients as there are places are taken");
    is(loop_once(&s, ep, 50), 0, "the one waiting in the listen queue does not wake the loop "
                                 "(the listener is out of epoll: no spin)");
    nw_msec now = nw_now_ms();
    nw_status_server_expire(&s, now);
    is(s.active, NW_STATUS_CLIENTS, "before their deadline they are kept");
    nw_status_server_expire(&s, now + 5001);
    is(s.active, 0, "a client that sent nothing is closed at its deadline (5 s)");
    char b;
    struct pollfd p = { .fd = c[0], .events = POLLIN };
    ok(poll(&p, 1, WAIT_MS) == 1 && read(c[0], &b, 1) == 0, "it sees end-of-stream");
    settle(&s, ep);
    is(s.active, 1, "the one that waited in the listen queue is taken next");
    int last = s.client[0].fd;
    is(nw_status_server_event(&s, last + 1000, nw_now_ms()), 0, "an fd not its own: 0");

    nw_status_server_close(&s);
    ok(fcntl(last, F_GETFD) < 0 && errno == EBADF, "closing closes the clients");
    for (int i = 0; i <= NW_STATUS_CLIENTS; i++)
        close(c[i]);
    close(ep);
}

int main(void)
{
    alarm(60);
    test_no_listener();
    test_pages();
    test_deadlines_and_limit();
    return done_testing();
}
