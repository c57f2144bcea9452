use strict;
use warnings;
use Test::More;
use Test2::IPC;    # (parts of this file run in processes of their own)
use lib 't/lib';
use IO::Select ();
use Time::HiRes qw(time sleep);
use NarwhalTest qw(spawn_server write_app wait_until manager_fallback worker_pids raw_connect
                   children_of perl_cmd root in_parallel);

# While every worker is stuck the manager takes new connections from the
# listeners itself (t/68). When it cannot (out of descriptors), the
# listener stays readable: the manager must not spin on it, trying accept
# in a loop at full CPU until a worker is free.

my @NM = manager_fallback();
plan skip_all => 'the connection manager takes them'
    if !NarwhalTest::managed();

my $APP = NarwhalTest::sleepy_app();
# /hold keeps its worker until $RELEASE exists (30 s at most): a request
# that is stuck for as long as the test needs, and no longer.
my $RELEASE = NarwhalTest::tmpdir() . '/release-hold';
my $HOLD_APP = write_app(<<"APP");
sub {
    my \$env = shift;
    if (\$env->{PATH_INFO} eq '/hold') {
        my \$end = Time::HiRes::time() + 30;
        Time::HiRes::sleep(0.02) until -e '$RELEASE' || Time::HiRes::time() > \$end;
    }
    [200, ['Content-Type' => 'text/plain'], ["ok\\n"]];
}
APP

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
my $part_emfile = sub { SKIP: {
    skip 'needs prlimit(1)', 5 unless grep { -x "$_/prlimit" } split /:/, $ENV{PATH};
    my $port = NarwhalTest::free_port();
    my $s = spawn_server(app => $APP, port => $port, command => [
        'prlimit', '--nofile=64:64', '--', perl_cmd(), root() . '/bin/narwhal',
        '--listen', "127.0.0.1:$port", '--max-workers', 1, '--max-connections', 1000,
        NarwhalTest::extra_args(), $HOLD_APP ]);
    ok(wait_until(sub { worker_pids($s->pid) == 1 && manager_pid($s->pid) }, 5), 'a worker and the manager');
    my $mgr = manager_pid($s->pid);
    my $busy = raw_connect($port);
    syswrite($busy, "GET /hold HTTP/1.1\r\nHost: x\r\n\r\n");
    sleep 0.3;
    my @clients;
    for (1 .. 700) {
        my $c = raw_connect($port) or last;
        syswrite($c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
        push @clients, $c;
    }
    cmp_ok(scalar @clients, '>=', 600, 'enough clients to fill the manager\'s descriptors');
    sleep 0.5;
    like($s->log_text, qr/the manager cannot take a connection/, 'the manager ran out of descriptors');
    my $t0 = cpu_ticks($mgr);
    sleep 1.5;
    my $used = cpu_ticks($mgr) - $t0;
    my $hz = 100;
    cmp_ok($used, '<', 0.3 * 1.5 * $hz,
           sprintf('... and does not spin meanwhile (%.2f s of CPU in 1.5 s)', $used / $hz));
    # every client is answered once the worker is free (the manager took
    # what it could, the rest waited in the listen queue)
    open(my $release, '>', $RELEASE) or die "$RELEASE: $!";
    close $release;
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
    $s->stop;
} };

# 2. Full (--max-connections) with nothing idle to close: three clients
# that sent part of a head fill the manager. A client that comes now with
# its whole request must wait in the listen queue for a worker, as it
# would if the manager did not take connections, not be accepted and
# closed (reset: its request unread) at once.
my $part_full = sub {
    my $s = spawn_server(app => $APP, args => [ '--max-workers', 1, '--max-connections', 3 ]);
    ok(wait_until(sub { worker_pids($s->pid) == 1 }, 5), 'full: a worker');
    my $busy = raw_connect($s->port);
    syswrite($busy, "GET /sleep/2 HTTP/1.1\r\nHost: x\r\n\r\n");
    sleep 0.3;
    my @partial = map { raw_connect($s->port) } 1 .. 3;
    syswrite($_, "GET /partial HTTP/1.1\r\n") for @partial;
    sleep 0.3;
    my $late = raw_connect($s->port);
    syswrite($late, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    my $r = NarwhalTest::read_response($late, 6);
    is($r && $r->{status}, 200, 'a client that comes while the manager is full is served once a worker is free');
    $s->stop;
};

# Both at once: each has its own server, and what part 1 measures is the
# manager's CPU time, not a wall-clock time.
in_parallel($part_emfile, $part_full);
done_testing();
