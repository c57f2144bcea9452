/* Signal handlers of ours in front of the ones installed before them
 * (Perl's): ours runs first, in the signal's own context, then passes the
 * signal on. Perl-free; every handler here is async-signal-safe.
 *
 * The wake pipe: a process that sleeps in select or poll between looks at
 * its flags (the master's manage loop) loses a signal that arrives after
 * its last look and before the sleep begins, since Perl runs its handler
 * only at its next safe point, after the sleep. A handler in front that
 * writes a byte to a pipe the sleep also watches closes that window. */
#ifndef NW_SIGNAL_H
#define NW_SIGNAL_H

#include <signal.h>

/* Put handler in front of sig's present handler, which is kept in *next;
 * when handler is there already, nothing changes. Returns 0, or -1
 * (nothing changed). */
int nw_signal_in_front(int sig, void (*handler)(int, siginfo_t *, void *),
                       struct sigaction *next);

/* Pass a signal on to the handler ours sits in front of. */
void nw_signal_chain(const struct sigaction *next, int sig, siginfo_t *si, void *uc);

/* From now on, sig also writes one byte to fd (a non-blocking pipe's
 * write end) in this process, then goes on to its present handler. In a
 * child forked later the handler writes nothing (the fd is not its).
 * Perl's %SIG code calls sigaction itself, so a later $SIG{X} (or the end
 * of a local $SIG{X}) removes ours: call again after such code has run
 * (again is harmless: a handler already in front stays as it is).
 * Returns 0, or -1. */
int nw_signal_wake(int sig, int fd);

/* Who sent the last sig that nw_signal_wake's handler saw: the sender's
 * pid when a process sent it (kill, sigqueue: the kernel says who), 0
 * when the kernel did (a terminal's Ctrl-C, a child's exit) or none came
 * yet. The master logs it with every signal that changes the server. */
pid_t nw_signal_sender(int sig);

#endif
