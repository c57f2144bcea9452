use strict;
use warnings;
use Test::More;
use lib 't/lib';
use Time::HiRes qw(time sleep);
use NarwhalTest qw(spawn_server write_app raw_connect read_response wait_until tmpdir
                   manager_fallback narwhal_cmd worker_pids children_of missing free_port);

# Every failure leaves a line in the error log, with a time stamp, and a
# count in /metrics: a worker that exits on its own (an app's exit), a
# request body that cannot be spooled (answered 503), an accept refused
# by the open-file limit, a connection manager that dies. Each was silent
# before: 3,096 worker exits in 10 s without a line; a full TMPDIR gave a
# 500 and nothing else.

my @NM = manager_fallback();
my $MANAGED = NarwhalTest::managed();
my $STAMP = qr/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z narwhal\[\d+\] \w+ \w+: /m;

my $APP = write_app(<<'APP');
sub { my $env = shift;
      exit 0 if $env->{PATH_INFO} eq '/exit';
      my $got = 0;
      if (my $in = $env->{'psgi.input'}) { while ($in->read(my $buf, 65536)) { $got += length $buf } }
      [200, ['Content-Type' => 'text/plain'], ["got=$got pid=$$\n"]] }
APP

sub get {
    my ($port, $path, $body) = @_;
    my $c = raw_connect($port) or return undef;
    my $head = defined $body ? "POST $path HTTP/1.1\r\nHost: x\r\nContent-Length: " . length($body) . "\r\n\r\n"
                             : "GET $path HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    syswrite($c, $head);
    syswrite($c, $body) if defined $body;
    return read_response($c, 10);
}

sub metric {
    my ($sport, $name) = @_;
    my $r = get($sport, '/metrics') or return undef;
    return $r->{body} =~ /^\Q$name\E (\d+)$/m ? $1 : undef;
}

sub lines_like { my ($s, $re) = @_; return scalar(() = $s->log_text =~ /$re/g) }

