/* The connection manager's clock: every deadline, expiry and count
 * interval reads it. Monotonic milliseconds, read once per wake of the
 * loop; for a test that gives the manager a clock of its own
 * (NARWHAL_TEST_MANAGER_CLOCK_FD, DESIGN.md), the time on that clock,
 * which stands still but for the test's advances. */
#ifndef NW_MGR_CLOCK_H
#define NW_MGR_CLOCK_H

#include "nw_io.h"

typedef struct {
    nw_msec now;        /* the time of this wake */
    int     test_fd;    /* tests only: the clock's SOCK_SEQPACKET socket, or -1 */
    nw_msec test_now;   /* ...the time on it */
    nw_msec test_step;  /* ...an advance to take after this wake's other events */
    int     test_ack;   /* ...an advance to answer once this wake's expiries are done */
} nw_mgr_clock;

/* test_fd: a test clock's socket (> 2), or anything else for the real one. */
void nw_mgr_clock_init(nw_mgr_clock *c, int test_fd);

static inline nw_msec nw_mgr_now(const nw_mgr_clock *c)
{
    return c->now;
}

/* Read the clock for a new wake. */
void nw_mgr_clock_tick(nw_mgr_clock *c);

/* Whether time passes only with a test's advances (an epoll event). */
static inline int nw_mgr_clock_stands(const nw_mgr_clock *c)
{
    return c->test_fd >= 0;
}

/* Tests only: the test clock's socket, or -1. */
static inline int nw_mgr_clock_fd(const nw_mgr_clock *c)
{
    return c->test_fd;
}

/* Tests only: an advance of the test clock (an int64_t of milliseconds,
 * one SOCK_SEQPACKET message) came on test_fd. It is taken once the rest
 * of this wake's events are (nw_mgr_clock_step): whatever the test sent
 * before it is read at the time before, in whichever order epoll lists
 * them. End of stream: no more advances (taken out of epoll ep). */
void nw_mgr_clock_advance(nw_mgr_clock *c, int ep);
/* Take this wake's advance, if one came. */
void nw_mgr_clock_step(nw_mgr_clock *c);
/* Answer the advance with the new time, once what is due by then is
 * expired, so that the test knows what the manager did at that time. */
void nw_mgr_clock_answer(nw_mgr_clock *c);

#endif
