use strict;
use warnings;
use Test::More;
use Test2::IPC;    # (parts of this file run in processes of their own)
use lib 't/lib';
use JSON::PP ();
use Narwhal::Listener ();
use POSIX ();
use Time::HiRes qw(time sleep);
use NarwhalTest qw(spawn_server write_app raw_connect read_response wait_until tmpdir
                   worker_pids manager_fallback narwhal_cmd run_cmd free_port http_get missing
                   in_parallel);

# The operator layer as an operator meets it (DESIGN.md, "The operator
# layer"): the status pages answer while every worker is stuck, the
# metrics count what clients got, a stuck request is ended with a
# backtrace and a 504, a leaking worker is replaced without its clients
# noticing, and requests that wait too long for a worker are shed.

my @NM = manager_fallback();
my $MANAGED = NarwhalTest::managed();
my $TMP = tmpdir();
my $DATE = qr/^\w{3}, \d\d \w{3} \d{4} \d\d:\d\d:\d\d GMT$/;   # (IMF-fixdate)

my $APP = write_app(<<'APP');
use strict;
use Time::HiRes ();
my @leak;
sub {
    my $env = shift;
    my $p = $env->{PATH_INFO};
    if ($p eq '/sleep') {
        Time::HiRes::sleep($env->{QUERY_STRING} =~ /^([\d.]+)/ ? $1 : 1);
        return [200, ['Content-Type' => 'text/plain'], ["slept\n"]];
    }
    if ($p eq '/busy') { my $n = 0; while (1) { $n++ } }
    # crypt runs in C for seconds: no Perl statement boundary to stop at
    if ($p eq '/crypt') { return [200, [], [crypt($$ . time, '$5$rounds=60000000$salt') . "\n"]] }
    if ($p eq '/stream-then-sleep') {
        return sub {
            my $w = $_[0]->([200, ['Content-Type' => 'text/plain']]);
            $w->write("first part\n");
            Time::HiRes::sleep(30);
            $w->write("never\n");
            $w->close;
        };
    }
    if ($p eq '/leak') { push @leak, 'x' x (4 << 20); return [200, [], ["pid=$$ leaked=" . @leak . "\n"]] }
    if ($p eq '/hold') {    # until the test releases it (NAME: the query's first word), 30 s at most
        my ($name) = $env->{QUERY_STRING} =~ /^(\w+)/;
        (my $released = __FILE__) =~ s{[^/]*\z}{release-$name};
        my $end = time + 30;
        Time::HiRes::sleep(0.01) until -e $released || time > $end;
        return [200, ['Content-Type' => 'text/plain'], ["held\n"]];
    }
    return [404, [], ["no\n"]] if $p eq '/missing';
    return [500, [], ["boom\n"]] if $p eq '/fail';
    [200, ['Content-Type' => 'text/plain'], ["pid=$$\n"]];
}
APP

# Ends the requests to /hold?NAME (the app's file is in $TMP).
sub release {
    my ($name) = @_;
    open(my $f, '>', "$TMP/release-$name") or die "$TMP/release-$name: $!";
    close $f;
}

sub server {
    my (%a) = @_;
    return spawn_server(app => $APP, args => [ @NM, @{ $a{args} } ], %{ $a{spawn} || {} });
}

# Whether process $pid has a handler for signal $sig (/proc/PID/status).
sub catches {
    my ($pid, $sig) = @_;
    open(my $f, '<', "/proc/$pid/status") or return 0;
    my ($mask) = join('', <$f>) =~ /^SigCgt:\s*([0-9a-f]+)/m or return 0;
    return hex(substr($mask, -8)) & (1 << ($sig - 1));
}

