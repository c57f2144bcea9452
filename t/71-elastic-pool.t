use strict;
use warnings;
use Test::More;
use Test2::IPC;    # (parts of this file run in processes of their own)
use lib 't/lib';
use IO::Select ();
use Time::HiRes qw(time sleep);
use NarwhalTest qw(spawn_server write_app wait_until free_port http_get worker_pids
                   raw_connect read_response run_cmd narwhal_cmd in_parallel);

# The elastic pool (--min-workers): it starts small, grows when requests
# wait (measured) or every worker is stuck, shrinks back when workers sit
# idle, and no request is lost on the way: a retired worker hands its
# kept-alive connections over.

my $APP = NarwhalTest::sleepy_app();

# Bad values: one line naming the flag, a non-zero exit.
my $part_bad = sub {
    for my $case ([ [ '--min-workers', 5, '--max-workers', 2 ], qr/--min-workers \(5\) must not exceed --max-workers \(2\)/ ],
                  [ [ '--min-workers', 0 ], qr/--min-workers must be at least 1/ ],
                  [ [ '--worker-idle-timeout', 'soon' ], qr/--worker-idle-timeout/ ]) {
        my ($args, $re) = @$case;
        my $r = run_cmd([ narwhal_cmd(), @$args, $APP ]);
        isnt($r->{code}, 0, "@$args: refused");
        like($r->{err}, $re, "... saying why");
        is(scalar(split /\n/, $r->{err}), 1, "... in one line");
    }
};

# (each part below has its own server and status address: they run at
# once; a server stops as its part ends and its guard goes, as no test
# here looks at the stop)
our $sport;
sub metrics { NarwhalTest::metrics_of($sport) }

