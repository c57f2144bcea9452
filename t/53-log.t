use strict;
use warnings;
use Test::More;
use Test2::IPC;    # (parts of this file run in processes of their own)
use lib 't/lib';
use File::Spec ();
use Time::HiRes qw(time sleep);
use NarwhalTest qw(spawn_server write_app tmpdir wait_until worker_pids manager_fallback
                   raw_connect read_response http_get in_parallel);

# The error log as an operator reads it after the fact (docs/SIGNALS.md,
# "The log"): every signal that changes the server leaves a stamped line
# naming it and its sender's pid, every generation started and finished
# does, each worker the stop killed at --graceful-timeout is said so (not
# "killed by signal 9", as if from outside), the summaries of lines that
# were being counted are written at the stop instead of lost, a 503 of
# --max-queue-wait names its request, and so does a spool failure.

my @NM = manager_fallback();
my $MANAGED = NarwhalTest::managed();
my $TMP = tmpdir();
my $STAMP = qr/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z narwhal\[\d+\] \w+ \w+: /;

my $APP = write_app(<<'APP');
use Time::HiRes ();
sub {
    my $env = shift;
    Time::HiRes::sleep($1) if $env->{PATH_INFO} =~ m{^/sleep/([\d.]+)};
    kill KILL => $$ if $env->{PATH_INFO} eq '/crash';
    [200, ['Content-Type' => 'text/plain'], ["pid=$$\n"]];
}
APP

