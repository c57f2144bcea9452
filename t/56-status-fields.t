use strict;
use warnings;
use Test::More;
use Test2::IPC;    # (parts of this file run in processes of their own)
use lib 't/lib';
use HTTP::Tiny ();    # (loaded now, not while a rate is being measured)
use JSON::PP ();
use Sys::Hostname ();
use Time::HiRes qw(time sleep);
use NarwhalTest qw(spawn_server write_app wait_until manager_fallback free_port http_get metrics_of
                   raw_connect read_response in_parallel);

# The fields of /status and /status.json an operator acts on, each
# checked against what the test's clients did: the client address and
# port of a running request, its response time once it ended, requests
# per second over the manager's samples, bytes sent, CPU time, the host
# and version, connections by state.

my @NM = manager_fallback();
plan skip_all => 'the status pages need the connection manager'
    if !NarwhalTest::managed();

my $APP = write_app(<<'APP');
sub {
    my $env = shift;
    my $p = $env->{PATH_INFO};
    Time::HiRes::sleep($1) if $p =~ m{^/sleep/([\d.]+)};
    if ($p =~ m{^/burn/([\d.]+)}) {     # CPU time of this process, not wall time
        my $until = times() + $1;
        1 while times() < $until;
    }
    return [200, ['Content-Type' => 'text/plain'], ['x' x 1000]] if $p eq '/big';
    [200, ['Content-Type' => 'text/plain'], ["pid=$$\n"]];
}
APP

