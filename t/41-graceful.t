use strict;
use warnings;
use Test::More;
use Test2::IPC;    # (parts of this file run in processes of their own)
use lib 't/lib';
use POSIX ();
use Time::HiRes qw(time sleep);
use NarwhalTest::Clients ();
use NarwhalTest qw(spawn_server write_app raw_connect read_response wait_until
                   worker_pids manager_fallback socket_filter_allowed in_parallel);

# A graceful stop loses nothing that has arrived: the app is not
# interrupted by the stop signal, clients waiting in the listen queue are
# served, and a parked connection whose request arrived is answered
# before it is closed. Every client here counts its answers and never
# retries.

my @NM = manager_fallback();
my $FILTER = socket_filter_allowed();

# /sleep?S sleeps S seconds with one sleep call (so a signal that reaches
# the app cuts it short) and answers how long it really slept.
my $APP = write_app(<<'APP');
use strict;
use Time::HiRes ();
sub {
    my $env = shift;
    my $slept = 0;
    if ($env->{PATH_INFO} eq '/sleep') {
        my $t0 = Time::HiRes::time();
        Time::HiRes::sleep($env->{QUERY_STRING} || 1);
        $slept = Time::HiRes::time() - $t0;
    }
    return [200, ['Content-Type' => 'text/plain'], [sprintf "pid=%d slept=%.2f\n", $$, $slept]];
}
APP

sub server { spawn_server(app => $APP, args => [ @NM, @_ ]) }

# The stops under keep-alive clients (5, 6) are what a stop's serve window
# (NW_STOP_SERVE_MS) is for: they run with the real one, not the suite's
# short one (NarwhalTest's TEST_TIMING).
my $REAL_STOP_SERVE = { NARWHAL_TEST_STOP_SERVE_MS => undef };

sub wait_workers {
    my ($s, $n) = @_;
    my @w;
    wait_until(sub { (@w = worker_pids($s->pid)) >= $n }, 10);
    return @w;
}

