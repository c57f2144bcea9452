use strict;
use warnings;
use Test::More;
use Test2::IPC;    # (parts of this file run in processes of their own)
use lib 't/lib';
use IO::Select ();
use Time::HiRes qw(time sleep);
use NarwhalTest qw(spawn_server write_app wait_until manager_fallback free_port http_get worker_pids
                   raw_connect read_response tmpdir in_parallel);

# When every worker is stuck on a request, new connections must not wait
# unseen in the listen queue: the manager takes them, queues them with
# the time their request arrived, and --max-queue-wait sheds them with
# 503 + Retry-After; without a limit they are served, in order, when a
# worker is free, and their wait is in narwhal_request_queue_seconds.
# Once a worker is free the workers accept directly again.

my @NM = manager_fallback();
plan skip_all => 'the connection manager takes them'
    if !NarwhalTest::managed();

my $APP = NarwhalTest::sleepy_app('"ok $env->{REMOTE_ADDR}\n"');

# (each part below has its own server, and status address; a server stops
# as its part ends and its guard goes, but in the part that looks at the
# stop)
our $sport;
sub metrics { NarwhalTest::metrics_of($sport) }

# Send GET $path on each connection at once; [status, seconds, response,
# time of the answer] per one.
sub ask_all {
    my ($path, $timeout, @conns) = @_;
    my (%sent, %got, %buf);
    for my $i (0 .. $#conns) {
        $sent{$i} = time;
        syswrite($conns[$i], "GET $path HTTP/1.1\r\nHost: x\r\n\r\n");
    }
    my $sel = IO::Select->new(@conns);
    my $end = time + $timeout;
    while (keys %got < @conns && time < $end) {
        for my $h ($sel->can_read(0.2)) {
            my ($i) = grep { $conns[$_] == $h } 0 .. $#conns;
            my $n = sysread($h, $buf{$i}, 65536, length($buf{$i} // ''));
            if (!$n) { $sel->remove($h); $got{$i} //= [ 0, time - $sent{$i}, '', time ]; next }
            $got{$i} //= [ $1, time - $sent{$i}, $buf{$i}, time ]
                if $buf{$i} =~ m{^HTTP/1\.1 (\d+).*?\r\n\r\n.*\n}s;
        }
    }
    return map { $got{$_} // [ -1, undef, '', undef ] } 0 .. $#conns;
}

# Two workers stuck in 2 s requests.
sub occupy {
    my ($where) = @_;
    my @busy = map { raw_connect($where) } 1 .. 2;
    syswrite($_, "GET /sleep/2 HTTP/1.1\r\nHost: x\r\n\r\n") for @busy;
    return @busy;
}

# Both workers stuck: the manager says it takes new connections.
sub manager_accepting { wait_until(sub { (metrics()->{narwhal_manager_accepting} // 0) == 1 }, 2) }

# 1. --max-queue-wait 500: twenty new clients get 503 at about 0.5 s (and
# well before the stuck requests end). Once they are timed, it says so in
# $timed (a file) for the part that sends 100 clients at once.
my $timed = tmpdir() . '/503s-timed';
my $part_queue_wait = sub {
    local $sport = free_port();
    my $s = spawn_server(app => $APP, args => [ '--max-workers', 2, '--max-queue-wait', 500,
                                                '--status-listen', "127.0.0.1:$sport" ]);
    wait_until(sub { worker_pids($s->pid) == 2 }, 5);
    ok(wait_until(sub { defined metrics()->{narwhal_manager_accepting} }, 5), "the status page is up");
    is(metrics()->{narwhal_manager_accepting}, 0, 'the manager does not accept while workers are free');
    my $m0 = metrics();
    my @busy = occupy($s->port);
    ok(manager_accepting(), 'both workers stuck: the manager takes new connections');
    my @new = map { raw_connect($s->port) } 1 .. 20;
    my @r = ask_all('/', 5, @new);
    is(scalar(grep { $_->[0] == 503 } @r), 20, 'twenty new clients: twenty 503s')
        or diag explain [ map { $_->[0] } @r ];
    is(scalar(grep { $_->[2] =~ /^Retry-After: 1\r$/mi } @r), 20, '... each with Retry-After');
    my ($slowest) = sort { $b <=> $a } map { $_->[1] // 99 } @r;
    my ($fastest) = sort { $a <=> $b } map { $_->[1] // 99 } @r;
    cmp_ok($fastest, '>=', 0.45, sprintf('none before the limit (first %.3f s)', $fastest));
    cmp_ok($slowest, '<', 0.8, sprintf('all within 0.8 s (last %.3f s)', $slowest));
    my $m1 = metrics();
    cmp_ok($m1->{narwhal_manager_accepted_total} - $m0->{narwhal_manager_accepted_total}, '>=', 20,
           'the manager accepted them (narwhal_manager_accepted_total)');
    is($m1->{narwhal_shed_total} - $m0->{narwhal_shed_total}, 20, 'narwhal_shed_total counts them');
    open(my $fh, '>', $timed) or die "$timed: $!";
    my @b = map { my $r = read_response($_, 5); $r ? $r->{status} : 0 } @busy;
    is("@b", '200 200', 'the stuck requests finish');

    # The pool is free again: the workers accept directly, the manager stops.
    ok(wait_until(sub { metrics()->{narwhal_manager_accepting} == 0 }, 2), 'the manager stops accepting');
    my $m2 = metrics();
    my @again = map { raw_connect($s->port) } 1 .. 20;
    @r = ask_all('/', 5, @again);
    is(scalar(grep { $_->[0] == 200 } @r), 20, 'twenty new clients served');
    is(metrics()->{narwhal_manager_accepted_total} - $m2->{narwhal_manager_accepted_total}, 0,
       '... accepted by the workers (no hand-off on the fast path)');
};

# 2. No limit: the waiting clients are all served when the workers are
# free, none lost, and their wait is in the queue histogram.
my $part_no_limit = sub {
    local $sport = free_port();
    my ($s, @busy, $m0, $m1, @new, @r);
    $s = spawn_server(app => $APP, args => [ '--max-workers', 2,
                                             '--status-listen', "127.0.0.1:$sport" ]);
    wait_until(sub { worker_pids($s->pid) == 2 }, 5);
    my $busy_from = time;
    @busy = occupy($s->port);
    ok(manager_accepting(), q{no limit: both workers stuck, the manager takes new connections});
    $m0 = metrics();
    @new = map { raw_connect($s->port) } 1 .. 10;
    @r = ask_all('/', 8, @new);
    is(scalar(grep { $_->[0] == 200 } @r), 10, 'no limit: ten new clients all served');
    # (the first answer came after the stuck requests' 2 s)
    cmp_ok((sort { $a <=> $b } map { $_->[3] // 0 } @r)[0] - $busy_from, '>', 2, '... once the workers were free');
    read_response($_, 5) for @busy;
    $m1 = metrics();
    cmp_ok($m1->{narwhal_manager_accepted_total} - $m0->{narwhal_manager_accepted_total}, '>=', 10,
           '... through the manager');
    my $waited = $m1->{narwhal_request_queue_seconds_sum} - $m0->{narwhal_request_queue_seconds_sum};
    my $client = 0;
    $client += $_->[1] for @r;
    my $service = $m1->{narwhal_request_duration_seconds_sum} - $m0->{narwhal_request_duration_seconds_sum};
    cmp_ok(abs($waited - $client), '<', 0.1 * $client + 0.1,
           sprintf('their wait is measured: %.3f s queued, the clients waited %.3f s in all', $waited, $client));
};

# 3. A unix-socket listener and --proxy-protocol: the connections the
# manager takes keep their PROXY header's address.
my $part_unix_proxy = sub {
    local $sport = free_port();
    my ($s, @busy, $m0, @new, @r);
    my $path = tmpdir() . "/stuck.sock";
    $s = spawn_server(app => $APP, unix => $path, no_listen => 1,
                      args => [ '--max-workers', 2, '--proxy-protocol', '--max-queue-wait', 2000,
                                '--status-listen', "127.0.0.1:$sport" ]);
    wait_until(sub { worker_pids($s->pid) == 2 }, 5);
    @busy = map { raw_connect($path) } 1 .. 2;
    syswrite($_, "PROXY TCP4 192.0.2.7 192.0.2.1 4000 80\r\nGET /sleep/2 HTTP/1.1\r\nHost: x\r\n\r\n")
        for @busy;
    ok(manager_accepting(), q{unix socket: both workers stuck, the manager takes new connections})
        or do { my $m = metrics(); diag explain { map { $_ => $m->{$_} } grep { /workers|connections/ } keys %$m } };
    $m0 = metrics();
    @new = map { raw_connect($path) } 1 .. 4;
    syswrite($new[$_], "PROXY TCP4 198.51.100.$_ 192.0.2.1 5000 80\r\n") for 0 .. 3;
    @r = ask_all('/', 5, @new);
    is(scalar(grep { $_->[0] == 200 } @r), 4, 'unix socket, PROXY headers: four waiting clients served');
    is(scalar(grep { $r[$_][2] =~ /ok 198\.51\.100\.$_\n/ } 0 .. 3), 4, '... each with its PROXY address')
        or diag explain [ map { $_->[2] } @r ];
    cmp_ok(metrics()->{narwhal_manager_accepted_total} - $m0->{narwhal_manager_accepted_total}, '>=', 4,
           '... taken by the manager from the unix socket');
    read_response($_, 5) for @busy;
};

# 4. A graceful stop while the pool is stuck: the clients the manager
# took are served by the worker's drain, as they were from the listen
# queue, and quickly (a client that keeps its socket open after the
# answer does not hold the worker: the manager's read said nothing more
# had come).
my $part_stop = sub {
    my ($s, @new);
    $s = spawn_server(app => $APP, args => [ '--max-workers', 1, '--graceful-timeout', 20 ]);
    wait_until(sub { worker_pids($s->pid) == 1 }, 5);
    my $long = raw_connect($s->port);
    syswrite($long, "GET /sleep/1.5 HTTP/1.1\r\nHost: x\r\n\r\n");
    sleep 0.3;
    @new = map { raw_connect($s->port) } 1 .. 100;
    syswrite($_, "GET / HTTP/1.1\r\nHost: x\r\n\r\n") for @new;
    sleep 0.2;
    kill TERM => $s->pid;
    my (%got, %buf);
    my $sel = IO::Select->new(@new);
    my $end = time + 10;
    while (keys %got < @new && time < $end) {
        for my $h ($sel->can_read(0.2)) {
            my $n = sysread($h, $buf{$h}, 4096, length($buf{$h} // ''));
            if (($buf{$h} // '') =~ m{^HTTP/1\.1 200}) { $got{$h} = 1; $sel->remove($h) }
            elsif (!$n) { $sel->remove($h) }
        }
    }
    is(scalar keys %got, 100, 'a stop while the pool is stuck: the 100 clients the manager took are all answered');
    ok(wait_until(sub { !NarwhalTest::pid_alive($s->pid) }, 10), '... and the server exits');
};

# The parts in three processes at once (the one that times its 503s to
# 0.1 s does not run beside the one that sends 100 clients at once: that
# one comes after the unix-socket part, once the 503s are timed).
in_parallel(sub { $part_queue_wait->() },
            sub { $part_no_limit->() },
            sub { $part_unix_proxy->(); wait_until(sub { -e $timed }, 30); $part_stop->() });
done_testing();
