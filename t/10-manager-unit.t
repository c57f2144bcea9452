#!/usr/bin/perl
# The connection manager (src/manager/narwhal-manager.c + src/manager/nw_manager.c)
# and its C test (t/c/test_manager.c), both under ASan/UBSan. The C test
# plays the master and the workers over real sockets; see it for what is
# covered.
use strict;
use warnings;
use Test::More;
use lib 't/lib';
use NarwhalTest::CBuild qw(build run_program run_programs relay_tap);

plan skip_all => 'the connection manager is Linux only (epoll, signalfd)'
    unless $^O eq 'linux';

my $manager = build('narwhal-manager', ['src/manager/narwhal-manager.c']);
# The test plays the workers too: it links their connection code (it
# includes nw_conn.h), to feed the worker's head scanner the same bytes as
# the manager's.
my $test = build('test_manager', ['t/c/test_manager.c']);
# Its groups of tests (main() there names them) each in a process of its
# own, all at once: most of their time is spent waiting for the manager's
# deadlines, not computing.
my ($st, $list, $err) = run_program($test, $manager, '--groups');
my @groups = split ' ', $list;
ok($st == 0 && @groups >= 8, 'the C test names its groups') or diag "status $st: $list$err";
my @runs = run_programs(map { [ $test, $manager, '--only', $_ ] } @groups);
for my $i (0 .. $#groups) {
    note("group $groups[$i]");
    relay_tap(@{ $runs[$i] });
}
done_testing();
