/* The worker's deadline list (src/worker/nw_deadlines.c): kinds registered,
 * replaced and cleared, the nearest of them, and the wait it allows. */
#include "tap.h"
#include "nw_deadlines.h"

static void test_nearest(void)
{
    nw_deadlines d;
    nw_deadlines_init(&d);
    is(nw_deadlines_nearest(&d), 0, "none registered: no nearest");
    nw_deadlines_set(&d, NW_DEADLINE_CUSTODY, 500);
    nw_deadlines_set(&d, NW_DEADLINE_PARKED, 300);
    nw_deadlines_set(&d, NW_DEADLINE_ADOPT_ASIDE, 400);
    is(nw_deadlines_nearest(&d), 300, "the nearest of three");
    nw_deadlines_set(&d, NW_DEADLINE_PARKED, 0);
    is(nw_deadlines_nearest(&d), 400, "one cleared: the next");
    nw_deadlines_set(&d, NW_DEADLINE_CUSTODY, 100);
    is(nw_deadlines_nearest(&d), 100, "one moved earlier: it");
    nw_deadlines_set(&d, NW_DEADLINE_CUSTODY, 0);
    nw_deadlines_set(&d, NW_DEADLINE_ADOPT_ASIDE, 0);
    is(nw_deadlines_nearest(&d), 0, "all cleared: none");
}

static void test_passed(void)
{
    nw_deadlines d;
    nw_deadlines_init(&d);
    ok(!nw_deadlines_passed(&d, NW_DEADLINE_CUSTODY, 1000), "none registered: not passed");
    nw_deadlines_set(&d, NW_DEADLINE_CUSTODY, 200);
    ok(!nw_deadlines_passed(&d, NW_DEADLINE_CUSTODY, 199), "before it: not passed");
    ok(nw_deadlines_passed(&d, NW_DEADLINE_CUSTODY, 200), "at it: passed");
    ok(!nw_deadlines_passed(&d, NW_DEADLINE_PARKED, 1000), "another kind: not passed");
}

static void test_wait(void)
{
    nw_deadlines d;
    nw_deadlines_init(&d);
    is(nw_deadlines_wait_ms(&d, 100, 1100), 1000, "none registered: until the end");
    nw_deadlines_set(&d, NW_DEADLINE_PARKED, 150);
    is(nw_deadlines_wait_ms(&d, 100, 1100), 50, "a deadline first: until it");
    is(nw_deadlines_wait_ms(&d, 100, 120), 20, "the end first: until it");
    is(nw_deadlines_wait_ms(&d, 200, 1100), 0, "a deadline passed: no wait");
    is(nw_deadlines_wait_ms(&d, 100, 100), 0, "the end reached: no wait");
}

int main(void)
{
    test_nearest();
    test_passed();
    test_wait();
    return done_testing();
}
