use strict;
use warnings;
use Test::More;
use Test2::IPC;    # (parts of this file run in processes of their own)
use lib 't/lib';
use IO::Select ();
use Time::HiRes qw(time sleep);
use NarwhalTest qw(spawn_server write_app wait_until manager_fallback worker_pids raw_connect
                   children_of perl_cmd root in_parallel metrics_of missing);

# While every worker is stuck the manager takes new connections from the
# listeners itself (t/70). When it cannot (out of descriptors), the
# listener stays readable: the manager must not spin on it, trying accept
# in a loop at full CPU until a worker is free.

my @NM = manager_fallback();
plan skip_all => 'the connection manager takes them'
    if !NarwhalTest::managed();

# /hold/NAME keeps its worker until $DIR/release-NAME exists (30 s at
# most): a request that is stuck for as long as the test needs, and no
# longer. It makes $DIR/held-NAME first: its worker is stuck from then on.
my $DIR = NarwhalTest::tmpdir();
my $HOLD_APP = write_app(<<"APP");
sub {
    my \$env = shift;
    if (\$env->{PATH_INFO} =~ m{^/hold/(\\w+)}) {
        my (\$held, \$release) = ("$DIR/held-\$1", "$DIR/release-\$1");
        open(my \$fh, '>', \$held) or die "\$held: \$!";
        my \$end = Time::HiRes::time() + 30;
        Time::HiRes::sleep(0.02) until -e \$release || Time::HiRes::time() > \$end;
    }
    [200, ['Content-Type' => 'text/plain'], ["ok\\n"]];
}
APP

# Send /hold/NAME on a new connection and wait until its worker is stuck
# on it; returns the connection.
sub hold {
    my ($port, $name) = @_;
    my $c = raw_connect($port);
    syswrite($c, "GET /hold/$name HTTP/1.1\r\nHost: x\r\n\r\n");
    ok(wait_until(sub { -e "$DIR/held-$name" }, 5), "$name: the only worker is stuck");
    return $c;
}

sub release {
    my ($name) = @_;
    open(my $fh, '>', "$DIR/release-$name") or die "$DIR/release-$name: $!";
}

sub cpu_ticks {
    my ($pid) = @_;
    open(my $fh, '<', "/proc/$pid/stat") or return;
    my $stat = <$fh>;
    $stat =~ s/^.*\)\s+//s;
    my @f = split ' ', $stat;
    return $f[11] + $f[12];     # utime + stime
}

