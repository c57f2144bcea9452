use strict;
use warnings;
use Test::More;
use Test2::IPC;    # (parts of this file run in processes of their own)
use lib 't/lib';
use Time::HiRes qw(time sleep);
use NarwhalTest qw(spawn_server write_app raw_connect read_response read_until_close wait_until
                   manager_fallback free_port in_parallel);

# --crash-backoff: a route ("METHOD path") that kills its worker again
# and again is answered 503 by the workers, without running the app, for
# a back-off that doubles while it goes on; the other routes are served
# as always, and the route is tried again after each back-off. Before,
# every request to it cost a worker and a fork: four clients on such a
# URL cut everyone else's throughput about 80 times.

my @NM = manager_fallback();
my $MANAGED = NarwhalTest::managed();

# /sleep makes $DIR/sleeping-PID as it begins: its worker is on it from then on.
my $DIR = NarwhalTest::tmpdir();
my $APP = write_app(<<"APP");
sub { my \$env = shift;
      kill SEGV => \$\$ if \$env->{PATH_INFO} eq '/segv' || \$env->{QUERY_STRING} eq 'crash';
      if (\$env->{PATH_INFO} eq '/sleep') {
          open(my \$fh, '>', "$DIR/sleeping-\$\$");
          select undef, undef, undef, 5;
      }
      [200, ['Content-Type' => 'text/plain'], ["ok pid=\$\$\\n"]] }
APP

# One request on a new connection: its status, or 0 when the connection
# closed without one (the worker died).
sub status_of {
    my ($port, $path) = @_;
    my $c = raw_connect($port) or return -1;
    syswrite($c, "GET $path HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    my $r = read_response($c, 5);
    return $r ? $r->{status} : 0;
}

sub metric {
    my ($sport, $name) = @_;
    my $c = raw_connect($sport) or return undef;
    syswrite($c, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    my $r = read_response($c, 5) or return undef;
    return $r->{body} =~ /^\Q$name\E (\d+)$/m ? $1 : undef;
}

# (a first back-off of 0.8 s, not 1 s: the part waits for it, then for
# more than it again while the doubled one lasts)
my $part_backoff = sub {
    my $sport = free_port();
    my $s = spawn_server(app => $APP, args => [ @NM, '--max-workers', 2, '--crash-backoff', 0.8,
                                                 ($MANAGED ? ('--status-listen', "127.0.0.1:$sport") : ()) ]);
    my @first = map { status_of($s->port, "/segv?n=$_") } 1 .. 3;
    is("@first", '0 0 0', 'three requests to /segv (queries differ): each kills its worker');
    ok(wait_until(sub { status_of($s->port, '/segv') == 503 }, 3), 'then /segv is answered 503');
    my $c = raw_connect($s->port);
    syswrite($c, "GET /segv HTTP/1.1\r\nHost: x\r\n\r\n");
    my $r = read_response($c, 5);
    is($r && $r->{headers}{'retry-after'}, 1, '... with Retry-After, without running the app');
    is(status_of($s->port, '/other'), 200, 'another route is served meanwhile');
    is(status_of($s->port, '/segv?again'), 503, '... and /segv with another query is the same route');
    like($s->log_text, qr/GET \/segv killed 3 workers in 10 s \(3 of its \d+ requests\): answered 503 for 0\.8 s, then tried again/,
         'the back-off is logged once, with the route and the count');
    my $log_lines = () = $s->log_text =~ /answered 503 for/g;
    is($log_lines, 1, '... once');

    # after the back-off it is tried again; it crashes again: 1.6 s this time
    sleep 0.9;
    is(status_of($s->port, '/segv'), 0, 'after the back-off the route runs again (and crashes)');
    ok(wait_until(sub { status_of($s->port, '/segv') == 503 }, 2), '... and is answered 503 at once');
    like($s->log_text, qr/GET \/segv killed a worker again after its back-off: answered 503 for 1\.6 s/,
         '... for twice as long');
    # (past the first back-off's 0.8 s, and well within the 1.6 s: it began
    # before the 503 just seen)
    sleep 0.9;
    is(status_of($s->port, '/segv'), 503, 'still 503 after 0.9 s of the 1.6 s');
    SKIP: {
        skip 'the metrics need the manager', 1 unless $MANAGED;
        ok((metric($sport, 'narwhal_crash_refused_total') // 0) >= 4,
           'counted: narwhal_crash_refused_total');
    }
    # (the clients close first: the stop need not linger for them)
    $c->close;
    $s->stop;
};

# A busy route that kills a few of its requests is not a crash loop: 3
# deaths among 33 requests to /flaky, and /flaky is still run. Nor is a
# worker killed from outside (KILL): it is not the route's doing.
my $part_not_a_loop = sub {
    my $s = spawn_server(app => $APP, args => [ @NM, '--max-workers', 2 ]);
    my @got;
    for my $i (1 .. 33) { push @got, status_of($s->port, $i % 11 ? '/flaky' : '/flaky?crash') }
    is(scalar(grep { $_ == 0 } @got), 3, 'a route that killed 3 of its 33 requests ...');
    is(status_of($s->port, '/flaky?crash'), 0, '... is still run (and its next crash too)');
    is(status_of($s->port, '/flaky'), 200, '... and served');
    for (1 .. 3) {
        my $c = raw_connect($s->port);
        syswrite($c, "GET /sleep HTTP/1.1\r\nHost: x\r\n\r\n");
        # (a worker is on /sleep: killing it now is a kill while serving it)
        wait_until(sub { grep { -e "$DIR/sleeping-$_" } NarwhalTest::worker_pids($s->pid) }, 5);
        my @w = grep { `cat /proc/$_/cmdline 2>/dev/null` =~ /worker/ } NarwhalTest::children_of($s->pid);
        kill KILL => @w;
        wait_until(sub { NarwhalTest::worker_pids($s->pid) >= 2 && !grep { kill 0 => $_ } @w }, 5);
    }
    unlike($s->log_text, qr/GET \/sleep killed/, 'workers killed with KILL while serving /sleep: no back-off');
    $s->stop;
};

# --crash-backoff 0: every request runs the app (and crashes).
my $part_off = sub {
    my $s = spawn_server(app => $APP, args => [ @NM, '--max-workers', 2, '--crash-backoff', 0 ]);
    my @got = map { status_of($s->port, '/segv') } 1 .. 5;
    is("@got", '0 0 0 0 0', '--crash-backoff 0: never answered 503');
    $s->stop;
};

# (each part on a server of its own: all three at once)
in_parallel($part_backoff, $part_not_a_loop, $part_off);
done_testing();
