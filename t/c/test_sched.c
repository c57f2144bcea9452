/* The worker's time slice (src/worker/nw_sched.c): asked for, reported back, and
 * its nice value kept. On a kernel that reports no slice (before Linux
 * 6.12's custom slices) only the calls' success is checked. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE     /* (sched_getcpu, CPU_SET) */
#endif
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include "tap.h"
#include "nw_sched.h"

/* The calling thread's slice in nanoseconds as the kernel reports it
 * (sched_getattr(2), made directly: glibc has no wrapper); 0 when it
 * reports none: a kernel before custom slices, or another policy. */
static uint64_t slice_now(void)
{
    struct {
        uint32_t size, policy;
        uint64_t flags;
        int32_t nice;
        uint32_t priority;
        uint64_t runtime, deadline, period;     /* runtime: the slice */
        uint32_t util_min, util_max;
    } a;
    memset(&a, 0, sizeof a);
    if (syscall(SYS_sched_getattr, 0, &a, sizeof a, 0) < 0
        || (a.policy != SCHED_OTHER && a.policy != SCHED_BATCH))
        return 0;
    return a.runtime;
}

static void test_slice(void)
{
    uint64_t before = slice_now();
    ok(nw_sched_set_slice(300000) == 0, "a slice of 0.3 ms is asked for");
    if (!before) {
        diag("this kernel reports no slice: only the call is checked");
        return;
    }
    is((long long)slice_now(), 300000, "... and reported back");
    pid_t pid = fork();
    if (pid == 0)
        _exit(slice_now() == 300000 ? 0 : 1);
    int status = -1;
    waitpid(pid, &status, 0);
    ok(WIFEXITED(status) && WEXITSTATUS(status) == 0, "a forked process inherits it");
    ok(nw_sched_set_slice(0) == 0, "0: the kernel's default again");
    is((long long)slice_now(), (long long)before, "... the slice it had");
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

/* Fixture cgroup trees: files written under a temporary root, and the
 * quota read as a process in them would. */
static char root[256];

static void put(const char *rel, const char *text)
{
    char path[512], dir[512];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    snprintf(dir, sizeof dir, "%s", path);
    for (char *p = dir + strlen(root) + 1; (p = strchr(p, '/')); p++) {
        *p = 0;
        mkdir(dir, 0755);
        *p = '/';
    }
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
}

static int quota(const char *cgroup_file_text, double *cpus, char *bad)
{
    put("proc-cgroup", cgroup_file_text);
    char cgroup_file[512];
    snprintf(cgroup_file, sizeof cgroup_file, "%s/proc-cgroup", root);
    *cpus = 0;
    bad[0] = 0;
    return nw_sched_cpu_quota(root, cgroup_file, cpus, bad, 512);
}

static void test_quota(void)
{
    double cpus;
    char bad[512];
    snprintf(root, sizeof root, "/tmp/nw-cgroup-XXXXXX");
    if (!mkdtemp(root)) {
        ok(0, "a temporary directory");
        return;
    }
    /* cgroup v2, one hierarchy */
    put("cgroup.controllers", "cpu memory\n");
    put("cpu.max", "max 100000\n");
    put("app.slice/cpu.max", "50000 100000\n");
    put("app.slice/web.service/cpu.max", "max 100000\n");
    is(quota("0::/app.slice/web.service\n", &cpus, bad), 1, "v2: a quota in a parent applies");
    ok(cpus > 0.49 && cpus < 0.51, "... half a CPU");
    put("app.slice/web.service/cpu.max", "150000 100000\n");
    is(quota("0::/app.slice/web.service\n", &cpus, bad), 1, "v2: the lowest on the path");
    ok(cpus > 0.49 && cpus < 0.51, "... still the parent's half");
    put("app.slice/cpu.max", "max 100000\n");
    quota("0::/app.slice/web.service\n", &cpus, bad);
    ok(cpus > 1.49 && cpus < 1.51, "... the service's own 1.5 once the parent has none");
    is(quota("0::/\n", &cpus, bad), 0, "v2 at the root: no quota");
    put("app.slice/web.service/cpu.max", "lots 100000\n");
    is(quota("0::/app.slice/web.service\n", &cpus, bad), -1, "v2: a quota that is no number");
    ok(strstr(bad, "web.service/cpu.max") != NULL, "... names its file");
    put("app.slice/web.service/cpu.max", "50000\n");
    is(quota("0::/app.slice/web.service\n", &cpus, bad), -1, "v2: a quota without a period");
    put("app.slice/web.service/cpu.max", "max\n");
    is(quota("0::/app.slice/web.service\n", &cpus, bad), 0, "v2: \"max\" alone: none");
    /* cgroup v1 (hybrid: v2 in unified/, which has no cpu.max) */
    remove(strcat(strcpy(bad, root), "/cgroup.controllers"));
    put("cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "25000\n");
    put("cpu,cpuacct/docker/abc/cpu.cfs_period_us", "100000\n");
    put("cpu,cpuacct/docker/cpu.cfs_quota_us", "-1\n");
    put("cpu,cpuacct/docker/cpu.cfs_period_us", "100000\n");
    put("unified/cgroup.controllers", "\n");
    is(quota("12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n0::/docker/abc\n", &cpus, bad), 1,
       "v1: cpu.cfs_quota_us over cpu.cfs_period_us");
    ok(cpus > 0.24 && cpus < 0.26, "... a quarter CPU");
    put("cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "-1\n");
    is(quota("4:cpu,cpuacct:/docker/abc\n0::/docker/abc\n", &cpus, bad), 0, "v1: -1 all the way up: none");
    put("cpu,cpuacct/docker/abc/cpu.cfs_period_us", "0\n");
    put("cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "1000\n");
    is(quota("4:cpu,cpuacct:/docker/abc\n", &cpus, bad), -1, "v1: a period of 0");
    ok(strstr(bad, "cpu.cfs_period_us") != NULL, "... names that file");
    is(quota("3:cpuset:/x\n1:name=systemd:/x\n", &cpus, bad), 0, "no cpu controller: no quota");
    is(nw_sched_cpu_quota(root, "/nonexistent/cgroup", &cpus, bad, sizeof bad), 0,
       "no cgroup file: no quota");
    is(nw_sched_cpus_within(0.25), 1, "a quarter CPU counts as 1");
    is(nw_sched_cpus_within(0), nw_sched_cpus(), "no quota: the affinity mask's count");
    is(nw_sched_cpus_within(1000), nw_sched_cpus(), "a quota over the CPUs: the CPUs");
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0)
        diag("could not remove %s", root);
}

int main(void)
{
    test_cpus();
    test_quota();
    test_slice();
    test_nice_kept();
    done_testing();
    return tap_failed ? 1 : 0;
}
