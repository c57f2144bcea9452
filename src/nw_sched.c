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

uint64_t nw_sched_slice(void)
{
    struct sched_attr a;
    if (get_attr(&a) < 0 || (a.sched_policy != SCHED_OTHER && a.sched_policy != SCHED_BATCH))
        return 0;
    return a.sched_runtime;
}

int nw_sched_cpus(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
        return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}
