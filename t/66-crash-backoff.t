use strict;
use warnings;
use Test::More;
use lib 't/lib';
use Time::HiRes qw(time sleep);
use NarwhalTest qw(spawn_server write_app raw_connect read_response read_until_close wait_until
                   manager_fallback free_port);

# --crash-backoff: a route ("METHOD path") that kills its worker again
# and again is answered 503 by the workers, without running the app, for
# a back-off that doubles while it goes on; the other routes are served
# as always, and the route is tried again after each back-off. Before,
# every request to it cost a worker and a fork: four clients on such a
# URL cut everyone else's throughput about 80 times.

my @NM = manager_fallback();
my $MANAGED = !@NM && !grep { $_ eq '--no-manager' } NarwhalTest::extra_args();

my $APP = write_app(<<'APP');
sub { my $env = shift;
      kill SEGV => $$ if $env->{PATH_INFO} eq '/segv';
      [200, ['Content-Type' => 'text/plain'], ["ok pid=$$\n"]] }
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

{
    my $sport = free_port();
    my $s = spawn_server(app => $APP, args => [ @NM, '--max-workers', 2, '--crash-backoff', 1,
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
    like($s->log_text, qr/GET \/segv killed 3 workers in 10 s: answered 503 for 1 s, then tried again/,
         'the back-off is logged once, with the route and the count');
    my $log_lines = () = $s->log_text =~ /answered 503 for/g;
    is($log_lines, 1, '... once');

    # after the back-off it is tried again; it crashes again: 2 s this time
    sleep 1.1;
    is(status_of($s->port, '/segv'), 0, 'after the back-off the route runs again (and crashes)');
    ok(wait_until(sub { status_of($s->port, '/segv') == 503 }, 2), '... and is answered 503 at once');
    like($s->log_text, qr/GET \/segv killed a worker again after its back-off: answered 503 for 2 s/,
         '... for twice as long');
    sleep 1.2;
    is(status_of($s->port, '/segv'), 503, 'still 503 after 1.2 s of the 2 s');
    SKIP: {
        skip 'the metrics need the manager', 1 unless $MANAGED;
        ok((metric($sport, 'narwhal_crash_refused_total') // 0) >= 4,
           'counted: narwhal_crash_refused_total');
    }
    $s->stop;
}

# --crash-backoff 0: every request runs the app (and crashes).
{
    my $s = spawn_server(app => $APP, args => [ @NM, '--max-workers', 2, '--crash-backoff', 0 ]);
    my @got = map { status_of($s->port, '/segv') } 1 .. 5;
    is("@got", '0 0 0 0 0', '--crash-backoff 0: never answered 503');
    $s->stop;
}

done_testing();
