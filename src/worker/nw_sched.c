/* Scheduling hints for a worker process (nw_sched.h). glibc 2.36 has no
 * wrapper for sched_setattr(2) and sched_getattr(2): the system calls
 * are made directly, with the kernel's struct sched_attr as
 * sched_setattr(2) gives it (<linux/sched/types.h> clashes with
 * <sched.h>). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE     /* (SCHED_BATCH) */
#endif
#include "nw_sched.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <sched.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

struct sched_attr {
    uint32_t size;
    uint32_t sched_policy;
    uint64_t sched_flags;
    int32_t sched_nice;
    uint32_t sched_priority;
    uint64_t sched_runtime;     /* SCHED_OTHER and SCHED_BATCH: the slice (ns) */
    uint64_t sched_deadline;
    uint64_t sched_period;
    uint32_t sched_util_min;
    uint32_t sched_util_max;
};
#define SCHED_FLAG_RESET_ON_FORK 0x01

static int get_attr(struct sched_attr *a)
{
    memset(a, 0, sizeof *a);
    return (int)syscall(SYS_sched_getattr, 0, a, sizeof *a, 0);
}

int nw_sched_set_slice(uint64_t ns)
{
    struct sched_attr a;
    if (get_attr(&a) < 0)
        return -1;
    if (a.sched_policy != SCHED_OTHER && a.sched_policy != SCHED_BATCH) {
        errno = EPERM;          /* (not ours to change) */
        return -1;
    }
    a.size = sizeof a;
    a.sched_flags &= SCHED_FLAG_RESET_ON_FORK;   /* (the rest would set what they name) */
    a.sched_runtime = ns;
    return (int)syscall(SYS_sched_setattr, 0, &a, 0);
}

int nw_sched_cpus(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
        return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

int nw_sched_cpus_within(double quota)
{
    int cpus = nw_sched_cpus();
    if (quota > 0 && ceil(quota) < cpus)
        cpus = (int)ceil(quota);
    return cpus > 0 ? cpus : 1;
}

/* The first line of path, without its newline, into buf. Returns 0, or -1
 * when there is no such file. */
static int read_line(const char *path, char *buf, size_t len)
{
    FILE *f = fopen(path, "re");
    if (!f)
        return -1;
    int ok = fgets(buf, (int)len, f) != NULL;
    fclose(f);
    if (!ok)
        buf[0] = 0;
    buf[strcspn(buf, "\n")] = 0;
    return 0;
}

/* A whole decimal number (an optional '-' for v1's -1). */
static int parse_ll(const char *s, long long *v)
{
    char *end;
    errno = 0;
    *v = strtoll(s, &end, 10);
    return end != s && (*end == 0 || *end == ' ') && errno == 0 ? 0 : -1;
}

/* One cgroup directory's quota. 1: *cpus set; 0: none or no files; -1:
 * unparsable (bad named). */
static int dir_quota(const char *dir, int v2, double *cpus, char *bad, size_t bad_len)
{
    char path[4096 + 32], line[256];
    long long quota, period;
    if (v2) {
        snprintf(path, sizeof path, "%s/cpu.max", dir);
        if (read_line(path, line, sizeof line) < 0)
            return 0;
        if (strncmp(line, "max", 3) == 0 && (line[3] == 0 || line[3] == ' '))
            return 0;
        char *sp = strchr(line, ' ');
        if (parse_ll(line, &quota) < 0 || quota <= 0 || !sp || parse_ll(sp + 1, &period) < 0
            || period <= 0)
            goto unparsable;
    } else {
        snprintf(path, sizeof path, "%s/cpu.cfs_quota_us", dir);
        if (read_line(path, line, sizeof line) < 0)
            return 0;
        if (parse_ll(line, &quota) < 0)
            goto unparsable;
        if (quota < 0)
            return 0;
        snprintf(path, sizeof path, "%s/cpu.cfs_period_us", dir);
        if (read_line(path, line, sizeof line) < 0 || parse_ll(line, &period) < 0 || period <= 0
            || quota == 0)
            goto unparsable;
    }
    *cpus = (double)quota / (double)period;
    return 1;
unparsable:
    snprintf(bad, bad_len, "%s", path);
    return -1;
}

/* The lowest quota from base/cgroup up to base. */
static int path_quota(const char *base, const char *cgroup, int v2, double *cpus,
                      char *bad, size_t bad_len)
{
    char dir[4096];
    int found = 0;
    snprintf(dir, sizeof dir, "%s%s", base, strcmp(cgroup, "/") == 0 ? "" : cgroup);
    size_t base_len = strlen(base);
    for (;;) {
        double q = 0;
        int r = dir_quota(dir, v2, &q, bad, bad_len);
        if (r < 0)
            return -1;
        if (r > 0 && (!found || q < *cpus)) {
            *cpus = q;
            found = 1;
        }
        char *slash = strrchr(dir, '/');
        if (!slash || (size_t)(slash - dir) < base_len)
            break;
        *slash = 0;     /* (its parent; base itself last) */
    }
    return found;
}

/* Whether a v1 controller list ("cpu,cpuacct") names cpu. */
static int names_cpu(const char *list)
{
    for (const char *p = list; *p; ) {
        size_t n = strcspn(p, ",");
        if (n == 3 && strncmp(p, "cpu", 3) == 0)
            return 1;
        p += n + (p[n] == ',');
    }
    return 0;
}

static int is_dir(const char *path)
{
    return access(path, F_OK) == 0;
}

int nw_sched_cpu_quota(const char *root, const char *cgroup_file, double *cpus,
                       char *bad, size_t bad_len)
{
    FILE *f = fopen(cgroup_file, "re");
    char line[4096], base[4096];
    int found = 0;
    if (!f)
        return 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2)
            continue;
        *c2 = 0;
        const char *controllers = c1 + 1, *cgroup = c2 + 1;
        int v2 = controllers[0] == 0;
        if (v2) {
            snprintf(base, sizeof base, "%s/cgroup.controllers", root);
            snprintf(base, sizeof base, is_dir(base) ? "%s" : "%s/unified", root);
        } else if (names_cpu(controllers)) {
            snprintf(base, sizeof base, "%s/%s", root, controllers);
            if (!is_dir(base))
                snprintf(base, sizeof base, "%s/cpu", root);
        } else {
            continue;
        }
        double q = 0;
        int r = path_quota(base, cgroup, v2, &q, bad, bad_len);
        if (r < 0) {
            fclose(f);
            return -1;
        }
        if (r > 0 && (!found || q < *cpus)) {
            *cpus = q;
            found = 1;
        }
    }
    fclose(f);
    return found;
}
