#!/usr/bin/perl
# The C unit tests of the scoreboard and the status pages
# (t/c/test_status.c with src/nw_scoreboard.c and src/nw_status.c) and of
# the status server that answers them (t/c/test_status_server.c with
# src/nw_status_server.c), under AddressSanitizer and
# UndefinedBehaviorSanitizer, passed through as tests.
use strict;
use warnings;
use Test::More;
use lib 't/lib';
use NarwhalTest::CBuild qw(build run_program relay_tap);

for my $unit (qw(test_status test_status_server)) {
    my $exe = build($unit, ["t/c/$unit.c"], '-Werror', '-pthread');
    relay_tap(run_program($exe));
}
done_testing();
