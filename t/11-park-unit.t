#!/usr/bin/perl
# A worker's parked connections (src/worker/nw_park.c) and its C test
# (t/c/test_park.c), under ASan/UBSan. The test parks real socketpairs in a
# real epoll set; see it for what is covered.
use strict;
use warnings;
use Test::More;
use lib 't/lib';
use NarwhalTest::CBuild qw(build run_program relay_tap);

plan skip_all => 'parking is Linux only (epoll)'
    unless $^O eq 'linux';

my $test = build('test_park', ['t/c/test_park.c']);
relay_tap(run_program($test));
done_testing();
