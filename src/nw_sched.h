/* Scheduling hints for a worker process: the time slice it asks Linux's
 * scheduler for (EEVDF, Linux 6.12 and later: a task's custom slice, the
 * sched_runtime of a SCHED_OTHER or SCHED_BATCH task). A shorter slice
 * than the kernel's default (1.4 ms on two cores, more on more) gives a
 * woken worker an earlier deadline and hands the CPU round sooner when
 * more processes are runnable than there are cores. See "Worker time
 * slices" in docs/DESIGN.md. */
#ifndef NW_SCHED_H
#define NW_SCHED_H

#include <stdint.h>

/* Ask for a slice of ns nanoseconds for the calling thread (threads it
 * starts later, and processes it forks, inherit it); 0: the kernel's
 * default. Its policy, nice value and other attributes are kept; a task
 * under another policy (realtime, SCHED_IDLE) is left as it is. Returns
 * 0, or -1 with errno (ENOSYS, EINVAL: a kernel without custom slices
 * may also accept it and ignore it). */
int nw_sched_set_slice(uint64_t ns);

/* The calling thread's slice in nanoseconds as the kernel reports it (0:
 * it reports none: a kernel before custom slices, or another policy). */
uint64_t nw_sched_slice(void);

/* The CPUs the calling thread may run on (its affinity mask: a cpuset or
 * taskset counts, a CPU quota does not); at least 1. */
int nw_sched_cpus(void);

#endif
