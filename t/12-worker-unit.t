#!/usr/bin/perl
# A worker's scheduling (src/worker/nw_worker.c: taking connections, release,
# and its parts: nw_sources.c, nw_parking.c, nw_handoff.c,
# nw_custody_wait.c, nw_adopt.c, nw_watcher.c, nw_pool_place.c,
# nw_deadlines.c, nw_wconn.c) and its C test (t/c/test_worker.c), and a
# worker process's signals (src/worker/nw_worker_signals.c: crash, watchdog,
# stop sender, memory limit, deferred signals) and theirs
# (t/c/test_worker_signals.c), under ASan/UBSan, with real sockets.
use strict;
use warnings;
use Test::More;
use lib 't/lib';
use NarwhalTest::CBuild qw(build run_program run_programs relay_tap);

plan skip_all => 'the worker is Linux only (epoll, accept4)'
    unless $^O eq 'linux';

# (built one after the other, then run all at once, each in a process of
# its own: the signal handlers' test and the scheduling's groups of tests,
# which main() there names; most of their time is spent waiting)
my ($worker, $signals) = map { build($_, ["t/c/$_.c"]) } qw(test_worker test_worker_signals);
my ($st, $list, $err) = run_program($worker, '--groups');
my @groups = split ' ', $list;
ok($st == 0 && @groups >= 3, "the worker's C test names its groups") or diag "status $st: $list$err";
my @runs = run_programs([$signals], map { [ $worker, '--only', $_ ] } @groups);
relay_tap(@{ shift @runs });
for my $i (0 .. $#groups) {
    note("group $groups[$i]");
    relay_tap(@{ $runs[$i] });
}
done_testing();
