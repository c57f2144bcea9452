use strict;
use warnings;
use Test::More;
use Test2::IPC;    # (parts of this file run in processes of their own)
use lib 't/lib';
use Digest::MD5 ();
use Time::HiRes qw(time sleep);
use NarwhalTest qw(spawn_server write_app raw_connect read_response wait_until
                   extra_args manager_built tmpdir in_parallel);

# Slow readers must not pin workers (DESIGN.md, "Slow readers"): a client
# that asks for a large response and does not read it used to hold a
# worker for up to --timeout. Now the worker leaves the rest of the
# response to the manager and goes back to work. Every client here counts
# every request and never retries.

my $no_manager = !NarwhalTest::managed();
my $MB = 1024 * 1024;
my $LINES = int(10 * $MB / 19);    # (10 MB of numbered lines: one sprintf makes them)
my $FILE = tmpdir() . '/ten-mb.bin';
{
    open my $fh, '>', $FILE or die "$FILE: $!";
    print $fh sprintf "file line %08d\n" x ($LINES + 1), 0 .. $LINES;
    close $fh;
}
# /big-cleanup's after-response work runs until the test creates $GATE
# (10 s at most): a response that waited for it could not arrive before.
my $GATE = tmpdir() . '/cleanup-gate';
my $APP = write_app(<<"APP");
my \$big = sprintf "big line %09d\\n" x ($LINES + 1), 0 .. $LINES;
sub {
    my \$env = shift;
    my \$p = \$env->{PATH_INFO};
    return [200, ['Content-Type' => 'text/plain'], [\$big]] if \$p eq '/big';
    if (\$p eq '/big-cleanup') {
        push \@{ \$env->{'psgix.cleanup.handlers'} }, sub {
            my \$end = time + 10;
            select undef, undef, undef, 0.01 until -e '$GATE' || time > \$end;
        };
        return [200, ['Content-Type' => 'text/plain'], [\$big]];
    }
    return [200, ['Content-Type' => 'text/plain'],
            [map { substr(\$big, \$_ * 65536, 65536) } 0 .. int(length(\$big) / 65536)]] if \$p eq '/pieces';
    if (\$p eq '/file') { open my \$f, '<', '$FILE' or die; return [200, ['Content-Type' => 'text/plain'], \$f] }
    return [200, ['Content-Type' => 'text/plain'], ["small\\n"]];
}
APP
my %WANT;
{
    my $big = sprintf "big line %09d\n" x ($LINES + 1), 0 .. $LINES;
    $WANT{'/big'} = $WANT{'/pieces'} = $WANT{'/big-cleanup'} = Digest::MD5::md5_hex($big);
    open my $fh, '<', $FILE or die;
    local $/;
    $WANT{'/file'} = Digest::MD5::md5_hex(<$fh>);
}

