/* Whether a worker's requests block (src/worker/nw_block_meter.c): made-up
 * requests through nw_block_meter_note, then real ones measured from the
 * kernel's schedstat: a sleep blocks, a busy loop does not. */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "tap.h"
#include "nw_block_meter.h"
#include "nw_limits.h"

/* n requests of wall_us each, awake_us of it on a CPU, ending at *now. */
static void requests(nw_block_meter *m, int n, uint64_t wall_us, uint64_t awake_us, nw_msec *now)
{
    for (int i = 0; i < n; i++) {
        *now += (nw_msec)(wall_us / 1000) + 1;
        nw_block_meter_note(m, wall_us, awake_us, 0, *now);
    }
}

static void test_made_up(void)
{
    nw_block_meter m;
    nw_msec now = 1000;
    nw_block_meter_init(&m);
    ok(!nw_block_meter_blocking(&m, now), "a new meter: not blocking");
    requests(&m, 20, 100, 5, &now);
    ok(!nw_block_meter_blocking(&m, now), "requests under 0.5 ms, asleep: too short to say");
    requests(&m, 20, 5000, 4900, &now);
    ok(!nw_block_meter_blocking(&m, now), "5 ms requests on a CPU: not blocking");
    requests(&m, 1, 5000, 50, &now);
    ok(!nw_block_meter_blocking(&m, now), "one 5 ms request asleep: not yet");
    requests(&m, 3, 5000, 50, &now);
    ok(nw_block_meter_blocking(&m, now), "four of them: blocking");
    requests(&m, 1, 5000, 4900, &now);
    ok(nw_block_meter_blocking(&m, now), "one on a CPU among them: still blocking (hysteresis)");
    requests(&m, 8, 5000, 4900, &now);
    ok(!nw_block_meter_blocking(&m, now), "eight on a CPU: not blocking any more");
    requests(&m, 6, 20000, 100, &now);
    ok(nw_block_meter_blocking(&m, now), "20 ms waits: blocking again");
    ok(nw_block_meter_blocking(&m, now + NW_BLOCK_HOLD_MS - 1), "... until a second after the last");
    ok(!nw_block_meter_blocking(&m, now + NW_BLOCK_HOLD_MS), "... then not");
    nw_block_meter_note(&m, 5000, 100, 4800, now);
    nw_block_meter_note(&m, 5000, 100, 4800, now);
    nw_block_meter_note(&m, 5000, 100, 4800, now);
    nw_block_meter_note(&m, 5000, 100, 4800, now);
    ok(!nw_block_meter_blocking(&m, now), "waiting for a CPU (runnable) is not blocking");
    nw_block_meter_close(&m);
}

static uint64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000;
}

/* n real requests: asleep (usleep) or on a CPU (a busy loop), 2 ms each. */
static void real_requests(nw_block_meter *m, int n, int asleep)
{
    for (int i = 0; i < n; i++) {
        nw_block_meter_start(m);
        uint64_t t0 = now_us();
        if (asleep)
            usleep(2000);
        else
            while (now_us() - t0 < 2000)
                ;
        uint64_t t1 = now_us();
        nw_block_meter_end(m, t1 - t0, (nw_msec)(t1 / 1000));
    }
}

