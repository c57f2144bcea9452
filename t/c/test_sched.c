/* The worker's time slice (src/nw_sched.c): asked for, reported back, and
 * its nice value kept. On a kernel that reports no slice (before Linux
 * 6.12's custom slices) only the calls' success is checked. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE     /* (sched_getcpu, CPU_SET) */
#endif
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include "tap.h"
#include "nw_sched.h"

static void test_slice(void)
{
    uint64_t before = nw_sched_slice();
    ok(nw_sched_set_slice(300000) == 0, "a slice of 0.3 ms is asked for");
    if (!before) {
        diag("this kernel reports no slice: only the call is checked");
        return;
    }
    is((long long)nw_sched_slice(), 300000, "... and reported back");
    pid_t pid = fork();
    if (pid == 0)
        _exit(nw_sched_slice() == 300000 ? 0 : 1);
    int status = -1;
    waitpid(pid, &status, 0);
    ok(WIFEXITED(status) && WEXITSTATUS(status) == 0, "a forked process inherits it");
    ok(nw_sched_set_slice(0) == 0, "0: the kernel's default again");
    is((long long)nw_sched_slice(), (long long)before, "... the slice it had");
}

static void test_nice_kept(void)
{
    errno = 0;
    int nice_before = getpriority(PRIO_PROCESS, 0);
    ok(setpriority(PRIO_PROCESS, 0, nice_before + 3) == 0, "niced by 3");
    ok(nw_sched_set_slice(500000) == 0, "a slice asked for");
    is(getpriority(PRIO_PROCESS, 0), nice_before + 3, "... the nice value is kept");
}

/* The CPUs it may run on: the affinity mask, which a child narrowed to
 * one CPU sees as 1. */
static void test_cpus(void)
{
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    int n = nw_sched_cpus();
    ok(n >= 1 && n <= online, "between 1 and the CPUs online");
    pid_t pid = fork();
    if (pid == 0) {
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(sched_getcpu(), &one);
        _exit(sched_setaffinity(0, sizeof one, &one) == 0 && nw_sched_cpus() == 1 ? 0 : 1);
    }
    int status = -1;
    waitpid(pid, &status, 0);
    ok(WIFEXITED(status) && WEXITSTATUS(status) == 0, "narrowed to one CPU: 1");
}

int main(void)
{
    test_cpus();
    test_slice();
    test_nice_kept();
    done_testing();
    return tap_failed ? 1 : 0;
}
