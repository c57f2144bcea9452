/* See nw_mgr_clock.h. */
#include "nw_mgr_clock.h"
#include "nw_log.h"

#include <errno.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

static nw_msec read_clock(const nw_mgr_clock *c)
{
    return c->test_fd >= 0 ? c->test_now : nw_now_ms();
}

void nw_mgr_clock_init(nw_mgr_clock *c, int test_fd)
{
    memset(c, 0, sizeof *c);
    c->test_fd = test_fd > 2 ? test_fd : -1;
    c->test_now = nw_now_ms();
    c->now = read_clock(c);
}

void nw_mgr_clock_tick(nw_mgr_clock *c)
{
    c->now = read_clock(c);
}

void nw_mgr_clock_advance(nw_mgr_clock *c, int ep)
{
    int64_t ms;
    ssize_t n = read(c->test_fd, &ms, sizeof ms);
    if (n == (ssize_t)sizeof ms && ms >= 0) {
        c->test_step += (nw_msec)ms;
        c->test_ack = 1;
    } else if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
        epoll_ctl(ep, EPOLL_CTL_DEL, c->test_fd, NULL);
    }
}

void nw_mgr_clock_step(nw_mgr_clock *c)
{
    if (!c->test_ack)
        return;
    c->test_now += c->test_step;
    c->test_step = 0;
    c->now = read_clock(c);
}

void nw_mgr_clock_answer(nw_mgr_clock *c)
{
    if (!c->test_ack)
        return;
    c->test_ack = 0;
    int64_t now = (int64_t)c->now;
    if (write(c->test_fd, &now, sizeof now) != (ssize_t)sizeof now)
        nw_log("error", "test clock: %s", strerror(errno));
}