sub slurp { open(my $f, '<', $_[0]) or return ''; local $/; return <$f> // '' }

sub server_with_log {
    my ($name, @args) = @_;
    my $log = File::Spec->catfile($TMP, "$name.log");
    my $s = spawn_server(app => $APP, args => [ @NM, '--error-log', $log, @args ]);
    return ($s, $log);
}

sub logged {
    my ($log, $re, $what, $timeout) = @_;
    my $ok = wait_until(sub { slurp($log) =~ $re }, $timeout // 5);
    ok($ok, $what) or diag "the log:\n" . slurp($log);
    my ($line) = grep { $_ =~ $re } split /\n/, slurp($log);
    like($line // '', $STAMP, "... stamped") if $ok;
}

# (a part runs in a process of its own: its pid is the sender)
sub me { qr/from pid $$ \(\S+\)/ }

my $part_signals = sub {
    my ($s, $log) = server_with_log('signals', '--max-workers', 2, '--graceful-timeout', 1);
    wait_until(sub { worker_pids($s->pid) == 2 }, 5);
    logged($log, qr/listening on .* \(generation 1\)$/m, 'the start names generation 1');

    kill HUP => $s->pid;
    logged($log, qr/HUP ${\ me()}: starting generation 2 \(2 workers\)/, 'HUP: its sender and the new generation');
    logged($log, qr/generation 2 serves; retiring generation 1 \(2 worker\(s\)\)/, 'the new generation took over');
    logged($log, qr/generation 1 finished: its last worker has left/, 'the old generation finished');

    kill TTIN => $s->pid;
    logged($log, qr/TTIN ${\ me()}: --max-workers 2 -> 3/, 'TTIN');
    ok(wait_until(sub { worker_pids($s->pid) == 3 }, 5), '(three workers)');
    kill TTOU => $s->pid;
    logged($log, qr/TTOU ${\ me()}: --max-workers 3 -> 2/, 'TTOU');
    kill USR1 => $s->pid;
    logged($log, qr/USR1 ${\ me()}: reopened the logs/, 'USR1');
    kill USR2 => $s->pid;
    logged($log, qr/USR2 ${\ me()}: /, 'USR2');

    # three crashes within 10 s: one line, two counted...
    ok(wait_until(sub { worker_pids($s->pid) == 2 }, 5), '(two workers again)');
    for (1 .. 3) {
        http_get($s->port, '/crash');
        wait_until(sub { worker_pids($s->pid) == 2 }, 5);
    }
    logged($log, qr/worker \d+ was killed by signal 9 while serving GET \/crash/, 'the first crash has its line');
    # ... and two workers busy for longer than --graceful-timeout when TERM comes
    my @busy = map { my $c = raw_connect($s->port); syswrite($c, "GET /sleep/20 HTTP/1.1\r\nHost: x\r\n\r\n"); $c } 1 .. 2;
    sleep 0.5;
    kill TERM => $s->pid;
    my $t0 = time;
    logged($log, qr/TERM ${\ me()}: stopping gracefully: 2 worker\(s\)/, 'TERM: its sender');
    $s->stop('none');
    my $text = slurp($log);
    my @killed = $text =~ /^.*worker (\d+) killed \(KILL\) at --graceful-timeout 1 s while serving GET \/sleep\/20.*$/mg;
    is(scalar @killed, 2, 'each worker killed at --graceful-timeout is said so, as such') or diag $text;
    unlike($text, qr/was killed by signal 9 while serving GET \/sleep/, '... not as a death from outside');
    like($text, qr/\d+ more worker\(s\) died in the last 10 s \(the last was killed by signal 9 while serving GET \/crash\)/,
         'the crashes counted are summed up at the stop, not lost');
    like($text, qr/stopped in [\d.]+ s: generation 2 finished, 2 worker\(s\) killed at --graceful-timeout/,
         'the stop says how it ended');
};

my $part_int_quit = sub {
    for my $sig (qw(INT QUIT)) {
        my ($s, $log) = server_with_log("stop-$sig", '--max-workers', 1);
        kill $sig => $s->pid;
        $s->stop('none');
        like(slurp($log), qr/$sig ${\ me()}: stopping gracefully/m, "$sig: its sender");
        like(slurp($log), qr/stopped in [\d.]+ s: generation 1 finished, every worker left on its own/,
             "$sig: the stop's end");
    }
};

my $part_shed = sub { SKIP: {
    skip 'shedding needs the connection manager', 4 unless $MANAGED;
    my ($s, $log) = server_with_log('shed', '--max-workers', 1, '--max-queue-wait', 200,
                                    '--keepalive-wait', 0);
    my $port = $s->port;
    wait_until(sub { worker_pids($s->pid) == 1 }, 5);
    my @idle = map { raw_connect($port) } 1 .. 3;
    for my $c (@idle) {
        syswrite($c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
        read_response($c, 5);
    }
    sleep 0.3;    # (in the manager now)
    my $stuck = raw_connect($port);
    syswrite($stuck, "GET /sleep/1.5 HTTP/1.1\r\nHost: x\r\n\r\n");
    sleep 0.3;
    syswrite($idle[$_], "GET /wait/$_ HTTP/1.1\r\nHost: x\r\n\r\n") for 0 .. 2;
    my @r = map { read_response($_, 5) } @idle;
    is(scalar(grep { $_ && $_->{status} == 503 } @r), 3, 'three requests shed');
    logged($log, qr/shed GET \/wait\/\d HTTP\/1\.1: it waited over --max-queue-wait 200 ms for a worker; answered 503/,
           'the first 503 names its request');
    read_response($stuck, 5);
    $_->close for @idle, $stuck;
    $s->stop;
    like(slurp($log), qr/2 more like "shed GET \/wait\/\d HTTP\/1\.1: it waited/,
         'the rest are summed up at the stop, not lost');
}};

my $part_spool = sub {
    my $s = spawn_server(app => $APP, args => [ @NM, '--max-workers', 1, '--body-in-memory', 10 ],
                         env => { TMPDIR => "$TMP/no-such-dir" });
    my $c = raw_connect($s->port);
    syswrite($c, "POST /upload/here?x=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n" . ('z' x 100));
    my $r = read_response($c, 5);
    is($r && $r->{status}, 503, 'a body that cannot be spooled: 503');
    ok(wait_until(sub { $s->log_text =~ /cannot spool the body of POST \/upload\/here\?x=1 to \S+no-such-dir/ }, 5),
       'the spool failure names the request') or diag $s->log_text;
    $s->stop;
};

in_parallel($part_signals, $part_int_quit, $part_shed, $part_spool);
done_testing;
