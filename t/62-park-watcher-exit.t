use strict;
use warnings;
use Test::More;
use Test2::IPC;    # (the two rounds run in processes of their own)
use Time::HiRes ();
use lib 't/lib';
use NarwhalTest qw(spawn_server raw_connect read_response wait_until worker_pids pid_alive
                   in_parallel);

# The park watcher thread and a worker whose app calls exit while
# connections are parked in it. Perl's global destruction clears every
# reference to an object (the parked set's included) and frees the
# objects; a watcher still running then (50 ms into the request) would
# read them. An END block stops it first.

plan skip_all => 'the manager is switched off for this run'
    if !NarwhalTest::managed();

my $app = <<'APP';
sub Slow::DESTROY { select undef, undef, undef, 0.004 }
sub {
    my $env = shift;
    if ($env->{PATH_INFO} eq '/exit') {
        # objects whose DESTROY is slow make global destruction last a while
        our @slow = map { bless [], 'Slow' } 1 .. 150;
        exit 0;
    }
    [200, ['Content-Type' => 'text/plain'], ["pid=$$ path=$env->{PATH_INFO}"]];
}
APP

my $H = "Host: t\r\n";
sub request_on {
    my ($s, $path) = @_;
    syswrite($s, "GET $path HTTP/1.1\r\n$H\r\n") or return undef;
    return read_response($s, 5);
}

# Two rounds, each with its own server, at once.
in_parallel(map { my $round = $_; sub {
    my $srv = spawn_server(app => $app, args => [ '--max-workers' => 1, '--keepalive-wait' => 5,
                                                  '--keepalive-timeout' => 30 ]);
    my @parked = grep { $_ } map { my $s = raw_connect($srv->port); request_on($s, "/p$_") && $s } 1 .. 20;
    is(scalar @parked, 20, "round $round: twenty connections parked in the only worker");
    my ($worker) = worker_pids($srv->pid);
    my $x = raw_connect($srv->port);
    syswrite($x, "GET /exit HTTP/1.1\r\n$H\r\n");
    # its global destruction runs and ends; the master reaps it (and logs
    # how it ended) before it starts the next worker
    ok(wait_until(sub { !pid_alive($worker) && grep { $_ != $worker } worker_pids($srv->pid) }, 10),
       "round $round: the worker exits and is replaced");
    my $log = $srv->log_text;
    unlike($log, qr/worker \d+ was killed by signal/, "round $round: the worker exits cleanly")
        or diag $log;
    @parked = ();    # (their clients go first: the stop need not linger for them)
    $srv->stop;
} } 1 .. 2);

done_testing();
