#!/usr/bin/perl
# The C unit tests of the PROXY protocol parser and encoder and of
# --proxy-from (t/c/test_proxy.c with src/shared/nw_proxy.c), under AddressSanitizer
# and UndefinedBehaviorSanitizer, passed through as tests here.
use strict;
use warnings;
use Test::More;
use lib 't/lib';
use NarwhalTest::CBuild qw(build run_program relay_tap);

my $exe = build('test_proxy', ['t/c/test_proxy.c']);
relay_tap(run_program($exe));
done_testing();
