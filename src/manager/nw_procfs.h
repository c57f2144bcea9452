/* What /proc says of a process: the CPU time and resident size the
 * status pages show for each worker, and the numbers of the standard
 * process_* families of /metrics, which describe the master. */
#ifndef NW_PROCFS_H
#define NW_PROCFS_H

#include <stdint.h>

/* utime + stime (seconds) and the resident size (bytes) of pid from one
 * read of /proc/PID/stat; the fields after those, from field 22 on, into
 * rest (start time, vsize) when asked. -1 when it could not be read. */
int nw_procfs_stat(int pid, double *cpu_s, uint64_t *rss, unsigned long long rest[2]);

/* Everything of pid that process_* shows: -1 where it could not be read
 * (another user's fds under --user, say). */
typedef struct {
    double cpu_s, start_unix;
    double rss, vsize, fds, max_fds;
} nw_procfs_numbers;
void nw_procfs_read(int pid, nw_procfs_numbers *p);

#endif
