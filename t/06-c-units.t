#!/usr/bin/perl
# The C unit tests of the HTTP parser (t/c/test_http.c), of the signal
# handlers in front of Perl's (t/c/test_signal.c), of the error-log lines
# and their limiter (t/c/test_log.c) and of the access log (its escaping:
# t/c/test_accesslog.c; its lines and flushes: t/c/test_accesslog_lines.c),
# of the manager's index of connections in custody (t/c/test_custody.c)
# of the worker's time slice and CPU quota (t/c/test_sched.c), of its
# measure of requests that block (t/c/test_block_meter.c), of its
# deadline list (t/c/test_deadlines.c), of the TLS part's context,
# handshake, handshake threads and relay (t/c/test_tls.c: it alone links
# OpenSSL, through the flags nw_tls.h brings; run under ThreadSanitizer
# too),
# under AddressSanitizer and UndefinedBehaviorSanitizer,
# passed through as tests here. What each links with comes from its
# includes (inc/NarwhalLink.pm).
use strict;
use warnings;
use Test::More;
use lib 't/lib';
use NarwhalTest::CBuild qw(build build_threaded run_programs relay_tap);

# (built one after the other, then run all at once)
my @units = qw(test_http test_signal test_log test_accesslog test_accesslog_lines test_custody
               test_sched test_block_meter test_deadlines test_tls);
my @exes = map { build($_, ["t/c/$_.c"]) } @units;
# and the TLS part's again under ThreadSanitizer: its handshake threads
# (nw_tls_pool) share the context with the manager's thread
push @exes, grep { defined } build_threaded('test_tls', ['t/c/test_tls.c']);
relay_tap(@$_) for run_programs(map { [$_] } @exes);
done_testing();
