#!/usr/bin/perl
# The connection manager (src/manager/narwhal-manager.c + src/nw_manager.c)
# and its C test (t/c/test_manager.c), both under ASan/UBSan. The C test
# plays the master and the workers over real sockets; see it for what is
# covered.
use strict;
use warnings;
use Test::More;
use lib 't/lib';
use NarwhalTest::CBuild qw(build run_program relay_tap);

plan skip_all => 'the connection manager is Linux only (epoll, signalfd)'
    unless $^O eq 'linux';

my $manager = build('narwhal-manager', ['src/manager/narwhal-manager.c'], '-Werror');
# The test plays the workers too: it links their connection code (it
# includes nw_conn.h), to feed the worker's head scanner the same bytes as
# the manager's.
my $test = build('test_manager', ['t/c/test_manager.c'], '-Werror');
relay_tap(run_program($test, $manager));
done_testing();
