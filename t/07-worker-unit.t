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
use NarwhalTest::CBuild qw(build run_programs relay_tap);

plan skip_all => 'the worker is Linux only (epoll, accept4)'
    unless $^O eq 'linux';

# (built one after the other, then run all at once)
my @units = qw(test_worker test_worker_signals);
my @exes = map { build($_, ["t/c/$_.c"]) } @units;
relay_tap(@$_) for run_programs(map { [$_] } @exes);
done_testing();
