/* Signal handlers in front of Perl's, and the wake pipe (nw_signal.h). */
#include "nw_signal.h"

#include <errno.h>
#include <string.h>
#include <unistd.h>

int nw_signal_in_front(int sig, void (*handler)(int, siginfo_t *, void *),
                       struct sigaction *next)
{
    struct sigaction sa, now;
    if (sigaction(sig, NULL, &now) != 0)
        return -1;
    if ((now.sa_flags & SA_SIGINFO) && now.sa_sigaction == handler)
        return 0;               /* in front already: *next is what it passes on to */
    *next = now;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = handler;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    return sigaction(sig, &sa, NULL);
}

void nw_signal_chain(const struct sigaction *next, int sig, siginfo_t *si, void *uc)
{
    if (next->sa_flags & SA_SIGINFO)
        next->sa_sigaction(sig, si, uc);
    else if (next->sa_handler != SIG_DFL && next->sa_handler != SIG_IGN)
        next->sa_handler(sig);
}

/* ---- the wake pipe --------------------------------------------------- */

static struct sigaction wake_next[NSIG];
static volatile sig_atomic_t wake_fd = -1;
static volatile pid_t wake_pid;         /* the process the pipe is for */
static volatile pid_t sender[NSIG];     /* nw_signal_sender */

static void wake_handler(int sig, siginfo_t *si, void *uc)
{
    int saved = errno;
    /* (si_pid means the sender only for signals a process sent: si_code
     * SI_USER, SI_QUEUE, SI_TKILL, all <= 0) */
    sender[sig] = si && si->si_code <= 0 ? si->si_pid : 0;
    if (wake_fd >= 0 && getpid() == wake_pid)
        (void)!write(wake_fd, "", 1);   /* a full pipe is awake already */
    errno = saved;
    nw_signal_chain(&wake_next[sig], sig, si, uc);
}

int nw_signal_wake(int sig, int fd)
{
    if (sig <= 0 || sig >= NSIG || fd < 0)
        return -1;
    wake_fd = fd;
    wake_pid = getpid();
    return nw_signal_in_front(sig, wake_handler, &wake_next[sig]);
}

pid_t nw_signal_sender(int sig)
{
    return sig > 0 && sig < NSIG ? sender[sig] : 0;
}
