use strict;
use warnings;
use Test::More;
use POSIX ();
use Time::HiRes qw(time);
use Narwhal ();
use Narwhal::Master ();

# The master's manage loop sleeps until its next look or a signal. Perl runs
# a signal's handler only at its next safe point, so a signal that came
# while the master was busy (a worker dying while it forks another) used to
# be seen only after a whole sleep. A C handler in front of Perl's writes to
# a pipe the sleep watches (src/worker/nw_signal.c, docs/SIGNALS.md): a signal
# that came before the sleep ends it at once.

alarm 30;      # a handler chained to itself would never return: fail, not hang
my $m = Narwhal::Master->new(options => {});
$m->_signals;

sub sleep_after {      # the time a 2 s sleep takes when $sig came just before it
    my ($sig) = @_;
    kill $sig => $$;
    my $t0 = time;
    $m->_sleep(2);
    return time - $t0;
}

for my $sig (qw(CHLD HUP TTIN USR1)) {
    my $took = sleep_after($sig);
    cmp_ok($took, '<', 0.5, sprintf('a %s that came before the sleep ends it at once (%.3f s)', $sig, $took));
}
is($m->{pending}{hup}, 1, "and Perl's own handler still ran (HUP noted)");

my $t0 = time;
$m->_sleep(0.3);
my $idle = time - $t0;
cmp_ok($idle, '>=', 0.25, sprintf('with no signal the sleep lasts (%.3f s): the pipe was emptied', $idle));

# Perl's %SIG code replaces the handler in front: an app loaded in the
# master that localises $SIG{CHLD}, say. The master puts it back once the
# app is loaded; putting it back when it is still there changes nothing
# (no handler chained to itself).
{ local $SIG{CHLD} = 'DEFAULT'; }
$m->_wake_on_signals;
$m->_wake_on_signals;
my $took = sleep_after('CHLD');
cmp_ok($took, '<', 0.5, sprintf('after a local $SIG{CHLD} and the master putting its handler back, still at once (%.3f s)', $took));

done_testing;
