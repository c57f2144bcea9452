use strict;
use warnings;
use Test::More;
use Test2::IPC;    # (parts of this file run in processes of their own)
use lib 't/lib';
use IO::Select ();
use Time::HiRes qw(time sleep);
use NarwhalTest qw(spawn_server write_app wait_until manager_fallback free_port http_get worker_pids
                   raw_connect read_response in_parallel);

# Latency as the client sees it: a slow app behind too few workers makes
# requests wait in the connection manager's queue. That wait is in
# narwhal_request_queue_seconds, the app's time in
# narwhal_request_duration_seconds, and together they make what the
# clients measured (within 15% + 50 ms). The duration histogram resolves
# a fast app (buckets from 100 us).

my @NM = manager_fallback();
plan skip_all => 'the status pages need the connection manager'
    if !NarwhalTest::managed();

my $APP = NarwhalTest::sleepy_app();

my $sport;    # (each part below: a server of its own, status on a port of its own)

sub metrics { NarwhalTest::metrics_of(@_) }

# Send each [connection, path] its request at once and wait for every
# answer; then the queue and service sums the metrics gained must make what
# the clients measured, and the waits must be in the queue histogram.
sub add_up {
    my ($where, $before, $sends, $min_queue, $expect) = @_;
    my (%sent, %took, %buf);
    for my $i (0 .. $#$sends) {
        $sent{$i} = time;
        syswrite($sends->[$i][0], "GET $sends->[$i][1] HTTP/1.1\r\nHost: x\r\n\r\n");
    }
    my @h = map { $_->[0] } @$sends;
    my $sel = IO::Select->new(@h);
    my $end = time + 15;
    while (keys %took < @$sends && time < $end) {
        for my $h ($sel->can_read(0.5)) {
            my ($i) = grep { $h[$_] == $h } 0 .. $#h;
            sysread($h, $buf{$i}, 65536, length($buf{$i} // '')) or next;
            $took{$i} //= time - $sent{$i} if $buf{$i} =~ /\r\n\r\nok\n/;
        }
    }
    is(scalar keys %took, scalar @$sends, "$where: every answer");
    my $client = 0;
    $client += $_ for values %took;
    # (the last request's duration is counted as its answer is sent: at
    # most a moment after the client has it; a wait is counted as it starts)
    my $after;
    wait_until(sub { $after = metrics($sport);
                     !grep { ($after->{$_} // 0) < ($before->{$_} // 0) + @$sends }
                          qw(narwhal_request_duration_seconds_count narwhal_request_queue_seconds_count) }, 2);
    my $d = sub { $after->{$_[0]} - $before->{$_[0]} };
    my $queue = $d->('narwhal_request_queue_seconds_sum');
    my $service = $d->('narwhal_request_duration_seconds_sum');
    is($d->('narwhal_request_queue_seconds_count'), scalar @$sends,
       "$where: each request's wait is in the queue histogram");
    cmp_ok($queue, '>', $min_queue, sprintf("$where: they waited (%.3f s in all; %s)", $queue, $expect));
    my $sum = $queue + $service;
    cmp_ok(abs($sum - $client), '<', 0.1 * $client + 0.03,
           sprintf("$where: queue %.3f s + service %.3f s = %.3f s, the clients measured %.3f s",
                   $queue, $service, $sum, $client));
    return $after;
}

my $part_manager = sub {
    # One worker; connections go to the manager as soon as they are quiet.
    $sport = free_port();
    my $s = spawn_server(app => $APP, args => [ '--max-workers', 1, '--keepalive-wait', 0,
                                                '--status-listen', "127.0.0.1:$sport" ]);
    wait_until(sub { worker_pids($s->pid) == 1 }, 5);

    my @c = map { raw_connect($s->port) } 1 .. 4;
    for my $c (@c) {     # each served once; then idle in the manager
        syswrite($c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
        read_response($c, 5);
    }
    ok(wait_until(sub { (metrics($sport)->{'narwhal_connections{state="idle"}'} // 0) == 4 }, 5),
       'four idle connections in the manager');
    my $before = metrics($sport);

    # All four ask at once for 0.3 s of work: one worker serves them in turn.
    my $after = add_up('in the manager\'s queue', $before, [ map { [ $_, '/sleep/0.3' ] } @c ],
                       1.2, 'about 0 + 0.3 + 0.6 + 0.9');
    # The queue histogram's buckets: cumulative, ending at the count.
    my @qb = map { $after->{"narwhal_request_queue_seconds_bucket{le=\"$_\"}"} }
             qw(0.0001 0.00025 0.0005 0.001 0.0025 0.005 0.01 0.025 0.05 0.1 0.25 0.5 1 2.5 5 10 30 +Inf);
    ok(!grep({ !defined } @qb), 'the queue histogram has its buckets, 100 us to 30 s');
    is($qb[-1], $after->{narwhal_request_queue_seconds_count}, '+Inf is the count');

    # A fast app: its requests fall in the first buckets, not all in one.
    for (1 .. 20) {
        syswrite($c[0], "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
        read_response($c[0], 5);
    }
    my $m = metrics($sport);
    cmp_ok($m->{'narwhal_request_duration_seconds_bucket{le="0.005"}'} // 0, '>=', 20,
           'fast requests are under 5 ms');
    ok(defined $m->{'narwhal_request_duration_seconds_bucket{le="0.0001"}'}
       && defined $m->{'narwhal_request_duration_seconds_bucket{le="0.00025"}'}, '... with buckets below 5 ms to tell them apart');
    # (the clients close first: the stop need not linger for them)
    $_->close for @c;
    $s->stop;
};

# The same worker, now keeping served connections parked: while it serves
# one, the others' requests wait in its parked set. 40 ms requests stay
# there (waits 0, 40, .. 280 ms); 300 ms ones make the worker hand the
# parked connections to the manager after 50 ms, which keeps the wait
# they had (the kernel's receive time of their bytes). Each on a server
# of its own, whose eight connections were served once and are parked.
sub parked_server {
    $sport = free_port();
    my $s = spawn_server(app => $APP, args => [ '--max-workers', 1, '--keepalive-wait', 5,
                                             '--status-listen', "127.0.0.1:$sport" ]);
    wait_until(sub { worker_pids($s->pid) == 1 }, 5);
    my @c = map { raw_connect($s->port) } 1 .. 8;
    for my $c (@c) {
        syswrite($c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
        read_response($c, 5);
    }
    ok(wait_until(sub { (metrics($sport)->{'narwhal_connections{state="parked"}'} // 0) == 8 }, 5),
       'eight connections parked in the worker');
    return ($s, @c);
}

my $part_parked = sub {
    my ($s, @c) = parked_server();
    add_up('parked in a busy worker', metrics($sport),
           [ map { [ $_, '/sleep/0.04' ] } @c ], 0.8, 'about 0 + 0.04 + .. + 0.28');
    # (the clients close first: the stop need not linger for them)
    $_->close for @c;
    $s->stop;
};

my $part_parked_slow = sub {
    my ($s, @c) = parked_server();
    add_up('parked, then handed to the manager', metrics($sport),
           [ map { [ $_, '/sleep/0.3' ] } @c[0 .. 3] ], 1.2, 'about 0 + 0.3 + 0.6 + 0.9');
    # (the clients close first: the stop need not linger for them)
    $_->close for @c;
    $s->stop;
};

my $part_listen_queue = sub {
    # New connections while the worker is busy wait in the listen queue, where
    # no process sees them; the kernel's receive time of their request says
    # how long. (The busy worker's own request first: 0.5 s. One queue: a
    # worker takes turns between an address's queues, and a worker woken
    # late, on a loaded machine, took a 0.1 s request first from another.)
    $sport = free_port();
    my $s = spawn_server(app => $APP, args => [ '--max-workers', 1, '--keepalive-wait', 5,
                                             '--listen-queues', 1,
                                             '--status-listen', "127.0.0.1:$sport" ]);
    wait_until(sub { worker_pids($s->pid) == 1 }, 5);
    my $before = metrics($sport);
    my @fresh = map { raw_connect($s->port) } 1 .. 3;
    add_up('in the listen queue', $before,
           [ [ raw_connect($s->port), '/sleep/0.5' ], map { [ $_, '/sleep/0.1' ] } @fresh ],
           1.2, 'about 0 + 0.5 + 0.6 + 0.7');
    # (the clients close first: the stop need not linger for them)
    $_->close for @fresh;
    $s->stop;
};

# (all at once: one worker each, sleeping)
in_parallel($part_manager, $part_parked, $part_parked_slow, $part_listen_queue);
done_testing();
