#!/usr/bin/perl
# A worker's scheduling (src/nw_worker.c: taking connections, parking,
# hand-offs, release, the park watcher) and its C test
# (t/c/test_worker.c), and a worker process's signal handlers
# (src/nw_worker_signals.c: crash, watchdog, stop sender, memory limit)
# and theirs (t/c/test_worker_signals.c), under ASan/UBSan, with real
# sockets.
use strict;
use warnings;
use Test::More;
use lib 't/lib';
use NarwhalTest::CBuild qw(build run_program relay_tap);

plan skip_all => 'the worker is Linux only (epoll, accept4)'
    unless $^O eq 'linux';

for my $unit (qw(test_worker test_worker_signals)) {
    my $test = build($unit, ["t/c/$unit.c"], '-Werror', '-pthread');
    relay_tap(run_program($test));
}
done_testing();
