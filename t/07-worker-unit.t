#!/usr/bin/perl
# A worker's scheduling (src/nw_worker.c: taking connections, parking,
# hand-offs, release, the park watcher) and its C test
# (t/c/test_worker.c), under ASan/UBSan, with real sockets.
use strict;
use warnings;
use Test::More;
use lib 't/lib';
use NarwhalTest::CBuild qw(build run_program relay_tap);

plan skip_all => 'the worker is Linux only (epoll, accept4)'
    unless $^O eq 'linux';

my $test = build('test_worker', [qw(t/c/test_worker.c src/nw_worker.c src/nw_park.c
                                    src/nw_conn.c src/nw_http.c src/nw_io.c src/nw_frame.c
                                    src/nw_response.c src/nw_scoreboard.c src/nw_proxy.c
                                    src/nw_signal.c src/nw_log.c)], '-Werror', '-pthread');
relay_tap(run_program($test));
done_testing();