sub get_raw {
    my ($port, $path, $timeout) = @_;
    my $c = raw_connect($port) or return undef;
    my $t0 = time;      # before the write: the server may start on it before this process runs again
    syswrite($c, "GET $path HTTP/1.1\r\nHost: x\r\n\r\n");
    my $r = read_response($c, $timeout // 10);
    $r->{elapsed} = time - $t0 if $r;
    return $r;
}

# Prometheus text format 0.0.4: every sample line is "name{labels} value",
# every metric has HELP and TYPE first. Returns { "name{labels}" => value }.
sub parse_metrics {
    my ($text) = @_;
    my (%v, %typed, @bad);
    for my $line (split /\n/, $text) {
        if ($line =~ /^# (HELP|TYPE) (\w+) (.+)$/) { $typed{$2}{$1} = $3; next }
        if ($line =~ /^(\w+)(\{[^}]*\})? (\S+)$/) {
            my ($name, $labels, $value) = ($1, $2 // '', $3);
            my $family = $name;
            $family =~ s/_(?:bucket|sum|count)$// unless $typed{$name};
            push @bad, "no TYPE for $line" unless $typed{$family}{TYPE} && $typed{$family}{HELP};
            push @bad, "bad value: $line" unless $value =~ /^(?:[\d.]+(?:e[+-]?\d+)?|\+Inf|NaN)$/;
            $v{"$name$labels"} = $value;
            next;
        }
        push @bad, "unparsable: $line";
    }
    return (\%v, \@bad);
}

# One sample of the status listener's /metrics ("name{labels}"), -1 without it.
sub metric {
    my ($status, $name) = @_;
    my $r = get_raw($status, '/metrics') or return -1;
    my ($v) = parse_metrics($r->{body});
    return $v->{$name} // -1;
}

# 1. The pages, their formats, and what they count.
my $sec_pages = sub { SKIP: {
    skip 'the status pages need the connection manager', 1 unless $MANAGED;
    my $sport = free_port();
    # (the stop at the end looks at /health while the manager serves its
    # stop window: the real one, NW_STOP_SERVE_MS, not the suite's 20 ms)
    my $s = server(args => [ '--max-workers', 2, '--listen-queues', 2,
                             '--status-listen', "127.0.0.1:$sport" ],
                   spawn => { env => { NARWHAL_TEST_STOP_SERVE_MS => undef } });
    my $port = $s->port;
    wait_until(sub { worker_pids($s->pid) == 2 }, 10);
    is(get_raw($port, '/')->{status}, 200, 'the app answers') for 1 .. 5;
    is(get_raw($port, '/fail')->{status}, 500, 'a 500') for 1 .. 2;
    is(get_raw($port, '/missing')->{status}, 404, 'a 404');
    my $bad = raw_connect($port);
    syswrite($bad, "BROKEN\r\n\r\n");
    like(NarwhalTest::read_until_close($bad, 5), qr{^HTTP/1\.1 400}, 'a malformed request gets 400');

    my $h = get_raw($sport, '/health');
    is($h->{status}, 200, '/health: 200 while serving');
    is($h->{body}, "ok\n", '... saying ok');

    my $m = get_raw($sport, '/metrics');
    is($m->{status}, 200, '/metrics answers');
    like($m->{headers}{'content-type'}, qr{^text/plain; version=0\.0\.4}, '... in the Prometheus text format');
    my ($v, $errors) = parse_metrics($m->{body});
    is_deeply($errors, [], 'every line parses, every metric has HELP and TYPE');
    is($v->{'narwhal_requests_total{class="2xx"}'}, 5, 'requests_total counts the 2xx');
    is($v->{'narwhal_requests_total{class="5xx"}'}, 2, '... the 5xx');
    is($v->{'narwhal_requests_total{class="4xx"}'}, 2, '... and the 4xx: the app\'s 404 and the server\'s 400');
    my @buckets = map { $v->{"narwhal_request_duration_seconds_bucket{le=\"$_\"}"} }
                  qw(0.0001 0.00025 0.0005 0.001 0.0025 0.005 0.01 0.025 0.05 0.1 0.25 0.5 1 2.5 5 10 30 +Inf);
    ok(!grep({ !defined } @buckets), 'the histogram has its eighteen buckets, from 100 us');
    is_deeply([ sort { $a <=> $b } @buckets ], \@buckets, 'the buckets are cumulative');
    is($buckets[-1], $v->{narwhal_request_duration_seconds_count}, '+Inf equals the count');
    is($v->{narwhal_request_duration_seconds_count}, 9, 'the count is every request answered');
    is($v->{'narwhal_workers{state="idle"}'}, 2, 'two idle workers');
    is($v->{narwhal_workers_wanted}, 2, 'two wanted');
    my @w = worker_pids($s->pid);
    ok($v->{"narwhal_worker_resident_bytes{slot=\"$_\"}"} > 1e6, "the RSS of the worker in slot $_ is there")
        for 0, 1;
    ok(defined $v->{"narwhal_listen_queue_length{listener=\"127.0.0.1:$port\"}"},
       'the listener\'s queue length is reported');
    is($v->{"narwhal_listen_queue_limit{listener=\"127.0.0.1:$port\"}"},
       2 * Narwhal::Listener::default_backlog(), '... with its two queues\' backlogs, summed');
    is($v->{narwhal_shed_total}, 0, 'nothing shed');
    is($v->{narwhal_up}, 1, 'up');

    # Every worker stuck: the status pages still answer, and show what
    # each worker is doing.
    # (held until the test has looked: stuck as long as it takes, no longer)
    my @stuck = map { my $c = raw_connect($port); syswrite($c, "GET /hold?pages&<b>$_ HTTP/1.1\r\nHost: x\r\n\r\n"); $c } 1 .. 2;
    ok(wait_until(sub {
        my $j = get_raw($sport, '/status.json') or return 0;
        my $d = eval { JSON::PP::decode_json($j->{body}) } or return 0;
        2 == grep { $_->{state} eq 'busy' } @{ $d->{workers} };
    }, 5), 'both workers busy, seen through /status.json');
    my $t0 = time;
    my $j = get_raw($sport, '/status.json');
    ok(time - $t0 < 1, 'the status listener answers at once while every worker is stuck');
    my $d = JSON::PP::decode_json($j->{body});
    is(scalar @{ $d->{workers} }, 2, 'status.json lists both workers');
    is_deeply([ sort map { $_->{pid} } @{ $d->{workers} } ], [ sort @w ], '... by their pids');
    like($_->{request}, qr{^GET /hold\?pages&<b>\d$}, "worker $_->{pid} shows its request line")
        for @{ $d->{workers} };
    is($d->{master_pid}, $s->pid, 'the master\'s pid');
    is($d->{requests}{by_class}{'2xx'}, 5, 'the same counts as /metrics');
    is_deeply([ map { [ @$_{qw(address queues backlog)} ] } @{ $d->{listeners} } ],
              [ [ "127.0.0.1:$port", 2, 2 * Narwhal::Listener::default_backlog() ] ],
              'one listener, its two queues counted and their backlogs summed');
    my $html = get_raw($sport, '/status');
    like($html->{headers}{'content-type'}, qr{^text/html}, '/status is HTML');
    like($html->{body}, qr{\Q$_\E}, "it shows worker $_") for @w;
    like($html->{body}, qr{GET /hold\?pages&amp;&lt;b&gt;1}, 'request lines are escaped');
    unlike($html->{body}, qr{pages&<b>1}, '... never inserted raw');   # (the cards' own <b> are not it)
    release('pages');
    is(read_response($_, 10)->{status}, 200, 'the stuck requests finish') for @stuck;

    is(get_raw($sport, '/nope')->{status}, 404, 'an unknown page: 404');
    my $post = raw_connect($sport);
    syswrite($post, "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n");
    my $r = read_response($post, 5);
    is($r->{status}, 405, 'POST: 405');
    is($r->{headers}{allow}, 'GET, HEAD', '... with Allow');
    is(get_raw($port, '/metrics')->{body}, "no\n", 'the app\'s own listener never serves the status pages')
        if 0;    # (the app answers its own /metrics: nothing to check but that it is the app)
    like(get_raw($port, '/metrics')->{body}, qr/^pid=/, 'the app\'s listener serves the app, not the pages');

    # A graceful stop: /health says 503 at once.
    # (the first answers may come before the master has read its TERM)
    kill TERM => $s->pid;
    my $health;
    wait_until(sub { $health = get_raw($sport, '/health', 2); !$health || $health->{status} != 200 }, 2);
    is($health && $health->{status}, 503, '/health: 503 once a stop has begun');
    like($health && $health->{headers}{date} // '', $DATE, '... with a Date, as every status page');
    $s->wait_exit(10);
}};

# 2. A unix socket for the pages; refusals with one line and a
# non-zero exit.
my $sec_refusals = sub { SKIP: {
    skip 'the status pages need the connection manager', 1 unless $MANAGED;
    my $path = "$TMP/status.sock";
    my $s = server(args => [ '--status-listen', $path ]);
    # (the server is up once its app listener answers; the manager's
    # status listener may come a moment later on a busy machine, and
    # /health says 503 "starting" until a worker serves)
    my @said;
    wait_until(sub {
        my $c = raw_connect($path) or return 0;
        syswrite($c, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
        push @said, read_response($c, 5)->{status} // 'none';
        return $said[-1] eq '200';
    }, 5);
    is($said[-1], 200, '--status-listen on a unix socket');
    is_deeply([ grep { $_ ne '503' && $_ ne '200' } @said ], [], '... 503 (starting) before that, nothing else');
    $s->stop;
    my $port = free_port();
    for my $case ([ "--status-listen with --no-manager",
                    [ '--listen', "127.0.0.1:$port", '--no-manager', '--status-listen', '127.0.0.1:1' ],
                    qr/--status-listen needs the connection manager/ ],
                  [ "--max-queue-wait with --no-manager",
                    [ '--listen', "127.0.0.1:$port", '--no-manager', '--max-queue-wait', 100 ],
                    qr/--max-queue-wait needs the connection manager/ ],
                  [ "--status-listen on the app's listener",
                    [ '--listen', "127.0.0.1:$port", '--status-listen', "127.0.0.1:$port" ],
                    qr/must not be one of the app's listeners/ ],
                  # (the app's sockets have SO_REUSEPORT with --listen-queues:
                  # the kernel no longer refuses a status listener that would
                  # join them, and take the app's clients; nor with --reuse-port)
                  [ "--status-listen on the app's --port, with two queues",
                    [ '--port', $port, '--listen-queues', 2, '--status-listen', "127.0.0.1:$port" ],
                    qr/must not be one of the app's listeners/ ],
                  [ "--status-listen within the app's 0.0.0.0, with --reuse-port",
                    [ '--listen', "0.0.0.0:$port", '--listen-queues', 1, '--reuse-port',
                      '--status-listen', "127.0.0.1:$port" ],
                    qr/must not be one of the app's listeners/ ]) {
        my ($name, $args, $want) = @$case;
        my $r = run_cmd([ narwhal_cmd(), @$args, $APP ], timeout => 10);
        isnt($r->{code}, 0, "$name: non-zero exit");
        like($r->{err}, $want, "... saying why");
        is(scalar(() = $r->{err} =~ /\n/g), 1, '... in one line');
    }
}};

# 3. Load shedding: both workers stuck, requests that arrive on
# connections the manager holds get 503 + Retry-After after
# --max-queue-wait, not an unbounded wait.
my $sec_shed = sub { SKIP: {
    skip 'the status pages need the connection manager', 1 unless $MANAGED;
    my $sport = free_port();
    my $s = server(args => [ '--max-workers', 2, '--max-queue-wait', 300, '--keepalive-wait', 0,
                             '--status-listen', "127.0.0.1:$sport" ]);
    my $port = $s->port;
    wait_until(sub { worker_pids($s->pid) == 2 }, 10);
    my @idle = map { raw_connect($port) } 1 .. 6;
    for my $c (@idle) {
        syswrite($c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
        read_response($c, 5);
    }
    wait_until(sub { metric($sport, 'narwhal_connections{state="idle"}') == 6 }, 5)
        or diag 'the connections are not the manager\'s';
    # (stuck until released: a request that waited for them would wait 10 s)
    my @stuck = map { my $c = raw_connect($port); syswrite($c, "GET /hold?shed HTTP/1.1\r\nHost: x\r\n\r\n"); $c } 1 .. 2;
    wait_until(sub { metric($sport, 'narwhal_workers{state="busy"}') == 2 }, 5) or diag 'the workers are not stuck';
    syswrite($_, "GET / HTTP/1.1\r\nHost: x\r\n\r\n") for @idle;
    my $t0 = time;
    my @r = map { read_response($_, 10) } @idle;
    my $waited = time - $t0;
    is(scalar(grep { $_ && $_->{status} == 503 } @r), 6, 'every waiting request got 503');
    is(scalar(grep { $_ && ($_->{headers}{'retry-after'} // '') eq '1' } @r), 6, '... with Retry-After');
    is(scalar(grep { $_ && ($_->{headers}{connection} // '') eq 'close' } @r), 6, '... and Connection: close');
    is(scalar(grep { $_ && ($_->{headers}{date} // '') =~ $DATE } @r), 6,
       '... and a Date (RFC 9110 6.6.1), as every answer of the server\'s own');
    ok($waited < 1.5, sprintf('... within the bound, not after the stuck requests (%.2f s)', $waited));
    my ($v) = parse_metrics(get_raw($sport, '/metrics')->{body});
    is($v->{narwhal_shed_total}, 6, 'narwhal_shed_total counts them');
    release('shed');
    is(read_response($_, 10)->{status}, 200, 'the stuck requests still finish') for @stuck;
    is(get_raw($port, '/')->{status}, 200, 'and the server serves again');
}};

# ... and without --max-queue-wait they wait for a worker (the control).
my $sec_no_shed = sub { SKIP: {
    skip 'the status pages need the connection manager', 1 unless $MANAGED;
    my $status = "$TMP/no-shed-status.sock";
    my $s = server(args => [ '--max-workers', 1, '--keepalive-wait', 0, '--status-listen', $status ]);
    my $port = $s->port;
    my $c = raw_connect($port);
    syswrite($c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    read_response($c, 5);
    wait_until(sub { metric($status, 'narwhal_connections{state="idle"}') == 1 }, 5)
        or diag 'the connection is not the manager\'s';
    my $stuck = raw_connect($port);
    syswrite($stuck, "GET /sleep?1.5 HTTP/1.1\r\nHost: x\r\n\r\n");
    wait_until(sub { metric($status, 'narwhal_workers{state="busy"}') == 1 }, 5) or diag 'the worker is not stuck';
    syswrite($c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    my $r = read_response($c, 10);
    is($r && $r->{status}, 200, 'without --max-queue-wait a waiting request is served when a worker frees');
}};

# 4. The request watchdog: a sleeping app, a busy Perl loop, an app stuck
# in C, and a response that had begun, at once, a worker each. Each
# worker is replaced.
my $sec_watchdog = sub {
    my $sport = free_port();
    my $s = server(args => [ '--max-workers', 4, '--request-timeout', 1,
                             ($MANAGED ? ('--status-listen', "127.0.0.1:$sport") : ()) ]);
    my $port = $s->port;
    wait_until(sub { worker_pids($s->pid) == 4 }, 10);
    # A late signal (its request ended just after the master looked) finds
    # the worker idle: it must neither die nor count it as a first signal.
    my @before = sort { $a <=> $b } worker_pids($s->pid);
    get_raw($port, '/') for 1 .. 8;
    # (a worker forked a moment ago may not have its handlers yet: wait
    # until each catches XCPU, /proc's SigCgt mask)
    wait_until(sub { !grep { !catches($_, POSIX::SIGXCPU()) } @before }, 5);
    kill XCPU => @before;
    # Each worker runs its Perl handler at its next safe point at the
    # latest: the return from its wait for a connection. Four requests at
    # once, each 0.3 s long, take the four workers. (Connection: close:
    # without the manager a kept-alive connection keeps its worker.)
    my @all = map { my $c = raw_connect($port);
                    syswrite($c, "GET /sleep?0.3 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"); $c } 1 .. 4;
    my @got = map { read_response($_, 10) } @all;
    is(scalar(grep { $_ && $_->{status} == 200 } @got), 4, 'after a late XCPU all four workers serve');
    is_deeply([ sort { $a <=> $b } worker_pids($s->pid) ], \@before, 'an idle worker ignores a late XCPU');
    # The stuck requests at once, a worker each: each is timed from its own
    # write, and its answer taken as soon as it is whole.
    my @cases = ([ '/sleep?30', 'a sleeping request', qr{at \S+ line 9\n} ],
                 [ '/busy', 'a busy Perl loop', qr{at \S+ line 11\n} ],
                 [ '/crypt', 'an app stuck in C', qr{outside Perl \(in C code} ]);
    my %sent = map {
        my $c = raw_connect($port);
        my $t0 = time;
        syswrite($c, "GET $_->[0] HTTP/1.1\r\nHost: x\r\n\r\n");
        ($_->[0] => { c => $c, t0 => $t0 });
    } @cases;
    my $c = raw_connect($port);
    syswrite($c, "GET /stream-then-sleep HTTP/1.1\r\nHost: x\r\n\r\n");
    wait_until(sub {
        for my $w (grep { !$_->{done} } values %sent) {
            my $r = read_response($w->{c}, 0.01) or next;
            ($w->{r}, $w->{elapsed}, $w->{done}) = ($r, time - $w->{t0}, 1);
        }
        !grep { !$_->{done} } values %sent;
    }, 10, 0.01);
    for my $case (@cases) {
        my ($path, $name, $log) = @$case;
        my ($r, $elapsed) = @{ $sent{$path} }{qw(r elapsed)};
        is($r && $r->{status}, 504, "$name gets 504");
        like($r && $r->{headers}{date} // '', $DATE, '... with a Date (RFC 9110 6.6.1)');
        ok($r && $elapsed >= 1 && $elapsed < 4.5, sprintf('... after the timeout (%.1f s)', $r ? $elapsed : -1));
        like($s->log_text, qr/\Q$path\E has run for [\d.]+ s, over --request-timeout 1/, '... the master says which request');
        ok(wait_until(sub { $s->log_text =~ $log }, 3), '... and the log says where the app was')
            or diag $s->log_text;
    }
    my $data = NarwhalTest::read_until_close($c, 8);
    like($data, qr{^HTTP/1\.1 200 .*first part\n}s, 'a response that had begun keeps its status line');
    unlike($data, qr{0\r\n\r\n\z}, '... and is cut short, never complete');
    ok(wait_until(sub { $s->log_text =~ /its response had begun: closed/ }, 3), '... the log says so');
    ok(wait_until(sub { worker_pids($s->pid) == 4 }, 5), 'the workers were replaced');
    is(get_raw($port, '/')->{status}, 200, 'and serve');
    if ($MANAGED) {
        # (the last restart is counted once the master has reaped its worker)
        my $v;
        wait_until(sub { ($v) = parse_metrics(get_raw($sport, '/metrics')->{body});
                         ($v->{'narwhal_worker_restarts_total{reason="watchdog"}'} // 0) >= 4 }, 5);
        is($v->{'narwhal_worker_restarts_total{reason="watchdog"}'}, 4, 'restarts_total counts four watchdog restarts');
        is($v->{'narwhal_requests_total{class="5xx"}'}, 3, 'the 504s are counted as 5xx');
    }
    $s->stop;
};

# ... off by default: a slow request passes.
my $sec_no_watchdog = sub {
    my $s2 = server(args => [ '--max-workers', 1 ]);
    is(get_raw($s2->port, '/sleep?2', 10)->{status}, 200, 'without --request-timeout a 2 s request is served');
};

# 5. The memory limit: a leaking worker is replaced after its request,
# and a keep-alive client that never retries sees no failure.
my $sec_rss = sub {
    my $sport = free_port();
    my $s = server(args => [ '--max-workers', 1, '--max-worker-rss', 60,
                             ($MANAGED ? ('--status-listen', "127.0.0.1:$sport") : ()) ]);
    my $port = $s->port;
    my ($ok, $failed, %pids) = (0, 0);
    my $c;
    for (1 .. 30) {
        $c ||= raw_connect($port);
        syswrite($c, "GET /leak HTTP/1.1\r\nHost: x\r\n\r\n");
        my $r = read_response($c, 10);
        if ($r && $r->{status} == 200) { $ok++; $pids{$1}++ if $r->{body} =~ /pid=(\d+)/ }
        else { $failed++ }
        undef $c if !$r || ($r->{headers}{connection} // '') eq 'close';
    }
    is($failed, 0, "30 requests to a leaking app, none failed ($ok answered)");
    ok(keys %pids >= 2, 'served by more than one worker: the leaking one was replaced');
    like($s->log_text, qr/resident size \d+ MiB is over --max-worker-rss 60 after \d+ requests/,
         'the log says how large it was');
    if ($MANAGED) {
        my ($v) = parse_metrics(get_raw($sport, '/metrics')->{body});
        ok($v->{'narwhal_worker_restarts_total{reason="memory"}'} >= 1, 'restarts_total counts memory restarts');
    }
};

# 6. Worker recycling is counted as such.
my $sec_recycled = sub { SKIP: {
    skip 'the status pages need the connection manager', 1 unless $MANAGED;
    my $sport = free_port();
    my $s = server(args => [ '--max-workers', 1, '--max-requests', 3, '--min-worker-lifetime', 0, '--status-listen', "127.0.0.1:$sport" ]);
    get_raw($s->port, '/') for 1 .. 7;
    ok(wait_until(sub {
        my ($v) = parse_metrics(get_raw($sport, '/metrics')->{body});
        $v->{'narwhal_worker_restarts_total{reason="max-requests"}'} == 2
    }, 5), 'two workers replaced after --max-requests 3, counted as max-requests');
}};

# 6a. An operator's TERM to one worker stops that worker alone: the server
# goes on taking new clients, and the master replaces it. (A worker that
# took a stop from outside used to shut the listening socket, which every
# worker shares, to new handshakes, as for Ctrl-C: new clients then
# waited for ever on a server that looked up.)
my $sec_term_one = sub {
    my $s = server(args => [ '--max-workers', 2 ]);
    ok(wait_until(sub { worker_pids($s->pid) == 2 }, 5), 'TERM to one worker: two workers');
    my @before = worker_pids($s->pid);
    ok(kill(TERM => $before[0]), '... TERM sent to one of them by the operator');
    ok(wait_until(sub { !grep { $_ == $before[0] } worker_pids($s->pid) }, 5), '... it leaves');
    my @codes = map { (get_raw($s->port, '/', 3) || {})->{status} // 'none' } 1 .. 6;
    is("@codes", join(' ', (200) x 6), '... and new clients are still served') or diag "@codes";
    ok(wait_until(sub { worker_pids($s->pid) == 2 }, 5), '... by two workers again');
    $s->stop;
};

# 6c. A worker given its count again (--min-worker-lifetime: 5 requests
# at a count of 5, younger than 10 s) and then stopped from outside left
# for that signal, and is counted so, not as max-requests.
my $sec_term_extended = sub { SKIP: {
    skip 'the status pages need the connection manager', 3 unless $MANAGED;
    my $sport = free_port();
    my $s = server(args => [ '--max-workers', 1, '--max-requests', 5, '--min-worker-lifetime', 10,
                             '--status-listen', "127.0.0.1:$sport" ]);
    my %pids = map { ((get_raw($s->port, '/') || {})->{body} // '') =~ /pid=(\d+)/ ? ($1 => 1) : () } 1 .. 7;
    is(scalar keys %pids, 1, 'a young worker serves 7 requests at a count of 5');
    kill TERM => keys %pids;
    my $restarts = sub {
        my ($v) = parse_metrics((get_raw($sport, '/metrics') || {})->{body} // '');
        return $v->{qq{narwhal_worker_restarts_total{reason="$_[0]"}}} // -1;
    };
    ok(wait_until(sub { $restarts->('signal') == 1 }, 5), '... TERM from outside: counted as a signal');
    is($restarts->('max-requests'), 0, '... not as max-requests');
    $s->stop;
}};

# 6b. Under Server::Starter the status address is shared across a hand-over:
# the new generation opens it while the old one still holds it.
my $sec_starter = sub { SKIP: {
    skip 'needs the manager', 3 unless $MANAGED;
    missing('start_server is not installed', 3) unless -x '/usr/bin/start_server';
    my $sport = free_port();
    my $port = free_port();
    my $s = spawn_server(app => $APP, port => $port, command => [
        '/usr/bin/start_server', '--port', "127.0.0.1:$port", '--interval', 1, '--',
        narwhal_cmd(), '--max-workers', 1, '--status-listen', "127.0.0.1:$sport", $APP ]);
    my $first;
    ok(wait_until(sub { my $r = get_raw($sport, '/status.json'); $first = $r && eval { JSON::PP::decode_json($r->{body})->{master_pid} } }, 10),
       'the first generation answers on the status address');
    kill HUP => $s->pid;
    my $second;
    ok(wait_until(sub {
        my $r = get_raw($sport, '/status.json');
        $second = $r && eval { JSON::PP::decode_json($r->{body})->{master_pid} };
        $second && $second != $first;
    }, 15), 'after a HUP to start_server the new generation answers there');
    unlike($s->log_text, qr/cannot listen/, '... it could open the address');
    $s->stop;
}};

# 7. --drain-delay: on TERM, /health says 503 at once while the app is
# still served; the stop begins when the delay is over, or at once on a
# second signal.
my $sec_drain = sub {
    my $sport = free_port();
    my $s = server(args => [ '--drain-delay', 1.5,
                             ($MANAGED ? ('--status-listen', "127.0.0.1:$sport") : ()) ]);
    my $port = $s->port;
    wait_until(sub { worker_pids($s->pid) >= 1 }, 10);    # (a TERM before the master's handlers kills it)
    my $t0 = time;
    kill TERM => $s->pid;
    if ($MANAGED) {
        my $h;
        wait_until(sub { $h = get_raw($sport, '/health', 2); $h && $h->{status} == 503 }, 1);
        is($h && $h->{status}, 503, 'draining: /health says 503 at once');
        ok(time - $t0 < 1, '... well before the drain is over');
    }
    sleep 0.7;
    my $r = get_raw($port, '/');
    is($r && $r->{status}, 200, 'draining: a new connection is still served');
    is($r && $r->{headers}{connection}, 'close', '... with Connection: close, so clients move on before the stop');
    like($s->log_text, qr/draining for 1\.5 s/, 'the log says the server drains');
    my $status = $s->wait_exit(10);
    my $took = time - $t0;
    is($status, 0, 'then it stops cleanly');
    ok($took >= 1.5 && $took < 4, sprintf('... after the drain (%.1f s)', $took));
};
my $sec_drain_twice = sub {
    my $s2 = server(args => [ '--drain-delay', 30 ]);
    wait_until(sub { worker_pids($s2->pid) >= 1 }, 10);
    my $t0 = time;
    kill TERM => $s2->pid;
    ok(wait_until(sub { $s2->log_text =~ /draining for 30 s/ }, 5), 'a drain of 30 s begins')
        or diag $s2->log_text;
    kill TERM => $s2->pid;
    is($s2->wait_exit(10), 0, 'a second TERM during the drain stops at once');
    ok(time - $t0 < 3, sprintf('... (%.1f s, not 30)', time - $t0));
};

# The parts in six processes at once (the longest first): most of their
# time is spent waiting for timeouts, drains and held requests.
in_parallel(
    sub { $_->() for $sec_watchdog },
    sub { $_->() for $sec_drain, $sec_drain_twice },
    sub { $_->() for $sec_no_watchdog, $sec_rss, $sec_recycled },
    sub { $_->() for $sec_no_shed, $sec_refusals },
    sub { $_->() for $sec_starter, $sec_pages },
    sub { $_->() for $sec_shed, $sec_term_one, $sec_term_extended },
);

done_testing();