# 1. An app that calls exit: one stamped line for the first, the rest
# counted (CRASH_LOG_EVERY), and narwhal_worker_restarts_total{reason="exit"}.
{
    my $sport = free_port();
    # (--crash-backoff 0: else the route is answered 503 after 3 exits)
    my $s = spawn_server(app => $APP, args => [ @NM, '--max-workers', 2, '--crash-backoff', 0,
                                                 ($MANAGED ? ('--status-listen', "127.0.0.1:$sport") : ()) ]);
    get($s->port, '/exit') for 1 .. 5;
    ok(wait_until(sub { lines_like($s, qr/exited with status 0 on its own/) }, 5),
       'an app that calls exit: the worker\'s exit is in the log');
    like($s->log_text, qr/${STAMP}worker \d+ exited with status 0 on its own \(did the app call exit\?\) while serving GET \/exit/m,
         '... stamped, with the request it was serving');
    is(lines_like($s, qr/exited with status 0 on its own/), 1, '... once for 5 exits in a row (the rest are counted)');
    SKIP: {
        skip 'the metrics need the manager', 1 unless $MANAGED;
        ok(wait_until(sub { (metric($sport, 'narwhal_worker_restarts_total{reason="exit"}') // 0) >= 5 }, 5),
           '... and counted: narwhal_worker_restarts_total{reason="exit"} 5');
    }
    $s->stop;
}

# 2. A request body that cannot be spooled: 503 with Retry-After, and a
# line that names the directory and the reason.
{
    my $sport = free_port();
    my $s = spawn_server(app => $APP, env => { TMPDIR => tmpdir() . '/no-such-dir' },
                         args => [ @NM, '--body-in-memory', 1024,
                                   ($MANAGED ? ('--status-listen', "127.0.0.1:$sport") : ()) ]);
    my $r = get($s->port, '/upload', 'x' x 100_000);
    is($r && $r->{status}, 503, 'a body that cannot be spooled (no such TMPDIR): 503');
    is($r && $r->{headers}{'retry-after'}, 1, '... with Retry-After');
    ok(wait_until(sub { $s->log_text =~ /cannot spool the body of POST \/upload to \S*no-such-dir \(TMPDIR\): No such file or directory; answered 503/ }, 5),
       '... and a line naming the directory and the reason');
    like($s->log_text, qr/${STAMP}cannot spool/m, '... stamped');
    is(get($s->port, '/small', 'x' x 100)->{body} =~ /got=100/ ? 1 : 0, 1, 'a body kept in memory still works');
    SKIP: {
        skip 'the metrics need the manager', 1 unless $MANAGED;
        is(metric($sport, 'narwhal_failures_total{kind="spool"}'), 1, '... counted: narwhal_failures_total{kind="spool"} 1');
    }
    $s->stop;
}

# 2b. The disk really full: a 1 MiB tmpfs as TMPDIR, a 4 MiB upload.
SKIP: {
    missing('a tmpfs mount needs root', 3) if $>;
    my $dir = tmpdir() . '/full';
    mkdir $dir;
    system('mount', '-t', 'tmpfs', '-o', 'size=1m', 'tmpfs', $dir) == 0
        or missing('cannot mount a tmpfs here', 3);
    my $s = spawn_server(app => $APP, env => { TMPDIR => $dir }, args => [ @NM, '--body-in-memory', 1024 ]);
    my $t0 = time;
    my $r = get($s->port, '/upload', 'y' x (4 << 20));
    is($r && $r->{status}, 503, 'a full TMPDIR (1 MiB tmpfs, a 4 MiB body): 503');
    ok(wait_until(sub { $s->log_text =~ /cannot spool the body of POST \/upload to \Q$dir\E \(TMPDIR\): No space left on device/ }, 5),
       '... and the line says the disk is full');
    is(get($s->port, '/small', 'x' x 100)->{body} =~ /got=100/ ? 1 : 0, 1, '... the server goes on');
    $s->stop;
    system('umount', $dir);
}

# 3. The open-file limit: workers that cannot accept say so (once, then a
# count) and count it; the clients wait in the listen queue meanwhile.
SKIP: {
    my $sport = free_port();
    my $port = free_port();
    my $s = spawn_server(app => $APP, port => $port, command => [
        'sh', '-c', 'ulimit -n 40 && exec "$@"', 'sh', narwhal_cmd(), '--listen', "127.0.0.1:$port",
        @NM, '--max-workers', 1, '--keepalive-timeout', 30,
        ($MANAGED ? ('--status-listen', "127.0.0.1:$sport") : ()), $APP ]);
    my @held;
    for (1 .. 60) {
        my $c = raw_connect($port) or last;
        syswrite($c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
        push @held, $c;
    }
    ok(wait_until(sub { $s->log_text =~ /cannot accept a connection on listener 0: Too many open files \(open-file limit 40\)/ }, 10),
       'at the open-file limit (40), a worker says it cannot accept');
    is(lines_like($s, qr/cannot accept a connection/), 1, '... once, not once per try');
    SKIP: {
        skip 'the metrics need the manager', 1 unless $MANAGED;
        ok((metric($sport, 'narwhal_failures_total{kind="fd_limit"}') // 0) > 0,
           '... counted: narwhal_failures_total{kind="fd_limit"}');
    }
    close $_ for @held;
    $s->stop;
}

# 4. The connection manager killed: a stamped line, a new one, a count.
SKIP: {
    skip 'no connection manager in this mode', 3 unless $MANAGED;
    my $sport = free_port();
    my $s = spawn_server(app => $APP, args => [ '--status-listen', "127.0.0.1:$sport" ]);
    my $manager;
    wait_until(sub { ($manager) = grep { (`cat /proc/$_/cmdline 2>/dev/null` // '') =~ /manager/ }
                                      children_of($s->pid) });
    ok($manager && kill(KILL => $manager), 'the manager is killed');
    ok(wait_until(sub { $s->log_text =~ /${STAMP}connection manager $manager was killed by signal 9; starting a new one/m }, 5),
       '... a stamped line says so');
    ok(wait_until(sub { (metric($sport, 'narwhal_failures_total{kind="manager_restart"}') // 0) == 1 }, 5),
       '... and the new one counts it: narwhal_failures_total{kind="manager_restart"} 1');
    $s->stop;
}

done_testing();
