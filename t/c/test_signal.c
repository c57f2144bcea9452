/* Unit tests of src/worker/nw_signal.c: a handler in front of another passes the
 * signal on, and the wake pipe gets a byte for each signal, in the
 * process that asked for it only. Run by t/06-c-units.t (under ASan and
 * UBSan), or by hand:
 *   cc -std=gnu99 -g -Wall -Wextra -Werror -Isrc/shared -Isrc/worker -Isrc/manager -It/c t/c/test_signal.c \
 *      src/worker/nw_signal.c -o /tmp/test_signal && /tmp/test_signal
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "nw_signal.h"
#include "tap.h"

static volatile sig_atomic_t behind_ran;

static void behind(int sig)
{
    (void)sig;
    behind_ran++;
}

static int pending_bytes(int fd)
{
    char buf[64];
    int n = 0;
    ssize_t r;
    while ((r = read(fd, buf, sizeof buf)) > 0)
        n += (int)r;
    return n;
}

int main(void)
{
    int p[2];
    if (pipe(p) < 0 || fcntl(p[0], F_SETFL, O_NONBLOCK) < 0 || fcntl(p[1], F_SETFL, O_NONBLOCK) < 0)
        return 1;
    signal(SIGUSR1, behind);            /* the handler already there (Perl's, in the master) */
    ok(nw_signal_wake(SIGUSR1, p[1]) == 0, "the wake handler goes in front of SIGUSR1's");
    ok(nw_signal_wake(0, p[1]) < 0, "no signal 0");

    raise(SIGUSR1);
    is(pending_bytes(p[0]), 1, "a signal writes a byte to the wake pipe");
    is(behind_ran, 1, "and goes on to the handler behind");

    /* A signal while nothing reads: the pipe fills up, the handler neither
     * blocks nor loses the signal for the handler behind. */
    for (int i = 0; i < 70000; i++)
        raise(SIGUSR1);
    ok(pending_bytes(p[0]) > 0, "many signals: the pipe holds what it can");
    is(behind_ran, 70001, "and every signal reached the handler behind");

    /* The handler's write into a full pipe fails (EAGAIN): the errno of the
     * code it interrupted must be as it was. */
    for (int i = 0; i < 70000; i++)
        raise(SIGUSR1);
    errno = EDOM;
    raise(SIGUSR1);
    is(errno, EDOM, "a write into a full pipe leaves errno as it was");
    pending_bytes(p[0]);
    behind_ran = 70001;

    pid_t child = fork();
    if (child == 0) {                   /* a worker the master forks, before its own handlers */
        raise(SIGUSR1);
        _exit(behind_ran == 70002 ? 0 : 1);
    }
    int status = 0;
    waitpid(child, &status, 0);
    ok(WIFEXITED(status) && WEXITSTATUS(status) == 0, "in a forked child the handler behind still runs");
    is(pending_bytes(p[0]), 0, "but the child writes nothing to the parent's pipe");

    return done_testing();
}
