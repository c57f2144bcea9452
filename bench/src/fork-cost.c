/* fork-cost MB: what this machine charges for a process, the price of
 * recycling a worker: fork + exit of a process with MB of private memory,
 * then the same with the child writing every page (each write a
 * copy-on-write fault). Virtual machines that trap page-table updates
 * can make a fault ten times dearer than bare metal does.
 *   cc -O2 -o fork-cost bench/src/fork-cost.c && ./fork-cost 16 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { ROUNDS = 20, PAGE = 4096 };

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static double rounds(char *mem, size_t bytes, int touch)
{
    double t0 = now_ms();
    for (int i = 0; i < ROUNDS; i++) {
        pid_t pid = fork();
        if (pid < 0) {
            perror("fork");
            exit(1);
        }
        if (pid == 0) {
            for (size_t off = 0; touch && off < bytes; off += PAGE)
                mem[off]++;
            _exit(0);
        }
        waitpid(pid, NULL, 0);
    }
    return (now_ms() - t0) / ROUNDS;
}

int main(int argc, char **argv)
{
    size_t mb = argc > 1 ? strtoul(argv[1], NULL, 10) : 16;
    size_t bytes = mb << 20;
    char *mem = malloc(bytes);
    if (!mem)
        return 1;
    memset(mem, 1, bytes);
    double bare = rounds(mem, bytes, 0), touched = rounds(mem, bytes, 1);
    printf("%zu MB: fork+exit %.2f ms; writing every page in the child %.2f ms "
           "(%.2f us per copy-on-write fault)\n",
           mb, bare, touched, (touched - bare) * 1000 / (double)(bytes / PAGE));
    return 0;
}
