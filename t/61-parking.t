use strict;
use warnings;
use Test::More;
use Test2::IPC;    # (parts of this file run in processes of their own)
use Time::HiRes ();
use IO::Select ();
use IO::Socket::UNIX ();
use lib 't/lib';
use NarwhalTest qw(echo_app spawn_server spawn_servers raw_connect read_response read_until_close
                   wait_until in_background metrics_of);

# Parking: a worker keeps a connection it just served in its own epoll set
# for --keepalive-wait, serving other work meanwhile, then hands it to the
# manager. Where a connection lives is observable: one parked in a worker
# dies with that worker, one held by the manager outlives it.

plan skip_all => 'the manager is switched off for this run'
    if !NarwhalTest::managed();

my $app = echo_app();
my (@parts, @timed);    # (the subtests, each with its own server: run at the end)

my $H = "Host: t\r\n";

sub request_on {
    my ($s, $path) = @_;
    syswrite($s, "GET $path HTTP/1.1\r\n$H\r\n") or return undef;
    return read_response($s, 5);
}

sub pid_of { ($_[0] && $_[0]{body} =~ /pid=(\d+)/)[0] }

# A one-worker server with these arguments (spawn_server's, for spawn_servers).
sub spec {
    my (@args) = @_;
    return { app => $app, args => [ '--max-workers' => 1, '--keepalive-timeout' => 30, @args ] };
}

sub server { spawn_server(%{ spec(@_) }) }

# timed(spec(...), $name, sub { my ($srv) = @_; ... }): a subtest that
# orders its bytes against a 30 ms request with 10 ms pauses. It runs
# alone, after the others, on a server started before them (see the end).
sub timed { push @timed, [@_] }

# Kill the only worker and wait for its replacement to answer.
sub replace_worker {
    my ($srv, $pid) = @_;
    kill KILL => $pid;
    wait_until(sub { !kill(0, $pid) }, 5);
    return wait_until(sub {
        my $s = raw_connect($srv->port) or return 0;
        my $r = request_on($s, '/probe');
        return $r && pid_of($r) != $pid;
    }, 10);
}

push @parts, sub { subtest 'a parked connection does not hold the worker' => sub {
    my $srv = server('--keepalive-wait' => 5);
    my $a = raw_connect($srv->port);
    my $r1 = request_on($a, '/a1');
    ok($r1 && $r1->{status} == 200, 'first client served; its connection is now parked');
    my $t0 = Time::HiRes::time();
    my @others = map { my $s = raw_connect($srv->port); request_on($s, "/other$_") } 1 .. 5;
    is(scalar(grep { $_ && $_->{status} == 200 } @others), 5, 'the only worker serves other clients');
    ok(Time::HiRes::time() - $t0 < 1, 'at once');
    my $r2 = request_on($a, '/a2');
    like($r2 && $r2->{body}, qr{path=/a2}, 'the parked connection is served again');
    is(pid_of($r2), pid_of($r1), 'by the worker that parked it');
} };

push @parts, sub { subtest 'a parked connection closes at --keepalive-timeout, not --keepalive-wait' => sub {
    # (a worker may park a connection for longer than the client may stay
    # idle: the timeout still holds)
    my $srv = server('--keepalive-timeout' => 0.5, '--keepalive-wait' => 3);
    my $a = raw_connect($srv->port);
    ok(request_on($a, '/idle'), 'served; its connection is parked');
    my $t0 = Time::HiRes::time();
    is(NarwhalTest::read_until_close($a, 5), '', 'closed with nothing more said');
    my $idle = Time::HiRes::time() - $t0;
    cmp_ok($idle, '>=', 0.45, sprintf('not before --keepalive-timeout (%.2f s)', $idle));
    cmp_ok($idle, '<', 1.5, '... and well before --keepalive-wait (3 s)');
} };