# Each part below on a server of its own, all at once (in_parallel): the
# rates are measured over requests the test alone sends.
my ($s, $sport);
sub server {
    $sport = free_port();
    $s = spawn_server(app => $APP, args => [ '--max-workers', 2, '--status-listen', "127.0.0.1:$sport" ]);
    # both workers on the board, set up (asked of /metrics, which takes no
    # rate sample: a worker missing from the first sample has its rate
    # taken over its whole life, and the workers' rates fall short of the
    # server's)
    wait_until(sub { (metrics_of($sport)->{'narwhal_workers{state="idle"}'} // 0) == 2 }, 5);
}

sub status {
    my $r = http_get($sport, '/status.json');
    return eval { JSON::PP->new->decode($r->{content}) } || {};
}
sub get {   # one request on its own connection: (response, the client's port)
    my ($path) = @_;
    my $c = raw_connect($s->port);
    syswrite($c, "GET $path HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    return (read_response($c, 10), $c->sockport);
}

my $part_fields = sub {
    server();
    # Who and what
    my $j = status();
    is($j->{host}, Sys::Hostname::hostname(), 'the host name');
    require Narwhal;
    is($j->{version}, $Narwhal::VERSION, "Narwhal's version");
    my $html = http_get($sport, '/status')->{content};
    like($html, qr{<h1>Narwhal \Q$Narwhal::VERSION\E on \Q$j->{host}\E}, '/status says both in its title');

    # A running request: its client's address and port, as the client sees them
    # (1 s: time enough to look at it while it runs, on a loaded machine too)
    my $slow = raw_connect($s->port);
    my $slow_port = $slow->sockport;
    syswrite($slow, "GET /sleep/1 HTTP/1.1\r\nHost: x\r\n\r\n");
    my $busy;
    ok(wait_until(sub { ($busy) = grep { $_->{state} eq 'busy' } @{ status()->{workers} || [] }; $busy }, 3),
       'the slow request runs');
    is($busy->{client}, "127.0.0.1:$slow_port", "status.json: its client is the test's socket (127.0.0.1:$slow_port)");
    is($busy->{request}, 'GET /sleep/1', '... with its request line');
    $html = http_get($sport, '/status')->{content};
    like($html, qr{<code>127\.0\.0\.1:$slow_port</code></td><td><code>GET /sleep/1<}, '/status shows it too');
    my $r = read_response($slow, 5);
    is($r->{status}, 200, 'the slow request ends');
    close $slow;    # (an open one would keep the stop lingering for it)
    # (its worker writes down the response's time once it has sent it)
    my $w;
    wait_until(sub { ($w) = grep { $_->{pid} == $busy->{pid} } @{ status()->{workers} || [] };
                     $w && $w->{state} ne 'busy' && defined $w->{last_seconds} }, 5);
    cmp_ok($w->{last_seconds}, '>=', 1, "its worker's last response took 1 s or more ($w->{last_seconds})");
    cmp_ok($w->{last_seconds}, '<', 2, '... and not much more');
    my $t = status()->{requests};
    cmp_ok($t->{last_seconds}, '>=', 1, 'the server\'s last response is that one');
    $s->stop;
};

my $part_counts = sub {
    server();
    # Bytes: ten bodies of 1000 bytes
    my $before = status()->{requests}{bytes_sent};
    for (1 .. 10) { my ($res) = get('/big'); die 'no /big' unless $res && $res->{status} == 200 }
    # (a worker counts a response's bytes once it has sent them: the last
    # one may be counted a moment after the client has it)
    my $sent;
    wait_until(sub { ($sent = status()->{requests}{bytes_sent} - $before) >= 10_000 }, 5);
    is($sent, 10_000, 'ten bodies of 1000 bytes: 10000 bytes sent');

    # CPU time: 0.3 s of CPU burnt by one worker
    my ($burn) = get('/burn/0.3');
    my ($pid) = ($burn->{body} // '') =~ /pid=(\d+)/;
    ok($pid, "the burner was worker $pid");
    my ($bw) = grep { $_->{pid} == ($pid // 0) } @{ status()->{workers} };
    cmp_ok($bw->{cpu_seconds} // 0, '>=', 0.25, "its CPU time says so ($bw->{cpu_seconds} s)");
    $s->stop;
};

my $part_rates = sub {
    server();
    # Requests per second: a sample, 100 requests paced over about 1.2 s, a
    # render (a server no page was asked of yet: the first render takes a
    # sample; the next one a second or more later takes the second)
    my $t0 = time;
    my $first = status()->{requests};
    my $keep = raw_connect($s->port);
    for (1 .. 100) {
        syswrite($keep, "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
        read_response($keep, 5) or die 'no answer';
        sleep 0.012;
    }
    my $j2 = status();
    my $elapsed = time - $t0;
    my $second = $j2->{requests};
    is($second->{total} - $first->{total}, 100, '100 requests between the two renders');
    my $want = 100 / $elapsed;
    cmp_ok(abs($second->{rate_window_seconds} - $elapsed), '<', 0.3,
           "the rate is over the time between the renders ($second->{rate_window_seconds} s, $elapsed s measured)");
    cmp_ok(abs($second->{per_second} - $want) / $want, '<', 0.15,
           sprintf('requests/s is what was sent: %.1f, %.1f measured', $second->{per_second}, $want));
    my $sum = 0;
    $sum += $_->{requests_per_second} for @{ $j2->{workers} };
    cmp_ok(abs($sum - $second->{per_second}), '<', 0.02 * $want + 0.01, "the workers' rates add up to it ($sum)");
    cmp_ok($second->{mean_seconds}, '<', 0.1, "the mean response of those hellos is short ($second->{mean_seconds} s)");
    cmp_ok($second->{mean_seconds}, '>', 0, '... and not zero');

    # Connections by state: one keep-alive connection open, one table
    my $c = status()->{connections};
    cmp_ok($c->{total}, '>=', 1, "the keep-alive connection is counted ($c->{total})");
    my $html = http_get($sport, '/status')->{content};
    like($html, qr{<caption>connections</caption><tr><th>idle</th><th>reading</th><th>queued</th>
                    <th>writing</th><th>closing</th><th>handoff</th><th>parked</th><th>worker</th>
                    <th>total</th>}x,
         '/status: a table of connections by state');
    like($html, qr{<td class=n>\Q$c->{total}\E</td></tr></table><table><caption>requests waiting},
         '... with the same total');
    like($html, qr{<b>[\d.]+</b>requests/s</div>}, '... requests per second');
    like($html, qr{</b>mean response</div>}, '... the mean response time');
    unlike($html, qr{<script}i, '... and no JavaScript');
    close $keep;
    $s->stop;
};

# Requests waiting for a worker, and which workers take new clients: two
# workers, one of them standing by (--accepting-workers 1), both held by
# a slow request, and three more clients, whose requests the manager takes
# and puts on the serve queue: /status and /status.json say three wait
# there (they said nothing of them: the connections table had them
# nowhere, and the HTML page did not say which worker accepts).
my $part_waiting = sub {
    $sport = free_port();
    $s = spawn_server(app => $APP, args => [ '--max-workers', 2, '--accepting-workers', 1,
                                             '--status-listen', "127.0.0.1:$sport" ]);
    wait_until(sub { (metrics_of($sport)->{'narwhal_workers{state="idle"}'} // 0) == 2 }, 5);
    my @accepts = map { $_->{accepts} ? 1 : 0 } @{ status()->{workers} || [] };
    is(join(',', sort @accepts), '0,1', 'status.json: one worker accepts, the other stands by');
    my $html = http_get($sport, '/status')->{content};
    like($html, qr{<th>state</th><th>accepts</th>}, '/status: a column says which accepts');
    my @said = $html =~ m{<td class=idle>idle</td><td>(yes|standby)</td>}g;
    is(join(',', sort @said), 'standby,yes', '... one yes, one standby');
    my @slow;
    for my $n (1, 2) {
        my $c = raw_connect($s->port);
        syswrite($c, "GET /sleep/2 HTTP/1.1\r\nHost: x\r\n\r\n");
        push @slow, $c;
        wait_until(sub { (grep { $_->{state} eq 'busy' } @{ status()->{workers} || [] }) == $n }, 3)
            or diag "the slow request $n did not start";
    }
    my @fast;
    for (1 .. 3) {
        my $c = raw_connect($s->port);
        syswrite($c, "GET /x HTTP/1.1\r\nHost: x\r\n\r\n");
        push @fast, $c;
    }
    my $w;
    ok(wait_until(sub { $w = status()->{requests_waiting}; ($w->{total} // 0) == 3 }, 1.5),
       'status.json: three requests wait for a worker') or diag explain $w;
    is($w->{serve_queue} + $w->{manager}, 3, '... on the serve queue or in the manager');
    my $c = status()->{connections};
    is($c->{queued}, 3, '... queued is what the connections say too');
    is($c->{total}, 5, '... of the 5 open (the two slow ones in workers)') or diag explain $c;
    $html = http_get($sport, '/status')->{content};
    like($html, qr{<b>3</b>requests waiting</div>}, '/status: three requests waiting');
    for (@fast) {
        my $r = read_response($_, 5);
        is($r && $r->{status}, 200, 'a waiting request is served once a worker is free');
    }
    read_response($_, 5) for @slow;
    close $_ for @slow, @fast;
    $s->stop;
};

# /health tells a load balancer or a readiness probe whether to send
# requests: 503 "starting" while the app loads (the status pages are up at
# once, the workers not yet), 200 from the moment every worker of the
# first generation serves, when systemd is told READY=1.
my $part_health_at_start = sub {
    my $hport = free_port();
    my $slow = write_app("sleep 2; sub { [200, ['Content-Type' => 'text/plain'], ['app']] }");
    my $h = spawn_server(app => $slow, args => [ '--max-workers', 2, '--status-listen', "127.0.0.1:$hport" ]);
    my (@said, $first_ok);
    wait_until(sub {
        my $r = http_get($hport, '/health');
        push @said, "$r->{status} $r->{content}" if $r->{status} != 599 && (!@said || $said[-1] ne "$r->{status} $r->{content}");
        return 0 unless $r->{status} == 200;
        $first_ok = http_get($h->port, '/');
        return 1;
    }, 15, 0.02);
    is($said[0], "503 starting\n", '/health: 503 "starting" while the app loads');
    is($said[-1], "200 ok\n", '... then 200');
    is(scalar(@said), 2, '... and nothing in between') or diag explain \@said;
    is(($first_ok // {})->{status}, 200, 'the app answers once /health says 200');
    $h->stop;
};

in_parallel($part_fields, $part_counts, $part_rates, $part_waiting, $part_health_at_start);
done_testing();
