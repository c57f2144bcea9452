use strict;
use warnings;
use Test::More;
use Test2::IPC;    # (parts of this file run in processes of their own)
use lib 't/lib';
use File::Spec ();
use Fcntl ();
use IO::Socket::INET ();
use POSIX ();
use Time::HiRes qw(time sleep);
use NarwhalTest qw(free_port spawn_server write_app tmpdir wait_until perl_cmd
                   run_cmd http_get children_of pid_alive narwhal_cmd root
                   raw_connect raw_request read_response worker_pids
                   manager_fallback missing in_parallel);

# Real processes and signals: graceful stop, HUP, worker replacement and
# recycling, TTIN/TTOU, USR1, Server::Starter, systemd socket activation,
# back-off on failing workers, orphaned workers.

my $ROOT = root();
my $TMP  = tmpdir();
my @NM = manager_fallback();    # --no-manager until the manager program is built
my $MANAGED = NarwhalTest::managed();    # (and not turned off by NARWHAL_TEST_ARGS)
diag 'narwhal-manager is not built: servers run with --no-manager' if @NM;
my @XARGS = NarwhalTest::extra_args();    # NARWHAL_TEST_ARGS (spawn_server adds them itself)

# pid=<worker pid> gen=<Server::Starter generation> fds=<LISTEN_FDS>;
# /sleep?SECONDS sleeps that long even across signals; /die/WORD dies.
my $APP = write_app(<<'APP');
use strict;
use Time::HiRes ();
my $gen = $ENV{SERVER_STARTER_GENERATION} // '-';
sub {
    my $env = shift;
    my $path = $env->{PATH_INFO};
    if ($path eq '/sleep') {
        my $end = Time::HiRes::time() + ($env->{QUERY_STRING} || 1);
        while ((my $left = $end - Time::HiRes::time()) > 0) {
            select(undef, undef, undef, $left);
        }
    }
    die "app-error-$1\n" if $path =~ m{^/die/(\w+)};
    return [200, ['Content-Type' => 'text/plain'],
            ["pid=$$ gen=$gen fds=" . ($ENV{LISTEN_FDS} // 'none') . "\n"]];
}
APP

# Every master, worker and manager started here, to check that nothing is
# left: a file, as the parts run in processes of their own.
my $STARTED = File::Spec->catfile($TMP, 'started-pids');
sub started {
    open(my $fh, '>>', $STARTED) or die "$STARTED: $!";
    print $fh "$_\n" for grep { $_ } @_;
    close $fh;
}

sub server {
    my (%a) = @_;
    my $s = spawn_server(app => $APP, %a, args => [ @NM, @{ $a{args} || [] } ]);
    started($s->pid);
    return $s;
}

sub workers {
    my ($s, $master) = @_;
    $master //= $s->pid;
    started(children_of($master));    # the manager too
    my @w = worker_pids($master);
    return @w;
}

sub wait_workers {
    my ($s, $n, $timeout) = @_;
    return wait_until(sub { my @w = workers($s); @w == $n ? \@w : undef }, $timeout // 5);
}

sub get_pid {
    my ($port, $path, $http) = @_;
    my $res = http_get($port, $path // '/', $http);
    return $res->{status} == 200 && $res->{content} =~ /pid=(\d+)/ ? $1 : undef;
}

sub slurp { open(my $fh, '<', $_[0]) or return ''; local $/; return <$fh> // '' }

sub refused {
    my ($port) = @_;
    my $c = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port, Timeout => 2);
    return !$c;
}

# A client in its own process: keep-alive HTTP::Tiny GETs in a loop for
# $seconds; one line per request in a file.
# A keep-alive client in a child: requests one after the other for
# $seconds, or, given $stop_file, until that file exists ($seconds at most).
sub start_client_loop {
    my ($port, $seconds, $stop_file) = @_;
    my $out = File::Spec->catfile($TMP, "loop-$port-" . int(rand 1e9));
    my $pid = fork // die "fork: $!";
    if (!$pid) {
        require HTTP::Tiny;
        # (a long timeout: a request lost would still fail it; a worker
        # starved of CPU by the rest of a parallel suite would not)
        my $http = HTTP::Tiny->new(timeout => 15, keep_alive => 1);
        open(my $fh, '>', $out) or POSIX::_exit(1);
        $fh->autoflush(1);
        my $end = time + $seconds;
        while (time < $end && !($stop_file && -e $stop_file)) {
            my $r = $http->get("http://127.0.0.1:$port/");
            if ($r->{status} == 200 && $r->{content} =~ /pid=(\d+) gen=(\S+)/) {
                print $fh "ok $1 $2\n";
            } else {
                (my $c = $r->{content} // '') =~ s/\s+/ /g;
                print $fh "fail $r->{status} $c\n";
            }
            sleep 0.005;
        }
        close $fh;
        POSIX::_exit(0);
    }
    return { pid => $pid, out => $out, seconds => $seconds };
}

# What a client loop has been answered so far, in order: [ pid, generation ] each.
sub loop_answers {
    my ($loop) = @_;
    return map { /^ok (\d+) (\S+)/ ? [ $1, $2 ] : () } split /\n/, slurp($loop->{out});
}

sub finish_client_loop {
    my ($loop) = @_;
    my $done = wait_until(sub { waitpid($loop->{pid}, POSIX::WNOHANG()) == $loop->{pid} },
                          $loop->{seconds} + 15);
    if (!$done) { kill KILL => $loop->{pid}; waitpid($loop->{pid}, 0) }
    my %r = (ok => 0, fail => 0, pids => [], gens => [], errors => []);
    my %seen;
    for (split /\n/, slurp($loop->{out})) {
        if (/^ok (\d+) (\S+)/) {
            $r{ok}++;
            push @{ $r{pids} }, $1 unless $seen{"p$1"}++;
            push @{ $r{gens} }, $2 unless $seen{"g$2"}++;
        } else {
            $r{fail}++;
            push @{ $r{errors} }, $_;
        }
    }
    return \%r;
}

# (a) Graceful stop: a request in flight finishes, then the master exits 0;
# a connection made during the stop is served or refused, never reset
# (t/41-graceful.t has the listen queue drained), and refused once the
# server is gone.
my $sec_a = sub { {
    my $s = server(args => [ '--max-workers', '2' ]);
    my $port = $s->port;
    workers($s);
    my $c = raw_connect($port) or die "connect: $!";
    syswrite($c, "GET /sleep?1.5 HTTP/1.1\r\nHost: x\r\n\r\n");
    sleep 0.3;
    my $t0 = time;
    kill TERM => $s->pid;
    sleep 0.2;
    my $late = raw_connect($port);
    if ($late) {
        syswrite($late, "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
        my $r = read_response($late, 5);
        ok($r && $r->{status} == 200, 'after TERM: a new connection is served (not reset)');
    } else {
        pass('after TERM: a new connection is refused');
    }
    my $res = read_response($c, 5);
    ok($res, 'the request in flight gets a response');
    is($res && $res->{status}, 200, 'in flight: 200');
    like($res && $res->{body}, qr/^pid=\d+ gen=/, 'in flight: the full body');
    my $status = $s->wait_exit(6);
    my $took = time - $t0;
    is($status, 0, 'the master exits with status 0 after TERM');
    cmp_ok($took, '>=', 0.9, 'the master waited for the request in flight');
    cmp_ok($took, '<', 4, 'and exited soon after it (bounded)');
    ok(refused($port), 'once the server is gone, new connections are refused');
}};

# (b) --graceful-timeout 1: requests that take too long are cut short.
my $sec_b = sub { {
    my $s = server(args => [ '--max-workers', '1', '--graceful-timeout', '1' ]);
    my ($w) = @{ wait_workers($s, 1) || [] };
    my $c = raw_connect($s->port) or die "connect: $!";
    syswrite($c, "GET /sleep?10 HTTP/1.1\r\nHost: x\r\n\r\n");
    sleep 0.3;
    my $t0 = time;
    kill TERM => $s->pid;
    my $status = $s->wait_exit(8);
    my $took = time - $t0;
    ok(defined $status, '--graceful-timeout 1: the master exits');
    cmp_ok($took, '>=', 0.8, 'not before the graceful timeout');
    cmp_ok($took, '<=', 3, 'within about 1-3 s, not after the 10 s request');
    ok(wait_until(sub { !pid_alive($w) }, 2), 'the busy worker was KILLed');
}};

# (c) HUP twice under a steady keep-alive client: no failed request, new workers.
my $sec_c = sub { {
    my $s = server(args => [ '--max-workers', '2' ]);
    my $port = $s->port;
    my $before = wait_workers($s, 2) || [];
    # (the client runs until the second generation of new workers is in
    # place: under a loaded parallel suite each can take seconds)
    my $stop = File::Spec->catfile($TMP, "hup-client-stop-$port");
    my $loop = start_client_loop($port, 30, $stop);
    ok(wait_until(sub { loop_answers($loop) >= 10 }, 10), 'HUP: the client is at work');
    kill HUP => $s->pid;
    # the second HUP once the first generation has been replaced
    my %first = map { $_ => 1 } @$before;
    my $second = wait_until(sub {
        my @w = workers($s);
        return @w == 2 && !grep({ $first{$_} } @w) ? \@w : undef;
    }, 10) || [];
    my $answered = loop_answers($loop);
    ok(wait_until(sub { loop_answers($loop) >= $answered + 5 }, 10),
       'HUP: the client goes on after the first generation is replaced');
    kill HUP => $s->pid;
    my %was = map { $_ => 1 } @$second;
    my $third = wait_until(sub {
        my @w = workers($s);
        return @w == 2 && !grep({ $was{$_} } @w) ? \@w : undef;
    }, 10) || [];
    # (the client's next requests reach them: it goes on until one of them
    # has answered it)
    my %newest = map { $_ => 1 } @$third;
    ok(wait_until(sub { my @a = loop_answers($loop); @a && $newest{ $a[-1][0] } }, 10),
       'HUP twice: the newest workers answer the client');
    open(my $stop_fh, '>', $stop) or die "$stop: $!";
    close $stop_fh;
    my $r = finish_client_loop($loop);
    cmp_ok($r->{ok}, '>', 20, "HUP: the client made requests ($r->{ok})");
    is($r->{fail}, 0, 'HUP: zero failed requests') or diag join "\n", @{ $r->{errors} }[0 .. 4];
    # (its connection goes from a retiring worker to another, so it may skip
    # a generation; its last answers are the newest workers')
    ok(@{ $r->{pids} } >= 2 && $newest{ $r->{pids}[-1] }, 'HUP: the client was served by new workers')
        or diag "pids: @{ $r->{pids} }; the newest workers: @$third";
    my %old = map { $_ => 1 } @$before;
    ok(wait_until(sub { my @w = workers($s); @w == 2 && !grep { $old{$_} } @w }, 5),
       'HUP: all workers replaced') or diag "before @$before, now @{[ workers($s) ]}";
    is($s->stop, 0, 'HUP: stops with status 0');
}};

# (d) A worker killed with KILL is replaced.
my $sec_d = sub { {
    my $s = server(args => [ '--max-workers', '2' ]);
    my $port = $s->port;
    my $before = wait_workers($s, 2) || [];
    my $victim = $before->[0];
    kill KILL => $victim;
    my $after = wait_until(sub {
        my @w = workers($s);
        (@w == 2 && !grep { $_ == $victim } @w) ? \@w : undef;
    }, 5);
    ok($after, 'a killed worker is replaced') or diag "now: @{[ workers($s) ]}";
    my %old = map { $_ => 1 } @$before;
    ok($after && (grep { !$old{$_} } @$after), 'by a new process');
    my $good = grep { defined get_pid($port) } 1 .. 10;
    is($good, 10, 'requests keep working');
    like($s->log_text, qr/worker $victim was killed by signal 9/, 'the master logs the death');
    $s->stop;
}};

# (e) Recycling: --max-reqs-per-child 5 with one worker.
my $sec_e = sub { {
    my $s = server(args => [ '--max-workers', '1', '--max-reqs-per-child', '5',
                            '--min-worker-lifetime', 0 ]);
    my $port = $s->port;
    my (%count, $bad);
    for (1 .. 12) {
        my $pid = get_pid($port);
        defined $pid ? $count{$pid}++ : $bad++;
    }
    ok(!$bad, '--max-reqs-per-child 5: 12 requests succeed');
    cmp_ok(scalar keys %count, '>=', 3, 'at least 3 workers served them')
        or diag explain \%count;
    ok(!grep({ $_ > 5 } values %count), 'none served more than 5');

    # The same over one keep-alive connection.
    require HTTP::Tiny;
    my $http = HTTP::Tiny->new(timeout => 5, keep_alive => 1);
    my %ka;
    $bad = 0;
    for (1 .. 12) {
        my $pid = get_pid($port, '/', $http);
        defined $pid ? $ka{$pid}++ : $bad++;
    }
    ok(!$bad, 'keep-alive: 12 requests succeed');
    cmp_ok(scalar keys %ka, '>=', 3, 'keep-alive: at least 3 workers served them');
    $s->stop;

    $s = server(args => [ '--max-workers', '1', '--min-reqs-per-child', '2',
                          '--max-reqs-per-child', '4', '--min-worker-lifetime', 0 ]);
    $port = $s->port;
    my @seq = map { get_pid($port) // 'fail' } 1 .. 12;
    ok(!grep({ $_ eq 'fail' } @seq), '--min-reqs-per-child accepted, requests succeed');
    my %n;
    $n{$_}++ for @seq;
    ok(!grep({ $_ > 4 } values %n), 'with --min-reqs-per-child 2: at most 4 per worker')
        or diag "@seq";
    my @runs = grep { $_ ne $seq[-1] } keys %n;    # the last may be unfinished
    ok(!grep({ $n{$_} < 2 } @runs), 'and at least 2 per worker') or diag "@seq";
    $s->stop;
}};

# (e, continued) --min-worker-lifetime: a worker at its count younger than
# that is given the count again, and replaced at the end of the first count
# it finishes older (10 s keeps one worker for 12 requests; with a count
# given and no --min-worker-lifetime, there is no floor: t/35).
my $sec_e_lifetime = sub { {
    my $s = server(args => [ '--max-workers', '1', '--max-reqs-per-child', '5', '--min-worker-lifetime', 10 ]);
    my @seq = map { get_pid($s->port) // 'fail' } 1 .. 12;
    is(join(' ', keys %{{ map { $_ => 1 } @seq }}), $seq[0],
       '--max-reqs-per-child 5 --min-worker-lifetime 10: one worker for 12 requests');
    $s->stop;
    $s = server(args => [ '--max-workers', '1', '--max-reqs-per-child', '5',
                          '--min-worker-lifetime', 1 ]);
    my $t0 = time;
    @seq = (get_pid($s->port) // 'fail');
    my $born_by = time;    # (the worker answered: it was born by now, maybe after $t0)
    push @seq, map { get_pid($s->port) // 'fail' } 2 .. 7;
    ok(time - $t0 < 0.9 && !grep({ $_ ne $seq[0] } @seq),
       '--min-worker-lifetime 1: a young worker serves 7 requests of a count of 5') or diag "@seq";
    sleep 1.2 - (time - $born_by) if time - $born_by < 1.2;
    push @seq, map { get_pid($s->port) // 'fail' } 8 .. 13;
    is(scalar(grep { $_ eq $seq[0] } @seq), 10, '... and is replaced at the end of its second count')
        or diag "@seq";
    ok($seq[10] ne 'fail' && $seq[10] ne $seq[0] && !grep({ $_ ne $seq[10] } @seq[10 .. 12]),
       '... by one worker that serves the rest') or diag "@seq";
    $s->stop;
}};

# (e2) With the manager, a recycled worker's replacement starts before it
# leaves: with 1/20 of its requests left (2 of 40) the master forks the next
# worker, so the pool never lacks one; the old worker still serves at most
# its 40, and one that does not reach them is retired REPLACE_LINGER (10 s;
# 1 s here, set for tests by NARWHAL_TEST_REPLACE_LINGER) later, counted as
# max-requests. One replaced worker at a time; one that crashes meanwhile
# counts as a crash.
# (four servers, each a part of its own that can run beside the others)
my $LINGER = 1;
my %linger = (env => { NARWHAL_TEST_REPLACE_LINGER => $LINGER });
my $metric = sub {      # narwhal_worker_restarts_total{reason=...}
    my ($sport, $reason) = @_;
    my $res = http_get($sport, '/metrics');
    return $res->{content} =~ /^narwhal_worker_restarts_total\{reason="\Q$reason\E"\} (\d+)/m ? $1 : -1;
};
my $sec_e2_recycle = sub { SKIP: {
    skip 'early replacement needs the connection manager', 5 unless $MANAGED;
    my $sport = free_port();
    my $s = server(args => [ '--max-workers', '1', '--max-reqs-per-child', '40',
                            '--min-worker-lifetime', 0, '--status-listen', "127.0.0.1:$sport" ]);
    my $port = $s->port;
    my ($old) = @{ wait_workers($s, 1) || [] };
    my @seq = map { get_pid($port) // 'fail' } 1 .. 38;
    is(scalar(grep { $_ eq ($old // '') } @seq), 38, '38 requests, all by the one worker');
    my $two = wait_workers($s, 2, 3);
    ok($two && grep({ $_ == $old } @$two), '2 requests before its limit, its replacement runs beside it')
        or diag 'workers: ' . join(' ', workers($s));
    # (at its count, a worker whose replacement is not ready yet serves on:
    # t/47-recycling.t)
    wait_until(sub { http_get($sport, '/metrics')->{content} =~ /^narwhal_workers\{state="idle"\} 2$/m }, 5)
        or diag 'the replacement did not become ready';
    my %n;
    for (1 .. 60) {
        my $pid = get_pid($port) // 'fail';
        $n{$pid}++;
        last if !pid_alive($old) && $pid ne $old;
    }
    ok(!$n{fail}, 'requests meanwhile all answered') or diag explain \%n;
    cmp_ok(38 + ($n{$old} // 0), '<=', 40, 'the old worker served at most its 40');
    ok(wait_workers($s, 1, 12), 'one worker again afterwards');
    $s->stop;
}};

my $sec_e2_linger = sub { SKIP: {
    skip 'early replacement needs the connection manager', 8 unless $MANAGED;
    my $sport = free_port();
    my $s = server(%linger, args => [ '--max-workers', '1', '--max-reqs-per-child', '40',
                                   '--min-worker-lifetime', 0,
                                   '--status-listen', "127.0.0.1:$sport" ]);
    my $port = $s->port;
    my ($old) = @{ wait_workers($s, 1) || [] };
    get_pid($port) for 1 .. 38;
    my $t0 = time;
    ok(wait_workers($s, 2, 3), 'no more requests: the replacement runs beside the old worker');
    my $left = wait_until(sub { pid_alive($old) ? undef : 1 }, $LINGER + 6);
    my $took = time - $t0;
    ok($left && $took >= $LINGER - 0.5,
       sprintf('the old worker is retired about REPLACE_LINGER (%d s) later (%.1f s)', $LINGER, $took));
    my $now = get_pid($port);
    ok($now && $now ne $old, '... and its replacement serves');
    ok(wait_until(sub { $metric->($sport, 'max-requests') == 1 }, 3),
       '... its exit counted as max-requests') or diag $metric->($sport, 'max-requests');
    unlike($s->log_text, qr/died|killed|exited with/, '... nothing in the log says it died');

    # The replacement (now the only worker) asks in turn and is killed by
    # SEGV before its count: a crash, not a recycle.
    get_pid($port) for 2 .. 38;
    ok(wait_workers($s, 2, 3), 'its replacement asked for one in turn');
    kill SEGV => $now;
    ok(wait_until(sub { $metric->($sport, 'crash') == 1 }, 5), 'killed by SEGV meanwhile: counted as a crash');
    is($metric->($sport, 'max-requests'), 1, '... and not as max-requests');
    $s->stop;
}};

my $sec_e2_two = sub { SKIP: {
    skip 'early replacement needs the connection manager', 1 unless $MANAGED;

    # Two workers asking at once: one is replaced early, the other only as
    # it exits (one worker more than --max-workers, not two). A limit of
    # 200 asks at 190: requests go over one keep-alive connection per
    # worker until each original worker has served 190 (the responses say
    # which served them; under load the manager may pass one elsewhere).
    my $s = server(args => [ '--max-workers', '2', '--max-reqs-per-child', '200',
                            '--min-worker-lifetime', 0 ]);
    my $port = $s->port;
    my @orig = @{ wait_workers($s, 2) || [] };
    require HTTP::Tiny;
    my (%conn_of, %count);
    for (1 .. 40) {
        last if keys %conn_of == 2;
        my $http = HTTP::Tiny->new(timeout => 5, keep_alive => 1);
        my $pid = get_pid($port, '/', $http) // next;
        $count{$pid}++;
        $conn_of{$pid} //= $http;
    }
    for (1 .. 600) {
        my ($behind) = grep { ($count{$_} // 0) < 190 } @orig or last;
        my $pid = get_pid($port, '/', $conn_of{$behind} || HTTP::Tiny->new(keep_alive => 1)) // next;
        $count{$pid}++;
    }
    my @asked = grep { ($count{$_} // 0) >= 190 && pid_alive($_) } @orig;
    sleep 1;
    SKIP: {
        skip "both workers did not reach 190 together (@{[ %count ]})", 1 unless @asked == 2;
        is(scalar workers($s), 3, 'two workers near their count: three workers, not four')
            or diag 'workers: ' . join(' ', workers($s)) . "; served: @{[ %count ]}";
    }
    $s->stop;
}};

my $sec_e2_broken = sub { SKIP: {
    skip 'early replacement needs the connection manager', 4 unless $MANAGED;

    # The replacement cannot start (--no-preload-app, code now broken):
    # the old worker is not retired after REPLACE_LINGER, it goes on serving.
    my $marker = File::Spec->catfile($TMP, 'replacement-fails');
    my $app = write_app(<<"APP");
exit 3 if -e '$marker';
sub { [200, ['Content-Type' => 'text/plain'], ["pid=\$\$\\n"]] };
APP
    my $s = server(%linger, app => $app, args => [ '--max-workers', '1', '--max-reqs-per-child', '40',
                                                   '--min-worker-lifetime', 0,
                                                   '--no-preload-app' ]);
    my $port = $s->port;
    my $old = get_pid($port);      # (loaded: the code may break from now on)
    open(my $m, '>', $marker) or die $!;
    close $m;
    get_pid($port) for 2 .. 38;
    ok(wait_until(sub { $s->log_text =~ /exited with status 3/ }, 3), 'broken code: the replacement fails');
    # Past REPLACE_LINGER the master retires the old worker at its next
    # look, if a replacement is ready. It looks as it reaps each failed
    # start (they back off: 0.1 s, 0.2 s, 0.4 s ... apart): one reaped
    # once REPLACE_LINGER is over proves that it has looked since.
    sleep $LINGER;    # (counted from the failure: the worker was replaced before)
    my $failed = sub { scalar(() = $s->log_text =~ /exited with status 3/g) };
    my $n = $failed->();
    ok(wait_until(sub { $failed->() > $n }, 10), 'a start failed after REPLACE_LINGER');
    ok(pid_alive($old), "the old worker is still there after REPLACE_LINGER ($LINGER s) and more")
        or diag $s->log_text;
    is(get_pid($port), $old, '... and serves');
    unlink $marker;
    $s->stop;
}};

# (f) TTIN / TTOU change the number of workers.
my $sec_f = sub { {
    # (with the manager, its status listener says how many the master wants)
    my $managed = NarwhalTest::managed();
    my $sport = free_port();
    my $s = server(args => [ '--max-workers', '2', ($managed ? ('--status-listen', "127.0.0.1:$sport") : ()) ]);
    ok(wait_workers($s, 2), 'two workers to start with');
    kill TTIN => $s->pid;
    ok(wait_workers($s, 3), 'TTIN: three workers');
    kill TTIN => $s->pid;
    ok(wait_workers($s, 4), 'TTIN again: four workers');
    kill TTOU => $s->pid;
    ok(wait_workers($s, 3), 'TTOU: three workers') or diag "now: @{[ workers($s) ]}";
    kill TTOU => $s->pid;
    sleep 0.1;
    kill TTOU => $s->pid;
    ok(wait_workers($s, 1), 'TTOU twice more: one worker') or diag "now: @{[ workers($s) ]}";
    # One more TTOU, then USR2: the master handles the signals that came
    # before USR2 in the pass that logs its counts (or in an earlier one).
    my $usr2_lines = sub { scalar(() = $s->log_text =~ / master \w+: USR2 from [^:]*: (?:manager |no manager counts)/mg) };
    my $before = $usr2_lines->();
    kill TTOU => $s->pid;
    kill USR2 => $s->pid;
    ok(wait_until(sub { $usr2_lines->() > $before }, 5), 'TTOU at one worker, then USR2: the master has handled both');
    if ($managed) {
        my ($wanted) = http_get($sport, '/metrics')->{content} =~ /^narwhal_workers_wanted (\d+)/m;
        is($wanted, 1, '... it still wants one worker');
    } else {
        sleep 1.2;    # (no status listener without the manager: let a retirement show)
    }
    is(scalar(workers($s)), 1, 'TTOU never goes below one worker');
    ok(defined get_pid($s->port), 'still serving');
    $s->stop;
}};

# (g) USR1 reopens the error log.
my $sec_g = sub { {
    my $log = File::Spec->catfile($TMP, 'usr1.log');
    my $s = server(args => [ '--max-workers', '2', '--error-log', $log ]);
    my $port = $s->port;
    wait_workers($s, 2);
    is(http_get($port, '/die/first')->{status}, 500, 'an app error: 500');
    ok(wait_until(sub { slurp($log) =~ /app-error-first/ }, 3), 'logged in the error log');
    rename $log, "$log.old" or die "rename: $!";
    kill USR1 => $s->pid;
    ok(wait_until(sub { -e $log }, 3), 'USR1: the master reopens the log file');
    sleep 0.5;    # the workers reopen theirs when the master passes USR1 on
    http_get($port, "/die/second$_") for 1 .. 4;    # reach both workers
    ok(wait_until(sub { slurp($log) =~ /app-error-second/ }, 3),
       'the new log file gets app errors') or diag 'new log: ' . slurp($log);
    my @in_new = slurp($log) =~ /app-error-second(\d)/g;
    is(scalar @in_new, 4, 'all four errors go to the new file');
    unlike(slurp("$log.old"), qr/app-error-second/, 'the old file gets no new errors');
    $s->stop;
}};

# (h) Server::Starter hand-over (TCP), and a unix socket through it.
my $sec_h = sub { SKIP: {
    my $starter = '/usr/bin/start_server';
    missing('start_server is not installed', 9) unless -x $starter;
    my $port = free_port();
    my $pidf = File::Spec->catfile($TMP, "starter-$port.pid");
    my $stat = File::Spec->catfile($TMP, "starter-$port.status");
    my $s = spawn_server(port => $port, command => [
        $starter, '--port', "127.0.0.1:$port", '--pid-file', $pidf, '--status-file', $stat,
        '--', narwhal_cmd(), @NM, @XARGS, '--max-workers', '2', $APP ]);
    my $first = http_get($port, '/');
    is($first->{status}, 200, 'start_server: requests work');
    like($first->{content}, qr/gen=1\b/, 'start_server: generation 1 answers');
    my ($gen1_master) = children_of($s->pid);
    started($gen1_master);
    workers($s, $gen1_master) if $gen1_master;
    ok(wait_until(sub { -s $stat }, 5), 'start_server wrote its status file');
    # (the client goes on until the old master is gone and generation 2
    # has answered it five times since)
    my $stop = File::Spec->catfile($TMP, "starter-client-stop-$port");
    my $loop = start_client_loop($port, 30, $stop);
    ok(wait_until(sub { loop_answers($loop) >= 10 }, 10), 'hand-over: the client is at work');
    my $r = run_cmd([ $starter, '--restart', '--pid-file', $pidf, '--status-file', $stat ],
                    timeout => 10);
    is($r->{code}, 0, 'start_server --restart') or diag $r->{err};
    my $gen1_gone = !$gen1_master || wait_until(sub { !pid_alive($gen1_master) }, 5);
    my $by_gen2 = sub { scalar grep { $_->[1] eq '2' } loop_answers($loop) };
    my $since = $by_gen2->();
    ok(wait_until(sub { $by_gen2->() >= $since + 5 }, 10), 'hand-over: generation 2 answers the client');
    open(my $stop_fh, '>', $stop) or die "$stop: $!";
    close $stop_fh;
    my $res = finish_client_loop($loop);
    cmp_ok($res->{ok}, '>', 20, "hand-over: the client made requests ($res->{ok})");
    is($res->{fail}, 0, 'hand-over: zero failed requests') or diag join "\n", @{ $res->{errors} }[0 .. 4];
    ok((grep { $_ eq '2' } @{ $res->{gens} }), 'hand-over: generation 2 served the client')
        or diag "generations: @{ $res->{gens} }";
    like(http_get($port, '/')->{content}, qr/gen=2\b/, 'after the hand-over: generation 2 answers');
    ok($gen1_gone, 'the old narwhal master exited') if $gen1_master;
    $s->stop;
}};
my $sec_h_unix = sub { SKIP: {
    my $starter = '/usr/bin/start_server';
    missing('start_server is not installed', 1) unless -x $starter;
    my $path = File::Spec->catfile($TMP, 'starter.sock');
    my $s = spawn_server(unix => $path, no_listen => 1, command => [
        $starter, '--path', $path, '--', narwhal_cmd(), @NM, @XARGS, '--max-workers', '1', $APP ]);
    my $raw = raw_request($path, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 5);
    like($raw, qr{^HTTP/1\.1 200 .*pid=\d+ gen=1}s, 'start_server --path: served on the unix socket');
    $s->stop;
}};

# (i) systemd socket activation: fd 3, LISTEN_FDS=1, LISTEN_PID=<its pid>.
my $sec_i = sub { {
    my $lsock = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => 0,
                                      Listen => 128, ReuseAddr => 1) or die "listen: $!";
    my $port = $lsock->sockport;
    my $s = server(port => $port, no_listen => 1, args => [ '--max-workers', '2', '--listen-queues', 2 ],
                   env => { LISTEN_FDS => 1 },
                   # Raw descriptors only: whatever fd 3 was in this process (an
                   # inherited lock, the listener itself) becomes a copy of the
                   # listener without close-on-exec, and no Perl handle that
                   # could close it again is made.
                   child_setup => sub {
                       my $copy = POSIX::dup(fileno($lsock)) // POSIX::_exit(126);
                       if ($copy != 3) {
                           defined POSIX::dup2($copy, 3) or POSIX::_exit(126);
                           POSIX::close($copy);
                       }
                       $ENV{LISTEN_PID} = $$;
                   },
                   # This process listens on the port too: only the master's
                   # own word says that it runs.
                   ready => sub { $_[0]->log_text =~ /listening on/ });
    close $lsock;
    my $res = http_get($port, '/');
    is($res->{status}, 200, 'socket activation: requests on the passed socket work');
    like($res->{content}, qr/fds=none/, 'LISTEN_FDS is not passed on to the app');
    like($s->log_text, qr/listening on 127\.0\.0\.1:$port/, 'the master uses the passed socket');
    like($s->log_text, qr/warn: --listen-queues does not apply to sockets from Server::Starter or systemd/,
         '... and says that --listen-queues does not apply to it');
    ok(wait_workers($s, 2), 'with its workers');
    is($s->stop, 0, 'socket activation: stops with status 0');
}};

# (j) Workers that die at once: the master backs off instead of looping.
my $sec_j = sub { {
    my $marker = File::Spec->catfile($TMP, 'worker-fails');
    my $loads  = File::Spec->catfile($TMP, 'worker-loads');
    my $app = write_app(<<"APP");
if (open(my \$fh, '>>', '$loads')) { print \$fh "\$\$\\n"; close \$fh }
exit 3 if -e '$marker';
sub { [200, ['Content-Type' => 'text/plain'], ["pid=\$\$\\n"]] };
APP
    my $s = server(app => $app, args => [ '--max-workers', '2', '--no-preload-app' ]);
    ok(defined get_pid($s->port), 'delayed app: served');
    open(my $m, '>', $marker) or die $!;
    close $m;
    my $before = () = slurp($loads) =~ /\n/g;
    kill HUP => $s->pid;    # the new generation loads the app, which now exits
    sleep 3;
    my $forks = (() = slurp($loads) =~ /\n/g) - $before;
    cmp_ok($forks, '>=', 2, "failing workers were started ($forks)");
    cmp_ok($forks, '<', 15, "the master backs off: $forks worker starts in 3 s");
    like($s->log_text, qr/exited with status 3/, 'the master logs the failing workers');
    ok(pid_alive($s->pid), 'the master is still running');
    unlink $marker;
    kill HUP => $s->pid;
    ok(wait_until(sub { defined get_pid($s->port) }, 5), 'HUP after the fix: serving again');
    is($s->stop, 0, 'stops with status 0');
}};

# Orphaned workers exit when their master is KILLed.
my $sec_orphan = sub { {
    my $s = server(args => [ '--max-workers', '2' ]);
    my $w = wait_workers($s, 2) || [];
    is(scalar @$w, 2, 'two workers');
    kill KILL => $s->pid;
    $s->wait_exit(3);
    ok(wait_until(sub { !grep { pid_alive($_) } @$w }, 4),
       'the workers exit within ~3 s of their master being KILLed');
}};

# The parts in eight processes at once (the longest first in each): most
# of their time is spent waiting for signals, timeouts and other processes.
# (--min-worker-lifetime 1 times seven requests to 0.9 s: it comes late in
# its process, once the others' servers have started and the busiest
# parts are over.)
in_parallel(
    sub { $_->() for $sec_h },
    sub { $_->() for $sec_j },
    sub { $_->() for $sec_a, $sec_d, $sec_i },
    sub { $_->() for $sec_e2_broken, $sec_e2_recycle },
    sub { $_->() for $sec_e2_two, $sec_f },
    sub { $_->() for $sec_c, $sec_b, $sec_h_unix, $sec_g },
    sub { $_->() for $sec_e2_linger, $sec_e_lifetime },
    sub { $_->() for $sec_orphan, $sec_e },
);

# Nothing left behind.
my @started = do { open(my $fh, '<', $STARTED) or die "$STARTED: $!"; map { chomp; $_ } <$fh> };
ok(wait_until(sub { !grep { pid_alive($_) } @started }, 8), 'no master or worker left running')
    or diag 'alive: ' . join ' ', grep { pid_alive($_) } @started;

done_testing;
