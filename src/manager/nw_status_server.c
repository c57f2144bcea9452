/* The status server (see nw_status_server.h): the --status-listen
 * listener's clients, in the manager's epoll set. The pages themselves are
 * nw_status.c's. A client is tried rather than trusted (recv and send with
 * MSG_DONTWAIT), as the manager does its own. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "nw_status_server.h"
#include "nw_http.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define NW_STATUS_HEAD_MAX      4096    /* a status request's head */
#define NW_STATUS_DEADLINE_MS   5000    /* to send the head and read the answer */

/* The listener in the epoll set, or out of it while every place is taken:
 * a client waiting in its listen queue would make it read ready on every
 * wake, and the manager would spin until a place came free. */
static void watch_listener(nw_status_server *s, int on)
{
    if (s->fd < 0 || on == s->listening)
        return;
    struct epoll_event ev = { .events = EPOLLIN, .data.fd = s->fd };
    if (epoll_ctl(s->ep, on ? EPOLL_CTL_ADD : EPOLL_CTL_DEL, s->fd, &ev) == 0)
        s->listening = on;
}

static void client_close(nw_status_server *s, nw_status_client *c)
{
    epoll_ctl(s->ep, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    nw_buf_free(&c->in);
    nw_buf_free(&c->out);
    memset(c, 0, sizeof *c);
    c->fd = -1;
    s->active--;
    watch_listener(s, 1);
}

static void accept_clients(nw_status_server *s, nw_msec now)
{
    for (int tries = 0; tries < NW_STATUS_CLIENTS; tries++) {
        int i = 0;
        while (i < NW_STATUS_CLIENTS && s->client[i].fd >= 0)
            i++;
        if (i == NW_STATUS_CLIENTS) {
            watch_listener(s, 0);   /* the rest wait in the listen queue */
            return;
        }
        int fd = accept4(s->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0)
            return;
        struct epoll_event ev = { .events = EPOLLIN, .data.fd = fd };
        if (epoll_ctl(s->ep, EPOLL_CTL_ADD, fd, &ev) < 0) {
            close(fd);
            return;
        }
        nw_status_client *c = &s->client[i];
        c->fd = fd;
        c->deadline = now + NW_STATUS_DEADLINE_MS;
        s->active++;
    }
}

static const nw_scoreboard *board_of(const nw_status_server *s)
{
    static const nw_scoreboard empty;   /* no slots, no counts */
    return s->board ? s->board : &empty;
}

static void answer(nw_status_server *s, nw_status_client *c)
{
    int head_only;
    int page = nw_status_route(c->in.data, c->in.len, &head_only);
    nw_status_manager sm;
    memset(&sm, 0, sizeof sm);
    if (s->numbers)
        s->numbers(s->numbers_arg, &sm);
    if (!s->rates)
        s->rates = calloc(1, sizeof *s->rates);     /* none: rates since the start */
    if (nw_status_respond(&c->out, page, head_only, board_of(s), &sm, s->rates,
                          nw_now_us(), (int64_t)time(NULL)) < 0) {
        client_close(s, c);
        return;
    }
    c->answering = 1;
    struct epoll_event ev = { .events = EPOLLOUT, .data.fd = c->fd };
    epoll_ctl(s->ep, EPOLL_CTL_MOD, c->fd, &ev);
}

static void read_request(nw_status_server *s, nw_status_client *c)
{
    char buf[NW_STATUS_HEAD_MAX];
    ssize_t n = recv(c->fd, buf, NW_STATUS_HEAD_MAX - c->in.len, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return;
    if (n <= 0 || nw_buf_append(&c->in, buf, (size_t)n) < 0) {
        client_close(s, c);
        return;
    }
    nw_head_scan scan = { 0, 0 };
    if (nw_http_head_end(c->in.data, c->in.len, &scan) || c->in.len >= NW_STATUS_HEAD_MAX)
        answer(s, c);
}

static void write_answer(nw_status_server *s, nw_status_client *c)
{
    ssize_t n = send(c->fd, c->out.data + c->sent, c->out.len - c->sent,
                     MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return;
    if (n > 0)
        c->sent += (size_t)n;
    if (n <= 0 || c->sent == c->out.len) {
        shutdown(c->fd, SHUT_WR);
        client_close(s, c);
    }
}

int nw_status_server_event(nw_status_server *s, int fd, nw_msec now)
{
    if (fd == s->fd) {
        accept_clients(s, now);
        return 1;
    }
    for (int i = 0; s->active && i < NW_STATUS_CLIENTS; i++) {
        nw_status_client *c = &s->client[i];
        if (c->fd != fd)
            continue;
        if (c->answering)
            write_answer(s, c);
        else
            read_request(s, c);
        return 1;
    }
    return 0;
}

void nw_status_server_expire(nw_status_server *s, nw_msec now)
{
    for (int i = 0; s->active && i < NW_STATUS_CLIENTS; i++)
        if (s->client[i].fd >= 0 && s->client[i].deadline <= now)
            client_close(s, &s->client[i]);
}

void nw_status_server_init(nw_status_server *s, int listen_fd)
{
    memset(s, 0, sizeof *s);
    s->fd = listen_fd;
    s->ep = -1;
    for (int i = 0; i < NW_STATUS_CLIENTS; i++)
        s->client[i].fd = -1;
}

int nw_status_server_start(nw_status_server *s, int ep, const nw_scoreboard *board,
                           nw_status_numbers_fn *numbers, void *numbers_arg)
{
    s->ep = ep;
    s->board = board;
    s->numbers = numbers;
    s->numbers_arg = numbers_arg;
    if (s->fd < 0)
        return 0;
    nw_io_set_nonblocking(s->fd);
    watch_listener(s, 1);
    return s->listening ? 0 : -1;
}

void nw_status_server_close(nw_status_server *s)
{
    for (int i = 0; i < NW_STATUS_CLIENTS; i++)
        if (s->client[i].fd >= 0)
            client_close(s, &s->client[i]);
    if (s->fd >= 0)
        close(s->fd);
    s->fd = -1;
    free(s->rates);
    s->rates = NULL;
}