static void test_real(void)
{
    nw_block_meter m;
    nw_block_meter_init(&m);
    real_requests(&m, 8, 1);
    ok(nw_block_meter_blocking(&m, (nw_msec)(now_us() / 1000)), "real 2 ms sleeps: blocking");
    is((long long)m.measured, 7, "... the first was not measured (nothing armed it), the rest were");
    ok(m.fd >= 0 || m.fd == -2, "... schedstat opened, or the CPU clock used");
    real_requests(&m, 12, 0);
    ok(!nw_block_meter_blocking(&m, (nw_msec)(now_us() / 1000)), "real 2 ms busy loops: not blocking");
    nw_block_meter m2;
    nw_block_meter_init(&m2);
    for (int i = 0; i < 100; i++) {
        nw_block_meter_start(&m2);
        nw_block_meter_end(&m2, 10, (nw_msec)(now_us() / 1000));
    }
    is((long long)m2.measured, 0, "requests of 10 us are never measured");
    is(m2.fd, -1, "... nor is schedstat opened for them");
    nw_msec t = (nw_msec)(now_us() / 1000);
    nw_block_meter_measure_until(&m2, t + 1000);
    for (int i = 0; i < 10; i++) {
        nw_block_meter_start(&m2);
        nw_block_meter_end(&m2, 10, t);
    }
    is((long long)m2.measured, 10, "... unless asked to, until a time: all ten then");
    nw_block_meter_start(&m2);
    nw_block_meter_end(&m2, 10, t + 1000);
    nw_block_meter_start(&m2);
    nw_block_meter_end(&m2, 10, t + 1000);
    is((long long)m2.measured, 11, "... and no more after it");
    nw_block_meter_close(&m);
    nw_block_meter_close(&m2);
}

/* A request slow for want of a CPU: pinned to one CPU with 20 busy
 * processes, 10 ms on a CPU (more than a time slice) take several times that. The meter reports that wait
 * (parking does not count it as slow: DESIGN.md, "Parking"), and it is
 * not blocking. */
static void test_cpu_starved(void)
{
    cpu_set_t was, one;
    if (sched_getaffinity(0, sizeof was, &was) < 0) {
        diag("skipped a CPU-starved request: sched_getaffinity: %s", strerror(errno));
        return;
    }
    int cpu = 0;
    while (cpu < CPU_SETSIZE && !CPU_ISSET(cpu, &was))
        cpu++;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    if (sched_setaffinity(0, sizeof one, &one) < 0) {
        diag("skipped a CPU-starved request: sched_setaffinity: %s", strerror(errno));
        return;
    }
    pid_t spinners[20], parent = getpid();
    int n = 0;
    for (; n < 20; n++) {
        if ((spinners[n] = fork()) < 0)
            break;
        if (!spinners[n]) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);   /* (never outlive the test) */
            if (getppid() != parent)
                _exit(0);
            for (;;)
                ;       /* (the parent's affinity: the same CPU) */
        }
    }
    nw_block_meter m;
    nw_block_meter_init(&m);
    m.armed = 1;
    nw_block_meter_start(&m);
    uint64_t t0 = now_us();
    struct timespec cpu0, cpu1;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu0);
    do
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu1);
    while ((cpu1.tv_sec - cpu0.tv_sec) * 1000000000L + (cpu1.tv_nsec - cpu0.tv_nsec) < 10000000L);
    uint64_t wall = now_us() - t0;
    nw_block_meter_end(&m, wall, (nw_msec)(now_us() / 1000));
    for (int i = 0; i < n; i++) {
        kill(spinners[i], SIGKILL);
        waitpid(spinners[i], NULL, 0);
    }
    sched_setaffinity(0, sizeof was, &was);
    if (n < 20) {
        diag("skipped a CPU-starved request: fork: %s", strerror(errno));
        nw_block_meter_close(&m);
        return;
    }
    if (m.fd < 0) {
        diag("skipped a CPU-starved request: no /proc/thread-self/schedstat");
        nw_block_meter_close(&m);
        return;
    }
    char name[120];
    snprintf(name, sizeof name, "10 ms on a CPU shared with %d busy processes took %llu us", n,
             (unsigned long long)wall);
    ok(wall >= 20000, name);    /* (shared with 20: about 200 ms; at least twice its own) */
    snprintf(name, sizeof name, "... of which %llu us waiting for the CPU",
             (unsigned long long)nw_block_meter_cpu_wait_us(&m));
    ok(nw_block_meter_cpu_wait_us(&m) >= (wall - 10000) / 2, name);
    ok(!nw_block_meter_blocking(&m, (nw_msec)(now_us() / 1000)), "... which is not blocking");
    nw_block_meter_close(&m);
}

int main(void)
{
    test_made_up();
    test_real();
    test_cpu_starved();
    return done_testing();
}