# Each connection asks for $path again as soon as it has its answer, until
# $until, or until $enough (looked at every 0.1 s) says so; every answer
# is counted, and nothing is retried.
sub load {
    my ($path, $until, $conns, $enough) = @_;
    my @conns = @$conns;
    my (%ok, %bad, %buf);
    my $sel = IO::Select->new(@conns);
    syswrite($_, "GET $path HTTP/1.1\r\nHost: x\r\n\r\n") for @conns;
    my %open = map { ($_ => 1) } 0 .. $#conns;
    my $look = time + 0.1;
    while (%open && time < $until + 5) {
        if ($enough && time >= $look && time < $until) {
            $until = time if $enough->();
            $look = time + 0.1;
        }
        for my $h ($sel->can_read(0.2)) {
            my ($i) = grep { $conns[$_] == $h } 0 .. $#conns;
            my $n = sysread($h, $buf{$i}, 65536, length($buf{$i} // ''));
            if (!$n) { $bad{$i}++; $sel->remove($h); delete $open{$i}; next }
            while ($buf{$i} =~ s{^HTTP/1\.1 (\d+) [^\r]*\r\n.*?\r\n\r\nok\n}{}s) {
                $1 == 200 ? $ok{$i}++ : $bad{$i}++;
                if (time < $until) {
                    syswrite($h, "GET $path HTTP/1.1\r\nHost: x\r\n\r\n");
                } else {
                    delete $open{$i};
                }
            }
        }
    }
    my ($ok, $bad) = (0, 0);
    $ok += $_ for values %ok;
    $bad += $_ for values %bad;
    return ($ok, $bad + keys %open);
}

my $part_grow = sub {
    local $sport = free_port();
    my $s = spawn_server(app => $APP, args => [ '--min-workers', 1, '--max-workers', 3,
                                                '--worker-idle-timeout', 1,
                                                '--status-listen', "127.0.0.1:$sport" ]);
    ok(wait_until(sub { (metrics()->{narwhal_workers_wanted} // 0) == 1 }, 5), 'it starts with one worker');
    # (the manager answers, and the pool's size is published, before the
    # worker's fork is done)
    ok(wait_until(sub { worker_pids($s->pid) == 1 }, 5), '... one process')
        or diag 'workers: ' . join(' ', worker_pids($s->pid));
    my $m = metrics();
    is("$m->{narwhal_workers_min} $m->{narwhal_workers_max}", '1 3', 'min and max are published');

    # Six clients of a 50 ms app: requests wait, the pool grows to three.
    my @c = map { raw_connect($s->port) } 1 .. 6;
    my ($ok, $failed) = load('/sleep/0.05', time + 2.5, \@c);
    cmp_ok($ok, '>', 100, "six clients for 2.5 s: $ok answers");
    is($failed, 0, '... none failed');
    $m = metrics();
    is($m->{narwhal_workers_wanted}, 3, 'the pool grew to --max-workers');
    is(scalar(worker_pids($s->pid)), 3, '... three processes');
    # (which look sees it first: requests that waited over 10 ms, or the one
    # worker on a 50 ms request for 20 ms)
    is($m->{'narwhal_pool_changes_total{reason="grow_waited"}'}
       + $m->{'narwhal_pool_changes_total{reason="grow_stuck"}'}, 2, '... twice, because requests waited');
    like($s->log_text, qr/pool: 1 -> 2 workers: (\d+ of \d+ requests waited over 10 ms|every worker has been on its request for 20 ms)/,
         '... and said why');

    # Quiet: back to one within the idle timeout and a tick or two, and the
    # kept-alive clients still get answers on their connections.
    ok(wait_until(sub { metrics()->{narwhal_workers_wanted} == 1 }, 5), 'idle: the pool shrinks to --min-workers');
    ok(wait_until(sub { worker_pids($s->pid) == 1 }, 5), '... one process left');
    is(metrics()->{'narwhal_pool_changes_total{reason="shrink_idle"}'}, 2, '... counted');
    like($s->log_text, qr/pool: 3 -> 2 workers: worker \d+ was idle for 1\.\d s/, '... and said');
    ($ok, $failed) = load('/', time, \@c);
    is("$ok $failed", '6 0', 'every kept-alive client is still answered on its connection');
};

my $part_stuck = sub {
    local $sport = free_port();
    my $sock = NarwhalTest::tmpdir() . '/stuck.sock';
    my $s = spawn_server(app => $APP, unix => $sock,
                         args => [ '--min-workers', 1, '--max-workers', 3, '--worker-idle-timeout', 1,
                                   '--status-listen', "127.0.0.1:$sport" ]);
    ok(wait_until(sub { (metrics()->{narwhal_workers_wanted} // 0) == 1 }, 5), 'stuck: it starts with one worker');

    # A worker stuck on one long request: alone, that is one slow client, and
    # another worker would sit idle. A new client that comes meanwhile waits
    # (in the listen queue, then in the manager, and no request of it begins
    # to be measured): the pool grows because the worker is stuck and a
    # client waits. (On a server of its own, at one worker as the one above
    # is once idle. The long request comes on a unix socket, where no wait
    # is measured: on a loaded machine its worker's wake-up can take over
    # 10 ms, and the pool would rightly grow because it waited.)
    my $stuck0 = metrics()->{'narwhal_pool_changes_total{reason="grow_stuck"}'};
    my $long = raw_connect($sock);
    syswrite($long, "GET /sleep/2 HTTP/1.1\r\nHost: x\r\n\r\n");
    sleep 0.5;
    is(metrics()->{narwhal_workers_wanted}, 1, 'one slow client alone: no second worker');
    my $t0 = time;
    my $quick = raw_connect($s->port);
    syswrite($quick, "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    my $r = read_response($quick, 5);
    is($r && $r->{status}, 200, 'a new client meanwhile is answered');
    cmp_ok(time - $t0, '<', 0.8, sprintf('... by a worker added for it (%.3f s)', time - $t0));
    is(metrics()->{'narwhal_pool_changes_total{reason="grow_stuck"}'} - $stuck0, 1,
       '... because the worker was stuck and a client waited');
    is(read_response($long, 5)->{status}, 200, 'the long request finishes');
};

my $part_slow = sub {
    local $sport = free_port();
    # An app that takes 1.5 s to load in each worker (--no-preload-app), once
    # the file $slow exists (made when the first worker is ready: the part
    # would only wait for it, and for the master's check that the app
    # loads): the pool grows by one step, then waits for the new workers to
    # be ready before it looks at the waits again (they waited while those
    # loaded).
    my $slow = NarwhalTest::tmpdir() . '/slow-app';
    my $SLOW = write_app("Time::HiRes::sleep(1.5) if -e '$slow';\n" . <<'APP');
sub {
    my $env = shift;
    Time::HiRes::sleep($1) if $env->{PATH_INFO} =~ m{^/sleep/([\d.]+)};
    [200, ['Content-Type' => 'text/plain'], ["ok\n"]];
}
APP
    my $s = spawn_server(app => $SLOW, args => [ '--min-workers', 1, '--max-workers', 8, '--no-preload-app',
                                              '--status-listen', "127.0.0.1:$sport" ]);
    ok(wait_until(sub { (metrics()->{'narwhal_workers{state="idle"}'} // 0) == 1 }, 10), 'slow app: one worker ready');
    open(my $fh, '>', $slow) or die "$slow: $!";
    my @c = map { raw_connect($s->port) } 1 .. 4;
    my ($ok, $failed) = load('/sleep/0.05', time + 0.8, \@c);
    is(metrics()->{narwhal_workers_wanted}, 2, 'while the added worker loads, the pool grows no further (2, not 8)');
    # (on until the pool is at four, for 3 s at most)
    ($ok, $failed) = load('/sleep/0.05', time + 3, \@c, sub { metrics()->{narwhal_workers_wanted} >= 4 });
    is($failed, 0, '... no request failed');
    cmp_ok(metrics()->{narwhal_workers_wanted}, '>=', 4, '... and grows on once it serves');
};

# With no manager and only a unix socket, nothing shows a wait: said.
my $part_blind = sub {
    my $sock = NarwhalTest::tmpdir() . '/blind.sock';
    my $s = spawn_server(app => $APP, unix => $sock, no_listen => 1,
                      args => [ '--no-manager', '--min-workers', 1 ]);
    ok(wait_until(sub { $s->log_text =~ /master warn: --min-workers with --no-manager on unix sockets only: no waiting request can be seen, so the pool stays at 1 workers/ }, 5),
       'a pool that cannot see waiting says so at start');
};

# The parts at once: their servers are their own, and they wait (for
# sleeping requests, idle timeouts, an app that loads slowly) more than
# they compute.
# (the parts that watch the pool read it from --status-listen, which the
# connection manager answers: with --no-manager in NARWHAL_TEST_ARGS they
# are skipped)
my $watched = sub {
    my ($part, $n) = @_;
    return sub { SKIP: {
        skip 'the pool is watched through --status-listen, which needs the connection manager', $n
            unless NarwhalTest::managed();
        $part->();
    } };
};
in_parallel($watched->($part_grow, 1), $watched->($part_slow, 1),
            sub { $part_blind->(); $part_bad->(); $watched->($part_stuck, 1)->() });
done_testing();
