/* Scheduling hints for a worker process: the time slice it asks Linux's
 * scheduler for (EEVDF, Linux 6.12 and later: a task's custom slice, the
 * sched_runtime of a SCHED_OTHER or SCHED_BATCH task). A shorter slice
 * than the kernel's default (1.4 ms on two cores, more on more) gives a
 * woken worker an earlier deadline and hands the CPU round sooner when
 * more processes are runnable than there are cores. See "Worker time
 * slices" in docs/DESIGN.md. */
#ifndef NW_SCHED_H
#define NW_SCHED_H

#include <stddef.h>
#include <stdint.h>

/* Ask for a slice of ns nanoseconds for the calling thread (threads it
 * starts later, and processes it forks, inherit it); 0: the kernel's
 * default. Its policy, nice value and other attributes are kept; a task
 * under another policy (realtime, SCHED_IDLE) is left as it is. Returns
 * 0, or -1 with errno (ENOSYS, EINVAL: a kernel without custom slices
 * may also accept it and ignore it). */
int nw_sched_set_slice(uint64_t ns);

/* The CPUs the calling thread may run on (its affinity mask: a cpuset or
 * taskset counts, a CPU quota does not); at least 1. */
int nw_sched_cpus(void);

/* The CPU quota of the cgroup this process is in, in CPUs (0.5: half a
 * CPU), the lowest along its path up to the root: cgroup v2's cpu.max
 * ("QUOTA PERIOD", or "max": none), v1's cpu.cfs_quota_us (-1: none) over
 * cpu.cfs_period_us. The cgroup is read from cgroup_file (a
 * /proc/self/cgroup), its files under root (/sys/fs/cgroup: v2 there or
 * in its unified/, v1 in its cpu/ or cpu,cpuacct/). Returns 1 with *cpus
 * set, 0 when no quota applies (or no cgroup file can be found), -1 when
 * a file says something it cannot parse: its path is then in bad (up to
 * bad_len bytes). See "CPU quotas" in docs/DESIGN.md. */
int nw_sched_cpu_quota(const char *root, const char *cgroup_file, double *cpus,
                       char *bad, size_t bad_len);

/* The CPUs the defaults count: the affinity mask's (nw_sched_cpus), or
 * the quota rounded up when that is fewer. */
int nw_sched_cpus_within(double quota);

#endif
