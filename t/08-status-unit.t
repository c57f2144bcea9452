#!/usr/bin/perl
# The C unit tests of the scoreboard and the status pages
# (t/c/test_status.c with src/nw_scoreboard.c and src/nw_status.c), under
# AddressSanitizer and UndefinedBehaviorSanitizer, passed through as tests.
use strict;
use warnings;
use Test::More;
use lib 't/lib';
use NarwhalTest::CBuild qw(build run_program relay_tap);

my $exe = build('test_status', ['t/c/test_status.c'], '-Werror', '-pthread');
relay_tap(run_program($exe));
done_testing();
