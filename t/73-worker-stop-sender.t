use strict;
use warnings;
use Test::More;
use lib 't/lib';
use Time::HiRes qw(time sleep);
use NarwhalTest qw(spawn_server write_app wait_until worker_pids raw_connect tmpdir);

# A worker tells a stop that is not the master's (Ctrl-C and systemd
# signal the whole group) by the sender of its TERM/INT/QUIT: it makes the
# listeners refuse new connections at once, as the master's stop does
# (docs/SIGNALS.md). Since the worker reads its stop signals from its
# signalfd, no handler runs to note the sender: the sender must come from
# the signalfd's record. A TERM sent here (not by the master) to the only
# worker, on a unix socket: a connect is refused soon after.

plan skip_all => 'Linux only' unless $^O eq 'linux';

my $APP = write_app(q{sub { [200, ['Content-Type' => 'text/plain'], ["ok\n"]] }});
for my $mode ([], ['--no-manager']) {
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
    kill TERM => $w;
    my $refused = wait_until(sub { !raw_connect($path) }, 3);
    ok($refused, "@$mode: TERM to the worker from elsewhere: the unix listener refuses new connects");
    $s->stop;
}
done_testing();