# A server with its status pages, which say where a connection is; returns
# it and a reader of its metrics.
sub server_with_status {
    my (@args) = @_;
    my $status = NarwhalTest::free_port();
    my $srv = server(@args, '--status-listen' => "127.0.0.1:$status");
    return ($srv, sub { metrics_of($status)->{ $_[0] } // 0 });
}

push @parts, sub { subtest 'parked in the worker, then held by the manager: parked' => sub {
    my ($srv, $metric) = server_with_status('--keepalive-wait' => 5);
    my $a = raw_connect($srv->port);
    my $r = request_on($a, '/parked');
    # parked, with a copy in the manager's custody (or, should a slow
    # machine have paused parking, with the manager itself); well within
    # --keepalive-wait
    wait_until(sub { $metric->('narwhal_custody_connections') == 1
                     || $metric->('narwhal_connections{state="idle"}') == 1 }, 5);
    ok(replace_worker($srv, pid_of($r)), 'worker killed while the connection was parked');
    my $kept = request_on($a, '/still-there');
    like($kept && $kept->{body}, qr{path=/still-there},
         'a connection parked in a worker outlives it (the manager held a copy: custody)');
} };

push @parts, sub { subtest 'parked in the worker, then held by the manager: held' => sub {
    my ($srv, $metric) = server_with_status('--keepalive-wait' => 0.3);
    my $b = raw_connect($srv->port);
    my $r = request_on($b, '/quiet');
    # past --keepalive-wait: handed to the manager
    ok(wait_until(sub { $metric->('narwhal_connections{state="idle"}') == 1
                        && $metric->('narwhal_connections{state="parked"}') == 0 }, 5),
       'after --keepalive-wait the connection is idle in the manager');
    ok(replace_worker($srv, pid_of($r)), 'worker killed after --keepalive-wait');
    my $r2 = request_on($b, '/after');
    like($r2 && $r2->{body}, qr{path=/after}, 'the connection was with the manager and lives on');
    isnt(pid_of($r2), pid_of($r), 'served by the new worker');
} };

timed(spec('--keepalive-wait' => 3, '--worker-quantum' => 1),
      'a parked connection whose request arrives during another is not forgotten' => sub {
    my ($srv) = @_;
    # The quantum check looks for waiting work right after a response; it
    # must note the parked connection's (one-shot) event, not swallow it.
    my $b = raw_connect($srv->port);
    request_on($b, '/b1');                      # b is parked now
    my $a = raw_connect($srv->port);
    syswrite($a, "GET /sleep/0.03 HTTP/1.1\r\n$H\r\n");
    Time::HiRes::sleep(0.01);
    my $t0 = Time::HiRes::time();
    my $rb = request_on($b, '/b2');             # arrives while a's request runs
    my $took = Time::HiRes::time() - $t0;
    like($rb && $rb->{body}, qr{path=/b2}, 'the parked connection is served');
    ok($took < 1, sprintf('promptly (%.3fs), not after --keepalive-wait', $took));
    ok(read_response($a, 5), 'the other request finished too');
});

# Parked connections are watched edge-triggered, and the watch stays in
# place while the connection is served: bytes that arrive meanwhile, or
# that the last read did not reach, must still bring it back at once.
timed(spec('--keepalive-wait' => 3),
      'the next request sent while its connection is being served' => sub {
    my ($srv) = @_;
    my $c = raw_connect($srv->port);
    request_on($c, '/c1');                      # parked, then taken again below
    # not 50 ms or more: a slow request (two pause parking)
    syswrite($c, "GET /sleep/0.04 HTTP/1.1\r\n$H\r\n");
    Time::HiRes::sleep(0.01);                   # the app is sleeping on it now
    my $t0 = Time::HiRes::time();
    syswrite($c, "GET /c3 HTTP/1.1\r\n$H\r\n");
    my $r2 = read_response($c, 5);
    my $r3 = read_response($c, 5);
    my $took = Time::HiRes::time() - $t0;
    like($r2 && $r2->{body}, qr{path=/sleep}, 'the slow request answered');
    like($r3 && $r3->{body}, qr{path=/c3}, 'the one sent during it answered');
    ok($took < 1.5, sprintf('promptly (%.3fs), not after --keepalive-wait', $took));
});

timed(spec('--keepalive-wait' => 3),
      'a request left in the socket behind a body' => sub {
    my ($srv) = @_;
    my $c = raw_connect($srv->port);
    request_on($c, '/d1');                      # c is parked
    # While the worker is busy with another client, c gets a POST whose
    # body is bigger than the first read and the next request, all at
    # once: the body's last read asks for exactly what is left of it and
    # fills up, the next request stays in the socket, and no byte arrives
    # after the worker took c.
    my $a = raw_connect($srv->port);
    syswrite($a, "GET /sleep/0.03 HTTP/1.1\r\n$H\r\n");
    Time::HiRes::sleep(0.005);
    my $body = 'x' x 40_000;
    my $t0 = Time::HiRes::time();
    syswrite($c, "POST /d2 HTTP/1.1\r\n${H}Content-Length: " . length($body) . "\r\n\r\n$body"
               . "GET /d3 HTTP/1.1\r\n$H\r\n");
    my $r2 = read_response($c, 5);
    my $r3 = read_response($c, 5);
    my $took = Time::HiRes::time() - $t0;
    like($r2 && $r2->{body}, qr{path=/d2}, 'the POST answered');
    like($r3 && $r3->{body}, qr{path=/d3}, 'the request behind it answered');
    ok($took < 1.5, sprintf('promptly (%.3fs), not after --keepalive-wait', $took));
    ok(read_response($a, 5), 'the other client answered too');
});

timed(spec('--keepalive-wait' => 3),
      'a FIN that comes with the last request' => sub {
    my ($srv) = @_;
    # The client sends its last request and shuts down its side at once
    # (nc -N does): one edge for both, and the read that takes the request
    # is short. The FIN must still be seen at once, not after the wait.
    my $c = raw_connect($srv->port);
    request_on($c, '/c1');                          # c is parked
    my $d = raw_connect($srv->port);
    syswrite($d, "GET /sleep/0.03 HTTP/1.1\r\n$H\r\n");   # keeps the only worker busy
    Time::HiRes::sleep(0.01);
    syswrite($c, "GET /c2 HTTP/1.1\r\n$H\r\n");
    shutdown($c, 1);                                # request and FIN together
    my $r = read_response($c, 5);
    like($r && $r->{body}, qr{path=/c2}, 'the last request answered');
    my $t0 = Time::HiRes::time();
    is(read_until_close($c, 10), '', 'then the server closes');
    my $took = Time::HiRes::time() - $t0;
    ok($took < 1, sprintf('promptly after the client closed (%.3fs), not after --keepalive-wait', $took));
    ok(read_response($d, 5), 'the other client answered');
});

timed({ %{ spec('--keepalive-wait' => 3, '--worker-quantum' => 2) },
        env => { NARWHAL_TEST_MANAGER_STATS_MS => 50 } },
      'a lone pipelining client is not counted as others waiting' => sub {
    my ($srv) = @_;
    # After --worker-quantum pipelined requests the worker lets others in
    # only when others wait; the served connection's own new bytes are not
    # others. A hand-off would show in the manager's counts (sent to the
    # master every 50 ms here, not once a second: NARWHAL_TEST_MANAGER_STATS_MS;
    # USR2 logs them).
    my $c = raw_connect($srv->port);
    request_on($c, '/c1');
    Time::HiRes::sleep(0.05);
    syswrite($c, "GET /sleep/0.03 HTTP/1.1\r\n$H\r\nGET /a HTTP/1.1\r\n$H\r\nGET /b HTTP/1.1\r\n$H\r\n");
    Time::HiRes::sleep(0.01);
    syswrite($c, "GET /d HTTP/1.1\r\n$H\r\n");     # arrives while /sleep runs
    my @r = map { read_response($c, 5) } 1 .. 4;
    is(scalar(grep { $_ && $_->{status} == 200 } @r), 4, 'all four answered');
    Time::HiRes::sleep(0.3);    # a fresh manager count: sent within 50 ms, read by the
                                # master at its next look (MANAGE_TICK: 50 ms for a test
                                # server), three times over
    my $before = length $srv->log_text;
    kill USR2 => $srv->pid;
    my $line;
    wait_until(sub { ($line) = substr($srv->log_text, $before) =~ /(manager .*received=\d+.*)/; $line }, 5);
    my ($received) = ($line // '') =~ /received=(\d+)/;
    is($received, 0, 'never handed to the manager') or diag($line // 'no manager counts');
});

push @parts, sub { subtest 'a connection let go is gone while the worker serves others' => sub {
    # The worker goes on from one connection to the next; nothing may keep
    # a connection it handed off alive meanwhile: here, the socket dup that
    # psgix.io made must close when the manager closes the connection.
    my $io_app = <<'APP';
sub {
    my $env = shift;
    my $io = $env->{'psgix.io'} if $env->{PATH_INFO} eq '/io';   # just a look
    [200, ['Content-Type' => 'text/plain'], ["path=$env->{PATH_INFO}"]];
}
APP
    my $srv = spawn_server(app => $io_app, args => [ '--max-workers' => 1, '--keepalive-timeout' => 1,
                                                     '--keepalive-wait' => 0.2 ]);
    my $x = raw_connect($srv->port);
    syswrite($x, "GET /io HTTP/1.1\r\n$H\r\n");
    ok(read_response($x, 5), 'a request that looked at psgix.io');
    my $y = raw_connect($srv->port);
    my $t0 = Time::HiRes::time();
    my ($closed_at, $served) = (undef, 0);
    my $sel = IO::Select->new($x);
    while (Time::HiRes::time() - $t0 < 3.5) {     # another client keeps the worker busy
        syswrite($y, "GET /y HTTP/1.1\r\n$H\r\n");
        $served++ if read_response($y, 5);
        if (!defined $closed_at && $sel->can_read(0.1)) {
            my $n = sysread($x, my $buf, 4096);
            $closed_at = Time::HiRes::time() - $t0 if defined $n && $n == 0;
        }
        last if defined $closed_at;
    }
    ok($served > 3, "the other client was served ($served requests)");
    ok(defined $closed_at && $closed_at < 2.5,
       sprintf('closed by the keep-alive timeout (%s)',
               defined $closed_at ? sprintf('%.2fs', $closed_at) : 'still open after 3.5s'));
} };

# (the longest part, with its 1.5 s request: in a process of its own)
my $slow_part = sub { subtest 'parked connections do not wait behind a slow request' => sub {
    # Two connections parked in the same worker; one starts a slow request.
    # The other's next request must not wait for it: the park watcher hands
    # the parked connections to the manager and the other worker serves it.
    my $srv = server('--max-workers' => 2, '--keepalive-wait' => 5);
    my (%by_pid, $pair);
    for my $k (1 .. 6) {
        my $s = raw_connect($srv->port);
        my $pid = pid_of(request_on($s, "/first$k")) or next;
        push @{ $by_pid{$pid} }, $s;
        if (@{ $by_pid{$pid} } == 2) { $pair = $pid; last }
    }
    ok($pair, 'two connections parked in one worker') or return;
    my ($slow, $other) = @{ $by_pid{$pair} };
    # (1.5 s: one that waited for it would take 1.3 s or more)
    syswrite($slow, "GET /sleep/1.5 HTTP/1.1\r\n$H\r\n");
    Time::HiRes::sleep(0.2);                    # the slow request is running
    my $t0 = Time::HiRes::time();
    my $r = request_on($other, '/other');
    my $took = Time::HiRes::time() - $t0;
    like($r && $r->{body}, qr{path=/other}, 'the other parked connection is answered');
    ok($took < 1, sprintf('without waiting for the slow request (%.3fs)', $took));
    isnt(pid_of($r), $pair, 'by the other worker');
    my $rs = read_response($slow, 5);
    like($rs && $rs->{body}, qr{path=/sleep}, 'the slow request finishes too');
    my $again = request_on($slow, '/after');
    like($again && $again->{body}, qr{path=/after}, 'and its connection serves on');
} };

push @parts, sub { subtest 'an app that forks' => sub {
    # A child forked by the app has no park watcher thread; its exit (with
    # Perl's global destruction, which destroys the acceptor too) must not
    # wait for one or for its lock.
    my $fork_app = <<'APP';
sub {
    my $env = shift;
    my $pid = fork;
    exit 0 if defined $pid && !$pid;     # the child: a normal exit
    waitpid($pid, 0) if $pid;
    [200, ['Content-Type' => 'text/plain'], ["forked=" . ($pid ? 1 : 0) . " status=$?"]];
}
APP
    my $srv = spawn_server(app => $fork_app, args => [ '--max-workers' => 1, '--keepalive-wait' => 5 ]);
    my $c = raw_connect($srv->port);
    for my $k (1 .. 3) {
        my $t0 = Time::HiRes::time();
        my $r = request_on($c, "/f$k");
        like($r && $r->{body}, qr{forked=1 status=0}, "request $k: the app forked and its child exited");
        ok(Time::HiRes::time() - $t0 < 3, "request $k: promptly");
    }
} };

push @parts, sub { subtest 'an often slow app pauses parking' => sub {
    # Two requests slower than NW_PARK_SLOW_REQUEST_MS within
    # NW_PARK_PAUSE_MS: after the second the connection goes to the
    # manager at once instead of being parked.
    my ($srv, $metric) = server_with_status('--keepalive-wait' => 5);
    my $to_manager = sub { $metric->('narwhal_handoffs_total{direction="to_manager"}') };
    my $a = raw_connect($srv->port);
    my $r1 = request_on($a, '/sleep/0.2');
    is($to_manager->(), 0, 'after one slow request: parked, no hand-off');
    my $r2 = request_on($a, '/sleep/0.2');
    ok(wait_until(sub { $to_manager->() >= 1 }, 3), 'after the second: handed to the manager');
    my $r3 = request_on($a, '/after-slow');
    like($r3 && $r3->{body}, qr{path=/after-slow}, 'and served from there');
} };

push @parts, sub { subtest 'a lone slow request does not pause parking' => sub {
    # One slow request (a stalled machine, a rare slow page) leaves
    # parking on: the next quick requests stay in their worker, with no
    # hand-off to the manager.
    my $status = NarwhalTest::free_port();
    my $srv = server('--keepalive-wait' => 5, '--status-listen' => "127.0.0.1:$status");
    my $a = raw_connect($srv->port);
    my $r = request_on($a, '/sleep/0.2');
    my @quick = map { request_on($a, "/quick$_") } 1 .. 5;
    is(scalar(grep { pid_of($_) == pid_of($r) } @quick), 5, 'the next five served by the same worker');
    my $m = (NarwhalTest::http_get($status, '/metrics') // {})->{content} // '';
    my ($to_manager) = $m =~ /^narwhal_handoffs_total\{direction="to_manager"\} (\d+)/m;
    is($to_manager, 0, 'none of them went through the manager');
} };

push @parts, sub { subtest 'recycling a worker keeps its connections open' => sub {
    my $srv = server('--max-reqs-per-child' => 3, '--min-worker-lifetime' => 0, '--keepalive-wait' => 0.5);
    my $s = raw_connect($srv->port);
    my @res = map { request_on($s, "/r$_") } 1 .. 8;
    is(scalar(grep { $_ && $_->{status} == 200 } @res), 8, '8 requests on one connection');
    is(scalar(grep { ($_->{headers}{connection} // '') =~ /close/i } grep { $_ } @res), 0,
       'none of them closes it');
    my %pids = map { (pid_of($_) // 0) => 1 } @res;
    ok(keys(%pids) >= 3, 'although the worker was replaced (' . join(',', sort keys %pids) . ')');
    my %ports = map { (($_ && $_->{body} =~ /port=(\d+)/)[0] // 0) => 1 } @res;
    is(scalar(keys %ports), 1, 'same client port throughout: one connection');
} };

push @parts, sub { subtest 'a recycled worker gives its connections to the other workers' => sub {
    # Retirement by adoption (DESIGN.md, "Retirement"): a worker leaving
    # at --max-reqs-per-child passes its parked connections, and the one
    # it served last, to the other workers through the adopt queue. They
    # used to go to the manager one by one, a round trip each.
    my $status = NarwhalTest::free_port();
    my $srv = spawn_server(app => $app,
                           args => [ '--max-workers' => 2, '--keepalive-wait' => 5,
                                     '--keepalive-timeout' => 30, '--max-reqs-per-child' => 15, '--min-worker-lifetime' => 0,
                                     '--status-listen' => "127.0.0.1:$status" ]);
    my @c = map { raw_connect($srv->port) } 1 .. 8;
    my (@res, %pids);
    for my $round (1 .. 10) {
        for my $i (0 .. $#c) {
            my $r = request_on($c[$i], "/c$i/r$round");
            push @res, $r;
            my ($port) = ($r && $r->{body} =~ /port=(\d+)/);
            is($port, $c[$i]->sockport, "connection $i round $round: its own client port")
                unless $r && $r->{status} == 200 && $port && $port == $c[$i]->sockport;
            $pids{ pid_of($r) // 0 }++;
        }
    }
    is(scalar(grep { $_ && $_->{status} == 200 } @res), 80, '80 requests on 8 connections, all answered');
    is(scalar(grep { $_ && ($_->{headers}{connection} // '') =~ /close/i } @res), 0, 'none closes its connection');
    ok(keys(%pids) >= 5, 'served by ' . keys(%pids) . ' workers: the workers were recycled');
    is(scalar(grep { $_ && $_->{body} !~ /addr=127\.0\.0\.1 / } @res), 0, 'REMOTE_ADDR carried along');
    my $metrics = NarwhalTest::http_get($status, "/metrics") // {};
    my ($to_manager) = ($metrics->{content} // '') =~ /^narwhal_handoffs_total\{direction="to_manager"\} (\d+)/m;
    # Adoption needs a hard open-file limit of 4,605 (a worker raises its
    # soft limit that far); below, the manager takes them as before.
    my ($hard) = do { open my $l, '<', '/proc/self/limits'; join('', <$l>) } =~ /^Max open files\s+\S+\s+(\S+)/m;
    my ($adopted) = ($metrics->{content} // '') =~ /^narwhal_handoffs_total\{direction="worker_to_worker"\} (\d+)/m;
    SKIP: {
        skip "the hard open-file limit ($hard) is below 4605: adoption is off", 2
            if $hard ne 'unlimited' && $hard < 4605;
        is($to_manager, 0, 'no connection went through the manager');
        # each recycle passes the parked connections and the current one
        ok($adopted && $adopted >= 8, 'the metrics count the adopted connections ('
                                      . ($adopted // 'none') . ')');
    }
} };

push @parts, sub { subtest 'a parked connection holds no buffers' => sub {
    # As it parks, a connection gives its input buffer (16 KiB, a page of
    # it touched), response-head buffer and header table (3.2 KiB, zeroed)
    # to the worker's spares (DESIGN.md, "Buffers of idle connections").
    # Keeping them, 600 parked connections grew the worker by 9 KB each.
    my ($srv, $metric) = server_with_status('--keepalive-wait' => 30);
    my $worker;
    wait_until(sub { ($worker) = NarwhalTest::worker_pids($srv->pid); $worker }, 5);
    my $rss = sub {
        open(my $fh, '<', "/proc/$worker/status") or return 0;
        local $/;
        return (<$fh> =~ /^VmRSS:\s+(\d+)/m)[0];
    };
    my @warm = map { raw_connect($srv->port) } 1 .. 8;     # (first-use allocations)
    request_on($_, '/warm') for @warm;
    my $before = $rss->();
    my @parked = map { raw_connect($srv->port) or die "connect: $!" } 1 .. 600;
    my $answered = grep { my $r = request_on($_, '/p'); $r && $r->{status} == 200 } @parked;
    is($answered, 600, '600 keep-alive clients answered');
    ok(wait_until(sub { $metric->('narwhal_connections{state="parked"}') >= 600 }, 5),
       'all of them parked in the worker');
    my $per = ($rss->() - $before) / 600;
    cmp_ok($per, '<', 4, sprintf('the worker grew %.1f KB a parked connection', $per));
    my $r = request_on($parked[-1], '/again');
    like($r && $r->{body}, qr{path=/again}, 'a parked one is served again, with buffers');
} };

push @parts, sub { subtest 'HUP: parked connections go to the new workers, not away' => sub {
    my $srv = server('--keepalive-wait' => 5);
    my $a = raw_connect($srv->port);
    my $r1 = request_on($a, '/before');
    kill HUP => $srv->pid;
    ok(wait_until(sub { !kill(0, pid_of($r1)) }, 5), 'the old worker retired');
    my $r2 = request_on($a, '/after-hup');
    like($r2 && $r2->{body}, qr{path=/after-hup}, 'the connection it had parked is served');
    isnt(pid_of($r2), pid_of($r1), 'by the new generation');
} };

push @parts, sub { subtest 'TERM closes parked connections at once' => sub {
    my $srv = server('--keepalive-wait' => 5);
    my @a = map { raw_connect($srv->port) } 1 .. 3;
    request_on($_, '/x') for @a;
    my $t0 = Time::HiRes::time();
    kill TERM => $srv->pid;
    is(read_until_close($_, 4), '', 'parked connection closed') for @a;
    ok(Time::HiRes::time() - $t0 < 2, 'without waiting for --keepalive-wait or the timeout');
} };

push @parts, sub { subtest 'a connection with nothing to read yet is let go once, not re-read' => sub {
    # A unix socket has no TCP_DEFER_ACCEPT: a client that connects and
    # says nothing yet is accepted at once. The worker parks it (or gives
    # it to the manager) and must then be done with it. It used to read
    # it again and park it again until its parked set was full of copies
    # of the one connection (1,024), which then went to the manager; for
    # --keepalive-wait the worker could park nothing else, so every other
    # keep-alive client went through the manager after each response (and
    # when the copies expired they could take the watch of a connection
    # that had the same descriptor number by then).
    my $sock = NarwhalTest::tmpdir() . "/silent.sock";
    my $status = NarwhalTest::free_port();
    my $srv = spawn_server(app => $app, unix => $sock,
                           args => [ '--max-workers' => 1, '--keepalive-wait' => 5,
                                     '--status-listen' => "127.0.0.1:$status" ]);
    my $silent = IO::Socket::UNIX->new(Peer => $sock) or die "connect: $!";
    Time::HiRes::sleep(0.05);
    my $ka = IO::Socket::UNIX->new(Peer => $sock) or die "connect: $!";
    my $answered = grep { my $r = request_on($ka, "/ka$_"); Time::HiRes::sleep(0.02);
                          $r && $r->{status} == 200 } 1 .. 10;
    is($answered, 10, 'the keep-alive client beside it: every request answered');
    my $metrics = NarwhalTest::http_get($status, "/metrics") // {};
    my ($to_manager) = ($metrics->{content} // '') =~ /^narwhal_handoffs_total\{direction="to_manager"\} (\d+)/m;
    is($to_manager, 0, 'both stayed parked in the worker: nothing went to the manager');
    my $r = request_on($silent, '/late');
    like($r && $r->{body}, qr{path=/late}, 'the silent client is served when it speaks');
} };

# The timed subtests' servers first, all at once (while nothing else
# runs: their start-ups are the CPU's busiest moments). Then the other
# subtests in four processes at once (each has its own server; they wait
# for --keepalive-wait, slow requests and replacement workers): the one
# with a 1.5 s request alone, the others in three. Then, alone, the timed
# subtests.
my @servers = spawn_servers(map { $_->[0] } @timed);
my @waits = (in_background($slow_part),
             map { my $third = $_; in_background(sub { $parts[$_]->() for grep { $_ % 3 == $third } 0 .. $#parts }) }
                 0 .. 2);
$waits[$_]->("block $_ of the parts run at once") for 0 .. $#waits;
for my $i (0 .. $#timed) {
    my (undef, $name, $code) = @{ $timed[$i] };
    subtest $name => sub { $code->($servers[$i]) };
}
done_testing();
