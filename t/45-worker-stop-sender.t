use strict;
use warnings;
use Test::More;
use Test2::IPC;    # (the two modes run in processes of their own)
use lib 't/lib';
use Time::HiRes qw(time sleep);
use NarwhalTest qw(spawn_server write_app wait_until worker_pids raw_connect tmpdir in_parallel);

# A worker tells a stop that is not the master's (Ctrl-C and systemd
# signal the whole group; an operator may TERM one worker) by the sender
# of its TERM/INT/QUIT: it leaves the listeners, which every worker
# shares, to the master, and after its drain gives the master
# GROUP_STOP_WAIT (0.5 s) to begin a stop of its own before it leaves
# (docs/SIGNALS.md). Since the worker reads its stop signals from its
# signalfd, no handler runs to note the sender: the sender must come from
# the signalfd's record. A TERM sent here (not by the master) to the only
# worker, on a unix socket: the worker leaves after that wait, not at once
# (a worker that took the stop for the master's would not wait), and the
# server goes on: a new connect is served by its replacement. (Such a
# worker used to shut the listener to new connects: after an operator's
# TERM to one worker, the whole server took no new client.)

plan skip_all => 'Linux only' unless $^O eq 'linux';

my $APP = write_app(q{sub { [200, ['Content-Type' => 'text/plain'], ["ok\n"]] }});
# With the manager and without, each with its own server, at once.
in_parallel(map { my $mode = $_; sub {
    my $path = tmpdir() . "/sender-" . scalar(@$mode) . ".sock";
    my $s = spawn_server(app => $APP, unix => $path, no_listen => 1,
                         args => [ '--max-workers', 1, @$mode ]);
    ok(wait_until(sub { worker_pids($s->pid) == 1 }, 5), "@$mode: one worker");
    # served once: the worker is past its setup, its signals deferred
    my $c = raw_connect($path);
    syswrite($c, "GET / HTTP/1.0\r\n\r\n");
    my $buf = '';
    1 while sysread($c, $buf, 4096, length $buf);
    like($buf, qr{^HTTP/1\.[01] 200}, "@$mode: served");
    my ($w) = worker_pids($s->pid);
    my $t0 = time;
    kill TERM => $w;
    my $gone = sub {
        open(my $f, '<', "/proc/$w/stat") or return 1;
        return (<$f> // '') =~ /^\d+ \(.*\) Z/;     # (a zombie: not reaped yet)
    };
    ok(wait_until($gone, 5), "@$mode: TERM to the worker from elsewhere: it leaves");
    cmp_ok(time - $t0, '>=', 0.45, "@$mode: ... after giving the master 0.5 s to begin a stop");
    my $answer = '';
    ok(wait_until(sub {
        my $n = raw_connect($path) or return 0;
        syswrite($n, "GET / HTTP/1.0\r\n\r\n");
        $answer = '';
        1 while sysread($n, $answer, 4096, length $answer);
        $answer =~ m{^HTTP/1\.[01] 200};
    }, 5), "@$mode: ... and a new connect is served, by its replacement") or diag $answer;
    $s->stop;
} } [], ['--no-manager']);
done_testing();
