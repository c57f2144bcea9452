#!/usr/bin/perl
# The C unit tests of the HTTP parser (t/c/test_http.c with src/nw_http.c),
# under AddressSanitizer and UndefinedBehaviorSanitizer, passed through as
# tests here.
use strict;
use warnings;
use Test::More;
use lib 't/lib';
use NarwhalTest::CBuild qw(build run_program relay_tap);

my $exe = build('test_http', [qw(t/c/test_http.c src/nw_http.c)], '-Werror');
relay_tap(run_program($exe));
done_testing();
