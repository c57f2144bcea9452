#!/usr/bin/perl
# The C unit tests of the HTTP parser (t/c/test_http.c with src/nw_http.c)
# and of the signal handlers in front of Perl's (t/c/test_signal.c with
# src/nw_signal.c) and of the error-log lines' format (t/c/test_log.c
# with src/nw_log.c) and of the access log's escaping
# (t/c/test_accesslog.c), under AddressSanitizer and UndefinedBehaviorSanitizer,
# passed through as tests here.
use strict;
use warnings;
use Test::More;
use lib 't/lib';
use NarwhalTest::CBuild qw(build run_program relay_tap);

my $exe = build('test_http', [qw(t/c/test_http.c src/nw_http.c)], '-Werror');
relay_tap(run_program($exe));
my $signal = build('test_signal', [qw(t/c/test_signal.c src/nw_signal.c)], '-Werror');
relay_tap(run_program($signal));
my $log = build('test_log', [qw(t/c/test_log.c src/nw_log.c)], '-Werror');
relay_tap(run_program($log));
my $alog = build('test_accesslog', [qw(t/c/test_accesslog.c src/nw_accesslog.c src/nw_io.c)], '-Werror');
relay_tap(run_program($alog));
done_testing();
