#!/usr/bin/perl
# The C unit tests of the scoreboard and the status pages
# (t/c/test_status.c with src/shared/nw_scoreboard.c and src/manager/nw_status.c) and of
# the status server that answers them (t/c/test_status_server.c with
# src/manager/nw_status_server.c), under AddressSanitizer and
# UndefinedBehaviorSanitizer, passed through as tests.
use strict;
use warnings;
use Test::More;
use lib 't/lib';
use NarwhalTest::CBuild qw(build run_programs relay_tap);

# (built one after the other, then run all at once)
my @units = qw(test_status test_status_server);
my @exes = map { build($_, ["t/c/$_.c"]) } @units;
relay_tap(@$_) for run_programs(map { [$_] } @exes);
done_testing();