# A client that sends a request and reads nothing.
sub slow_client {
    my ($port, $path, $extra) = @_;
    my $c = raw_connect($port) or die "connect: $!";
    syswrite($c, "GET $path HTTP/1.1\r\nHost: x\r\n" . ($extra // '') . "\r\n");
    return $c;
}

sub body_ok {
    my ($r, $path, $name) = @_;
    ok($r && $r->{status} == 200 && Digest::MD5::md5_hex($r->{body}) eq $WANT{$path},
       "$name: the whole body of $path, byte for byte")
        or diag($r ? "status $r->{status}, " . length($r->{body}) . ' bytes' : 'no response');
}

# The worst of n small requests on new connections, each waited for up to 3 s.
sub small_requests {
    my ($port, $n) = @_;
    my ($worst, $answered) = (0, 0);
    for (1 .. $n) {
        my $t = time;
        my $c = raw_connect($port);
        syswrite($c, "GET /small HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        my $r = read_response($c, 3);
        $answered++ if $r && $r->{status} == 200 && $r->{body} eq "small\n";
        $worst = time - $t if time - $t > $worst;
    }
    return ($answered, $worst);
}

sub metrics {
    my ($status) = @_;
    my $c = raw_connect($status) or return {};
    syswrite($c, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    my $r = read_response($c, 5) or return {};
    return { map { /^(\w+(?:\{[^}]*\})?) (\S+)$/ ? ($1 => $2) : () } split /\n/, $r->{body} };
}

# What the status listener's /health answers (0: nothing, not listening).
sub health {
    my ($status) = @_;
    my $c = raw_connect($status) or return 0;
    syswrite($c, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
    my $r = read_response($c, 5);
    return $r ? $r->{status} : 0;
}

# A server of $APP with a status listener on a unix socket (a second free
# port could be the first one again); returns it and the socket's path.
my $N = 0;
sub server_with_status {
    my (@args) = @_;
    my $status = tmpdir() . "/status-$$-" . $N++ . '.sock';
    return (spawn_server(app => $APP, args => [ @args, '--status-listen', $status ]), $status);
}

sub writing { ($_[0]{'narwhal_connections{state="writing"}'} // 0) }
sub busy    { ($_[0]{'narwhal_workers{state="busy"}'} // 0) }

if ($no_manager || !manager_built()) {
    # Without a manager the worker waits for its slow reader, as it always
    # did; the response is still whole.
    my $s = spawn_server(app => $APP, args => [ '--max-workers', 2 ]);
    my $c = slow_client($s->port, '/big');
    sleep 0.5;
    body_ok(read_response($c, 20), '/big', 'without a manager');
    done_testing();
    exit;
}

# 1. Six readers that read nothing (three array bodies, three files) and
# two workers: small requests are still answered at once; the bytes held
# stay within the cap; then every slow reader gets its whole response and
# its connection serves another request.
my $sec_offload = sub {
    my ($s, $status) = server_with_status('--max-workers', 2, '--timeout', 30);
    my (%base, $m);
    ok(wait_until(sub { %base = %{ metrics($status) }; exists $base{narwhal_offloaded_total} }, 10),
       'the metrics say how many responses were offloaded');
    my @slow = map { [ $_, slow_client($s->port, $_) ] } qw(/big /pieces /file /big /file /file);
    ok(wait_until(sub { $m = metrics($status); ($m->{'narwhal_connections{state="writing"}'} // 0) == 6 }, 10),
       'six slow readers: the manager is writing all six responses')
        or diag explain $m;
    is($m->{narwhal_offloaded_total} - $base{narwhal_offloaded_total}, 6, '... six responses offloaded');
    ok($m->{narwhal_offload_bytes} > 0 && $m->{narwhal_offload_bytes} <= 3 * 10.5 * $MB,
       "... holding $m->{narwhal_offload_bytes} bytes: the in-memory rests only (files cost none)");
    my ($answered, $worst) = small_requests($s->port, 20);
    is($answered, 20, 'with both workers\' slow readers offloaded, 20 small requests are answered');
    cmp_ok($worst, '<', 1, sprintf '... the slowest in %.3f s', $worst);
    for my $sl (@slow) {
        my ($path, $c) = @$sl;
        body_ok(read_response($c, 30), $path, 'a slow reader that reads at last');
        syswrite($c, "GET /small HTTP/1.1\r\nHost: x\r\n\r\n");
        my $r = read_response($c, 5);
        is($r && $r->{body}, "small\n", '... and its connection serves its next request');
    }
    ok(wait_until(sub { $m = metrics($status); $m->{narwhal_offload_bytes} == 0
                        && $m->{'narwhal_connections{state="writing"}'} == 0 }, 10),
       'afterwards nothing is held: 0 bytes, 0 connections being written');

    # Pipelined behind an offloaded response, and Connection: close.
    my $c = raw_connect($s->port);
    syswrite($c, "GET /big HTTP/1.1\r\nHost: x\r\n\r\nGET /small HTTP/1.1\r\nHost: x\r\n\r\n");
    ok(wait_until(sub { $m = metrics($status); ($m->{'narwhal_connections{state="writing"}'} // 0) == 1 }, 10),
       'pipelined: the manager is writing the response');
    body_ok(read_response($c, 20), '/big', 'pipelined');
    my $r = read_response($c, 5);
    is($r && $r->{body}, "small\n", '... and the request behind it is answered after it, in order');
    $c = slow_client($s->port, '/big', "Connection: close\r\n");
    ok(wait_until(sub { $m = metrics($status); ($m->{'narwhal_connections{state="writing"}'} // 0) == 1 }, 10),
       'Connection: close: the manager is writing the response');
    $r = read_response($c, 20);
    body_ok($r, '/big', 'Connection: close');
    is(sysread($c, my $more, 1), 0, '... then end of stream');
};

# 2. Over the caps the worker waits, as without offload. --max-offload-bytes
# below the body: one worker, one slow reader, and a small request waits
# for it. --max-offload-total: only what fits is offloaded. (A worker
# decides in its first write that fills the socket, a few milliseconds of
# CPU after it took the request, which the status listener shows: busy.)
my $sec_caps = sub {
    my ($s, $status) = server_with_status('--max-workers', 1, '--max-offload-bytes', 1_000_000);
    my $slow = slow_client($s->port, '/big');
    wait_until(sub { busy(metrics($status)) == 1 }, 10) or diag 'the worker did not take the request';
    my $t = time;
    my $c = raw_connect($s->port);
    syswrite($c, "GET /small HTTP/1.1\r\nHost: x\r\n\r\n");
    ok(!read_response($c, 1), '--max-offload-bytes 1000000: a 10 MB rest keeps its worker (a small request waits)');
    body_ok(read_response($slow, 20), '/big', '... the slow reader still gets all of it');
    my $r = read_response($c, 10);
    is($r && $r->{body}, "small\n", '... and then the small request is answered');
    my $f = slow_client($s->port, '/file');
    wait_until(sub { writing(metrics($status)) == 1 }, 10) or diag 'the manager is not writing the file';
    my ($answered) = small_requests($s->port, 3);
    is($answered, 3, '... a file body is offloaded all the same (it costs no memory)');
    body_ok(read_response($f, 20), '/file', '... and arrives whole');
};
my $sec_total = sub {
    # (11 MB: what is left of a 10 MB response once the kernel has taken
    # what its socket buffers hold, up to about 4 MB here, is 6 to 10 MB:
    # one rest always fits, two never do)
    my ($s, $status) = server_with_status('--max-workers', 3, '--max-offload-total', 11 * $MB);
    my @slow = map { slow_client($s->port, '/big') } 1 .. 3;
    my ($m, $max) = ({}, 0);
    my $look = sub {
        $m = metrics($status);
        $max = $m->{narwhal_offload_bytes} if ($m->{narwhal_offload_bytes} // 0) > $max;
        return $m;
    };
    # One rest offloaded, two workers with a request each: those decide
    # within milliseconds whether their rest fits too; 0.3 s more (looking
    # all along) shows one that passed the cap.
    wait_until(sub { $look->(); ($m->{narwhal_offloaded_total} // 0) >= 1 && busy($m) == 2 }, 10);
    my $until = time + 0.3;
    wait_until(sub { $look->(); time >= $until }, 1);
    is($m->{narwhal_offloaded_total}, 1, '--max-offload-total 11 MB: one 10 MB rest fits, the others keep their workers')
        or diag explain { map { $_ => $m->{$_} } grep { /offload|workers\{|connections/ } keys %$m };
    cmp_ok($max, '<=', 11 * $MB, "... the bytes held never passed it (at most $max)");
    body_ok(read_response($_, 20), '/big', '... every slow reader gets its whole response') for @slow;
};

# 3. A graceful stop while the manager is finishing a response: the slow
# reader still gets all of it (the manager goes on writing for up to 5 s).
my $sec_stop = sub {
    my ($s, $status) = server_with_status('--max-workers', 1);
    my $c = slow_client($s->port, '/big', "Connection: close\r\n");
    wait_until(sub { writing(metrics($status)) == 1 }, 10) or diag 'the manager is not writing';
    kill 'TERM', $s->pid;
    # (the stop has begun once /health says 503: the master signals the
    # manager in the same step)
    wait_until(sub { health($status) != 200 }, 5) or diag 'the stop did not begin';
    my $t = time;
    body_ok(read_response($c, 20), '/big', 'a TERM while the manager writes: the slow reader');
    is($s->wait_exit(10), 0, sprintf 'and the server exits cleanly (the body was read in %.1f s)', time - $t);
};

# 4. After-response work (a cleanup handler that runs until the test ends
# it) does not hold back the rest of a response the client is still
# reading: it goes to the manager before the handler runs (it used to
# wait for it).
my $sec_cleanup = sub {
    my $s = spawn_server(app => $APP, args => [ '--max-workers', 1 ]);
    # (the worker serves first: the time below is the response's, not the
    # worker's start-up)
    small_requests($s->port, 1);
    my $c = raw_connect($s->port);
    my $t = time;
    syswrite($c, "GET /big-cleanup HTTP/1.1\r\nHost: x\r\n\r\n");
    my $r = read_response($c, 10);
    my $took = time - $t;
    body_ok($r, '/big-cleanup', 'a response with a cleanup handler that goes on');
    cmp_ok($took, '<', 1.5, sprintf '... arrives without waiting for the handler (%.2f s)', $took);
    open(my $gate, '>', $GATE) or die "$GATE: $!";    # the handler ends
    close $gate;
    syswrite($c, "GET /small HTTP/1.1\r\nHost: x\r\n\r\n");
    $r = read_response($c, 5);
    is($r && $r->{body}, "small\n", '... and the connection serves its next request');
};

# The cleanup handler's part first, alone: it times a 10 MB response to
# 1.5 s, which the others' transfers, all at once on two cores, could
# take. Then the other parts in processes of their own, all at once (each
# has its own server; most of their time is spent waiting for slow
# readers).
$sec_cleanup->();
in_parallel(
    sub { $sec_offload->() },
    sub { $sec_caps->() },
    sub { $sec_total->() },
    sub { $sec_stop->() },
);

done_testing();
