use strict;
use warnings;
use Test::More;
use Test2::IPC;    # (the three heads are sent by processes of their own)
use lib 't/lib';
use Time::HiRes qw(time sleep);
use NarwhalTest qw(spawn_server raw_connect read_response in_parallel);

# A request head trickled in slowly is dropped with 408 at --read-timeout
# from its first byte; one still arriving at least --min-head-rate bytes a
# second keeps going, up to --read-timeout-max. Raw sockets, both modes
# (NARWHAL_TEST_ARGS=--no-manager runs the worker's side).

# (three workers: the three heads below are sent at the same time, each
# by a process of its own, and without the manager each has a worker.
# Half a second for the base and 2 s for the cap: the fast head below
# takes 1.2 s, well clear of both; the file takes as long as the cap.)
my $srv = spawn_server(args => [ '--max-workers', 3, '--read-timeout', 0.5,
                                 '--read-timeout-max', 2, '--min-head-rate', 20 ]);

# Send $head one piece every $gap seconds; returns (response, seconds).
sub trickle {
    my ($head, $piece, $gap, $limit) = @_;
    my $c = raw_connect($srv->port) or die;
    my $t0 = time;
    my $sent = 0;
    while ($sent < length $head && time - $t0 < $limit) {
        syswrite($c, substr($head, $sent, $piece)) or last;
        $sent += $piece;
        my $rin = '';
        vec($rin, fileno $c, 1) = 1;
        last if select(my $r = $rin, undef, undef, $gap);   # the server answered (or closed)
    }
    my $res = read_response($c, 6);
    return ($res, time - $t0);
}

my $head = "GET /slow HTTP/1.1\r\nHost: t\r\nX-Pad: " . ('x' x 100) . "\r\n\r\n";   # 140 bytes

# 5 bytes a second, under the 20 required: 408 soon after the 0.5 s base
# (and well before the 2 s cap)
my $too_slow = sub {
    my ($res, $took) = trickle($head, 1, 0.2, 10);
    is($res && $res->{status}, 408, 'a head trickled at 5 bytes/s gets 408');
    cmp_ok($took, '<', 1.5, sprintf('... at about --read-timeout, not later (%.2f s)', $took));

};
# 100 bytes a second: the deadline keeps moving, and the head completes
# after 1.2 s (seven pieces), past the 0.5 s base but within the 2 s cap
my $fast_enough = sub {
    my ($res, $took) = trickle($head, 20, 0.2, 10);
    is($res && $res->{status}, 200, 'a head arriving at 100 bytes/s is served though it takes longer than --read-timeout');
    cmp_ok($took, '>', 1.0, sprintf('... it did take longer (%.2f s)', $took));

};
# fast enough, but longer than the cap: 408 at --read-timeout-max
my $long = "GET /long HTTP/1.1\r\nHost: t\r\nX-Pad: " . ('x' x 2000) . "\r\n\r\n";
my $too_long = sub {
    my ($res, $took) = trickle($long, 20, 0.2, 10);
    is($res && $res->{status}, 408, 'a head still arriving at --read-timeout-max gets 408');
    cmp_ok($took, '<', 3, sprintf('... at the cap (%.2f s)', $took));
};

in_parallel($too_slow, $fast_enough, $too_long);
done_testing;