sub manager_pid {
    my ($master) = @_;
    my ($m) = grep {
        my $fh;
        open($fh, '<', "/proc/$_/cmdline") && (<$fh> // '') =~ /manager/;
    } children_of($master);
    return $m;
}

# 1. Out of descriptors: an open-file limit of 64 for the server, and a
# --max-connections above it, so that once the serve queue is full (a few
# hundred connections in flight) the manager's accept fails EMFILE.
# As root: for any other user the kernel refuses more descriptors in
# flight on unix sockets than the sender's open-file limit, so a server
# limited to 64 meets that first, on the serve queue and in the
# hand-offs, and not the limit this part is about (the manager's share
# of that: t/c/test_manager.c, "in_flight").
my $part_emfile = sub { SKIP: {
    skip 'needs prlimit(1)', 6 unless grep { -x "$_/prlimit" } split /:/, $ENV{PATH};
    missing('not root: a 64-descriptor server meets the limit on descriptors in flight first', 6) if $>;
    my $port = NarwhalTest::free_port();
    my $s = spawn_server(app => $HOLD_APP, port => $port, command => [
        'prlimit', '--nofile=64:64', '--', perl_cmd(), root() . '/bin/narwhal',
        '--listen', "127.0.0.1:$port", '--max-workers', 1, '--max-connections', 1000,
        NarwhalTest::extra_args(), $HOLD_APP ]);
    ok(wait_until(sub { worker_pids($s->pid) == 1 && manager_pid($s->pid) }, 5), 'a worker and the manager');
    my $mgr = manager_pid($s->pid);
    my $busy = hold($port, 'emfile');
    my @clients;
    for (1 .. 700) {
        my $c = raw_connect($port) or last;
        syswrite($c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
        push @clients, $c;
    }
    cmp_ok(scalar @clients, '>=', 600, 'enough clients to fill the manager\'s descriptors');
    wait_until(sub { $s->log_text =~ /the manager cannot take a connection/ }, 5);
    like($s->log_text, qr/the manager cannot take a connection/, 'the manager ran out of descriptors');
    # A manager that spins takes a whole core; one that waits for its next
    # look at the pool (every 100 ms) takes next to nothing. The limit is
    # 30% of the time watched, however long: 0.5 s (five looks) tells
    # them apart as well as a longer watch.
    my $t0 = cpu_ticks($mgr);
    sleep 0.5;
    my $used = cpu_ticks($mgr) - $t0;
    my $hz = 100;
    cmp_ok($used, '<', 0.3 * 0.5 * $hz,
           sprintf('... and does not spin meanwhile (%.2f s of CPU in 0.5 s)', $used / $hz));
    # every client is answered once the worker is free (the manager took
    # what it could, the rest waited in the listen queue)
    release('emfile');
    my ($answered, %buf) = (0);
    my $sel = IO::Select->new(@clients);
    my $end = time + 30;
    while ($sel->count && time < $end) {
        for my $h ($sel->can_read(0.5)) {
            my $n = sysread($h, $buf{$h}, 4096, length($buf{$h} // ''));
            if (($buf{$h} // '') =~ m{^HTTP/1\.1 200 .*\r\n\r\nok\n}s) {
                $answered++;
                $sel->remove($h);
            } elsif (!$n) {
                $sel->remove($h);
            }
        }
    }
    is($answered, scalar @clients, 'every client is answered');
    # (the clients close first: the stop need not linger for them)
    $_->close for $busy, @clients;
    $s->stop;
} };

# 2. Full (--max-connections) with nothing idle to close: three clients
# that sent part of a head fill the manager. A client that comes now with
# its whole request must wait in the listen queue for a worker, as it
# would if the manager did not take connections, not be accepted and
# closed (reset: its request unread) at once.
my $part_full = sub {
    my $sport = NarwhalTest::free_port();    # (the status pages say where the clients are)
    my $s = spawn_server(app => $HOLD_APP, args => [ '--max-workers', 1, '--max-connections', 3,
                                                     '--status-listen', "127.0.0.1:$sport" ]);
    ok(wait_until(sub { worker_pids($s->pid) == 1 }, 5), 'full: a worker');
    my $busy = hold($s->port, 'full');
    my @partial = map { raw_connect($s->port) } 1 .. 3;
    syswrite($_, "GET /partial HTTP/1.1\r\n") for @partial;
    ok(wait_until(sub { (metrics_of($sport)->{'narwhal_connections{state="reading"}'} // 0) == 3 }, 5),
       'full: the manager reads the three partial heads');
    my $late = raw_connect($s->port);
    syswrite($late, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    my $queue = 'narwhal_listen_queue_length{listener="127.0.0.1:' . $s->port . '"}';
    ok(wait_until(sub { (metrics_of($sport)->{$queue} // 0) == 1 }, 5),
       'full: the next client waits in the listen queue');
    # A manager that would take it (and close it, full) does so at its next
    # look at the pool, 100 ms after the last: the worker stays stuck for
    # five of those.
    sleep 0.5;
    release('full');
    my $r = NarwhalTest::read_response($late, 6);
    is($r && $r->{status}, 200, 'a client that comes while the manager is full is served once a worker is free');
    # (the clients close first: the stop need not linger for them)
    $_->close for $busy, @partial, $late;
    $s->stop;
};

# Both at once: each has its own server, and what part 1 measures is the
# manager's CPU time, not a wall-clock time.
in_parallel($part_emfile, $part_full);
done_testing();
