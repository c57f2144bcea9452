/* What /proc says of a process (see nw_procfs.h). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "nw_procfs.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int nw_procfs_stat(int pid, double *cpu_s, uint64_t *rss, unsigned long long rest[2])
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t n = fd >= 0 ? read(fd, buf, sizeof buf - 1) : -1;
    if (fd >= 0)
        close(fd);
    long tick = sysconf(_SC_CLK_TCK), page = sysconf(_SC_PAGESIZE);
    if (n <= 0 || tick <= 0)
        return -1;
    buf[n] = 0;
    /* after "pid (comm) ": fields 3.. (comm may hold spaces: from the last ')') */
    char *p3 = strrchr(buf, ')');
    unsigned long long utime, stime, start, vsize;
    long long pages;
    if (!p3 || sscanf(p3 + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu "
                      "%*d %*d %*d %*d %*d %*d %llu %llu %lld",
                      &utime, &stime, &start, &vsize, &pages) != 5)
        return -1;
    *cpu_s = (double)(utime + stime) / (double)tick;
    *rss = pages > 0 ? (uint64_t)pages * (uint64_t)(page > 0 ? page : 4096) : 0;
    if (rest) {
        rest[0] = start;
        rest[1] = vsize;
    }
    return 0;
}

/* The host's boot time (seconds since the epoch), read once. */
static double boot_time(void)
{
    static double btime;
    if (btime > 0)
        return btime;
    FILE *f = fopen("/proc/stat", "r");
    char line[256];
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "btime ", 6)) {
            btime = strtod(line + 6, NULL);
            break;
        }
    if (f)
        fclose(f);
    return btime;
}

void nw_procfs_read(int pid, nw_procfs_numbers *p)
{
    char path[64];
    double cpu;
    uint64_t rss;
    unsigned long long rest[2];
    p->cpu_s = p->start_unix = p->rss = p->vsize = p->fds = p->max_fds = -1;
    if (nw_procfs_stat(pid, &cpu, &rss, rest) == 0) {
        long tick = sysconf(_SC_CLK_TCK);
        double boot = boot_time();
        p->cpu_s = cpu;
        if (boot > 0)
            p->start_unix = boot + (double)rest[0] / (double)tick;
        p->vsize = (double)rest[1];
        p->rss = (double)rss;
    }
    snprintf(path, sizeof path, "/proc/%d/fd", pid);
    DIR *d = opendir(path);
    if (d) {
        double count = 0;
        for (struct dirent *e; (e = readdir(d));)
            count += e->d_name[0] != '.';
        closedir(d);
        p->fds = count;
    }
    snprintf(path, sizeof path, "/proc/%d/limits", pid);
    FILE *f = fopen(path, "r");
    char line[256];
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "Max open files", 14)) {
            char *v = line + 14;
            while (*v == ' ')
                v++;
            if (strncmp(v, "unlimited", 9))
                p->max_fds = strtod(v, NULL);
            break;
        }
    if (f)
        fclose(f);
}