# How many workers the status listener at $path says are busy.
sub busy_workers {
    my ($path) = @_;
    my $c = raw_connect($path) or return -1;
    syswrite($c, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    my $r = read_response($c, 5) or return -1;
    return $r->{body} =~ /^narwhal_workers\{state="busy"\} (\d+)$/m ? $1 : -1;
}

sub send_request {
    my ($port, $path) = @_;
    my $c = raw_connect($port) or return undef;
    syswrite($c, "GET $path HTTP/1.1\r\nHost: x\r\n\r\n");
    return $c;
}

# 1. The stop signal waits for the app: a sleep in it is not cut short.
my $sec_stop_waits = sub {
    my $s = server('--max-workers', 1);
    wait_workers($s, 1);
    my $c = send_request($s->port, '/sleep?1') or die "connect: $!";
    sleep 0.3;
    kill TERM => $s->pid;
    my $r = read_response($c, 6);
    my ($slept) = ($r && $r->{body} // '') =~ /slept=([\d.]+)/;
    ok($r && $r->{status} == 200, 'TERM during a request: it is answered');
    cmp_ok($slept // 0, '>=', 0.95, 'and the app\'s sleep was not interrupted by the signal');
    ok(defined $s->wait_exit(6), 'then the server exits');
};

# 2. Requests in flight and clients in the listen queue are all answered.
my $sec_queue = sub {
    my $s = server('--max-workers', 2);
    my $port = $s->port;
    wait_workers($s, 2);
    my @busy = map { send_request($port, '/sleep?1') } 1 .. 2;
    sleep 0.3;                       # both workers inside the app
    my @queued = map { send_request($port, '/') } 1 .. 4;
    sleep 0.2;                       # in the listen queue, their requests sent
    kill TERM => $s->pid;
    my ($ok, $bad) = (0, 0);
    for my $c (@busy, @queued) {
        my $r = $c && read_response($c, 6);
        $r && $r->{status} == 200 ? $ok++ : $bad++;
    }
    is($ok, 6, 'graceful stop: 2 requests in flight and 4 queued clients: 6 answered');
    is($bad, 0, 'none reset or lost');
    ok(defined $s->wait_exit(6), 'then the server exits');
};

# 3. A parked connection whose next request arrived with the stop signal
# is answered (with Connection: close), not closed under it. The worker is
# stopped (SIGSTOP) so that the bytes and the signal are both waiting when
# it runs again: the order a busy worker sees them in.
my $sec_parked = sub { SKIP: {
    skip 'parking needs the manager', 4 if !NarwhalTest::managed();
    my $s = server('--max-workers', 1, '--keepalive-wait', 30);
    my ($w) = wait_workers($s, 1);
    my $c = send_request($s->port, '/') or die "connect: $!";
    my $first = read_response($c, 5);
    ok($first && $first->{status} == 200, 'a keep-alive client is served, and parked');
    sleep 0.2;    # the worker is done with it and waits (stopped while still out serving,
                  # its park watcher would hand the connection to the manager on CONT)
    kill STOP => $w;
    wait_until(sub { open(my $f, '<', "/proc/$w/stat") or return 0; (<$f> // '') =~ /^\d+ \(.*?\) T/ }, 5)
        or diag 'the worker did not stop';
    syswrite($c, "GET /again HTTP/1.1\r\nHost: x\r\n\r\n");
    kill TERM => $s->pid;
    # the master has signalled the worker: the TERM waits, pending, in the
    # stopped process (/proc's ShdPnd mask; TERM is bit 15)
    ok(wait_until(sub {
        open(my $f, '<', "/proc/$w/status") or return 0;
        my ($pending) = join('', <$f>) =~ /^ShdPnd:\s*([0-9a-f]+)/m or return 0;
        return hex(substr($pending, -8)) & (1 << (POSIX::SIGTERM() - 1));
    }, 5), 'the master signals the stopped worker');
    kill CONT => $w;
    my $r = read_response($c, 5);
    ok($r && $r->{status} == 200, 'its request that arrived with the stop is answered');
    is($r && $r->{headers}{connection}, 'close', 'with Connection: close') or diag explain $r;
    $s->wait_exit(6);
}};

# 4. A stop that arrives while the server starts (its listeners are open,
# the app is still loading in the master) is a graceful stop like any
# other: the client that connected meanwhile is answered, the server exits
# 0 and leaves no process behind. The master used to die of the signal
# (status 15) with its manager started; a loaded machine hit it in t/68.
my $sec_starting = sub {
    my $slow_app = write_app(<<'APP');
Time::HiRes::sleep(1);    # a slow start-up: the app loads for 1 s
sub { [200, ['Content-Type' => 'text/plain'], ["loaded\n"]] };
APP
    my $s = spawn_server(app => $slow_app, args => [ '--max-workers', 1, @NM ]);
    my $c = send_request($s->port, '/') or die "connect: $!";
    sleep 0.3;
    my @children = NarwhalTest::children_of($s->pid);    # the manager, by now
    kill TERM => $s->pid;
    my $r = read_response($c, 10);
    ok($r && $r->{status} == 200 && $r->{body} eq "loaded\n",
       'a TERM during start-up: the client that connected meanwhile is answered')
        or diag($r ? "status $r->{status}" : 'no response');
    is($s->wait_exit(10), 0, '... and the server exits 0');
    my @left = grep { kill 0, $_ } @children;
    ok(!@left, '... leaving no process behind (' . scalar(@children) . ' child(ren) at the stop)')
        or diag "still running: @left";
};

# 5. Keep-alive clients under a stop: each gets Connection: close and
# opens a new connection at once. One that the kernel completed after the
# workers' last accept used to be reset when the last listener closed
# (one per client, every stop: 10 of 10); now the listeners take no new
# handshake once the stop begins, so such a client is refused before it
# sends anything. With INT to the whole group (Ctrl-C) every process gets
# the signal at once, and a worker could be gone before the master had
# seen its own: the worker makes the listeners refuse too when the stop
# was not the master's, and watches them for the 200 ms of its drain.
my $sec_keepalive = sub {
    my ($how) = @_;
    my $dir = NarwhalTest::tmpdir();
    my $s = spawn_server(app => $APP, args => [ '--max-workers', 4, @NM ], env => $REAL_STOP_SERVE,
                         child_setup => sub { POSIX::setsid() });
    my @clients = NarwhalTest::Clients::start_clients($dir, $s->port, 10, '/', 10, 0, up => 20);
    # (all of them at work: 20 answers each, 200 requests before the stop)
    NarwhalTest::Clients::wait_up(10, @clients) or diag 'the clients are not all at work';
    kill $how =~ /TERM/ ? ('TERM', $s->pid) : ('INT', -$s->pid);
    is($s->wait_exit(10), 0, "$how under 10 keep-alive clients: exit 0");
    my $t = NarwhalTest::Clients::finish(@clients);    # (the server is gone: nothing more to count)
    my $counts = "$t->{sent} sent, $t->{answered} answered, $t->{failed} failed, $t->{reset} reset";
    SKIP: {
        # (without the filter the queue is shortened: a client may
        # still be reset in the stop's last instant; measured 2 a stop)
        skip "this kernel refuses socket filters to this user ($counts)", 2
            unless $FILTER || $> == 0;
        ok($t->{sent} > 100 && !$t->{failed} && !$t->{reset_new},
           "... no new connection was reset after sending its request ($counts)");
        is($t->{answered}, $t->{sent}, '... and every request sent was answered');
    }
};

# 5b. --graceful-timeout is the limit: 4 requests running (each asleep for
# 5 s), 4 more queued and keep-alive clients hammering; the master has
# killed what is left and is gone within the timeout and 0.2 s.
my $sec_timeout = sub {
    my $dir = NarwhalTest::tmpdir();
    my $managed = NarwhalTest::managed();
    my $sock = "$dir/timeout-status.sock";
    my $s = server('--max-workers', 4, '--graceful-timeout', 1, ($managed ? ('--status-listen', $sock) : ()));
    wait_workers($s, 4);
    my @slow = map { send_request($s->port, '/sleep?5') } 1 .. 8;
    my @clients = NarwhalTest::Clients::start_clients($dir, $s->port, 4, '/', 3);
    # (the four workers in the app, which the status listener shows;
    # without the manager there is none: 0.5 s)
    if ($managed) {
        wait_until(sub { busy_workers($sock) == 4 }, 5) or diag 'the workers are not all busy';
    } else {
        sleep 0.5;
    }
    my $t0 = time;
    kill TERM => $s->pid;
    my $status = $s->wait_exit(5);
    my $took = time - $t0;
    NarwhalTest::Clients::finish(@clients);
    is($status, 0, '--graceful-timeout 1 with 4 requests running and 4 queued: exit 0');
    ok($took < 1.2, sprintf('... the master is gone %.2f s after TERM (limit 1.2 s)', $took));
};

# 6. The same on a unix-socket listener, without and with a drain (every
# answer in it says Connection: close: the clients reconnect throughout,
# thousands of times in 0.5 s). The kernel has no SYN to drop there, so
# the listener kept completing connections until the last worker closed
# it, and those queued then were reset (10 of 10 clients, one each, every
# stop). Now the stop shuts the listener for reading: a new connect is
# refused, what is queued is served.
my $sec_unix = sub {
    my ($drain) = @_;
    my $dir = NarwhalTest::tmpdir();
    my $sock = "$dir/graceful-$drain.sock";
    my $s = spawn_server(app => $APP, unix => $sock, env => $REAL_STOP_SERVE,
                         args => [ '--max-workers', 4, '--drain-delay', $drain, @NM ]);
    my @clients = NarwhalTest::Clients::start_clients($dir, $sock, 10, '/', 10 + $drain, 0, up => 20);
    # (all of them at work: 20 answers each, 200 requests before the stop)
    NarwhalTest::Clients::wait_up(10, @clients) or diag 'the clients are not all at work';
    kill TERM => $s->pid;
    is($s->wait_exit(10), 0, "unix socket, --drain-delay $drain, TERM under 10 keep-alive clients: exit 0");
    my $t = NarwhalTest::Clients::finish(@clients);    # (the server is gone: nothing more to count)
    my $counts = "$t->{sent} sent, $t->{answered} answered, $t->{failed} failed, $t->{reset} reset";
    ok($t->{sent} > 100 && !$t->{failed} && !$t->{reset},
       "... no connection was reset ($counts)");
    is($t->{answered}, $t->{sent}, '... and every request sent was answered');
};

# A drain keeps every promise the server made: a connection idle when
# the stop signal came is closed at its --keepalive-timeout, as any idle
# one is, not held open until the drain ends. (While the server closed,
# expired parked connections were left parked: one was closed 4.4 s after
# its answer, at the end of a 4 s drain, with --keepalive-timeout 2.)
my $sec_drain_keepalive = sub {
    my $s = server('--keepalive-timeout', 2, '--drain-delay', 4);
    my $c = raw_connect($s->port);
    syswrite($c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    is(read_response($c, 5)->{status}, 200, 'a keep-alive answer');
    my $t0 = time;
    kill TERM => $s->pid;
    my $n = sysread($c, my $buf, 100);   # (blocks until the server closes it)
    my $idle = time - $t0;
    ok(defined $n && $n == 0, 'the idle connection is closed, with nothing sent');
    cmp_ok($idle, '<', 3.2, sprintf('... at its keep-alive timeout (after %.2f s), inside the 4 s drain', $idle));
    cmp_ok($idle, '>', 1.5, '... not before it');
    $s->stop;
};

# Every part at once, each in a process of its own (they wait for
# sleeping requests, loading apps and stops), but the graceful timeout's:
# it times the master to 0.2 s, so it runs alone afterwards, with the
# machine not kept busy by the others' clients.
in_parallel(
    sub { $sec_keepalive->('TERM to the master') },
    sub { $sec_keepalive->('INT to the process group') },
    sub { $sec_unix->(0) },
    sub { $sec_unix->(0.5) },
    sub { $sec_stop_waits->() },
    sub { $sec_queue->() },
    sub { $sec_starting->() },
    sub { $sec_parked->() },
    sub { $sec_drain_keepalive->() },
);
$sec_timeout->();

done_testing;
