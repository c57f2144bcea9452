use strict;
use warnings;
use Test::More;
use lib 't/lib';
use Time::HiRes qw(time sleep);
use NarwhalTest qw(spawn_server write_app raw_connect read_response wait_until narwhal_cmd
                   free_port metrics_of);

# A worker at its open-file limit does not lose the connections the
# manager serves it. Each comes as a frame on the serve queue with its
# descriptor, and a frame taken without room for the descriptor came
# without it (the kernel drops it: MSG_CTRUNC): the client's request was
# lost, closed unanswered. Now the worker keeps one descriptor spare and
# takes a frame only with room for it; without, the frame waits on the
# queue (said and counted as a refused accept is) until the worker has
# room. The clients never retry: each counts its one answer, or none.

plan skip_all => 'the connection manager serves connections to the workers'
    if !NarwhalTest::managed();

# /hog: after its answer (psgix.cleanup) the worker opens /dev/null until
# the open-file limit refuses, and keeps them all: every descriptor the
# process may have is in use. The worker gets room again when it lets
# the /hog client's kept-alive connection go to the manager
# (--keepalive-wait) and closes its copy.
my $APP = write_app(<<'APP');
my @held;
sub { my $env = shift;
      if ($env->{PATH_INFO} eq '/hog') {
          push @{ $env->{'psgix.cleanup.handlers'} }, sub {
              while (open(my $fh, '<', '/dev/null')) { push @held, $fh }
          };
      }
      [200, ['Content-Type' => 'text/plain'], ["pid=$$ held=" . scalar(@held) . "\n"]] }
APP

my $sport = free_port();
my $port = free_port();
my $s = spawn_server(app => $APP, port => $port, command => [
    'sh', '-c', 'ulimit -n 64 && exec "$@"', 'sh', narwhal_cmd(), '--listen', "127.0.0.1:$port",
    '--workers', 1, '--max-workers', 1, '--keepalive-timeout', 30, '--keepalive-wait', 2,
    '--status-listen', "127.0.0.1:$sport", $APP ]);

sub request {    # connection, path -> the response, or undef (closed unanswered)
    my ($c, $path) = @_;
    syswrite($c, "GET $path HTTP/1.1\r\nHost: x\r\n\r\n") or return undef;
    return read_response($c, 10);
}

# A and C: answered once, then idle past --keepalive-wait: the manager
# holds them, and serves their next request through the serve queue.
my %c = map { $_ => raw_connect($port) } qw(A C B);
for my $k (qw(A C)) {
    my $r = request($c{$k}, '/');
    is($r && $r->{status}, 200, "client $k: a first request answered");
}
sleep 3;

my $hog = request($c{B}, '/hog');
is($hog && $hog->{status}, 200, 'client B: /hog answered (then the worker fills its open-file table)');
sleep 0.3;

# Both ask again at once: one takes the spare descriptor's room, the
# other waits on the serve queue until B's connection goes to the
# manager and the worker has room again.
my $t0 = time;
syswrite($c{$_}, "GET /again HTTP/1.1\r\nHost: x\r\n\r\n") for qw(A C);
for my $k (qw(A C)) {
    my $r = read_response($c{$k}, 10);
    is($r && $r->{status}, 200, "client $k: its request served through the serve queue is answered, not lost");
    like($r ? $r->{body} : '', qr/held=[1-9]\d*/, '... by the worker whose table was full');
}
cmp_ok(time - $t0, '<', 8, '... within the wait for room (--keepalive-wait 2 s)');
ok(wait_until(sub { $s->log_text =~ /cannot take a connection from the manager: Too many open files \(open-file limit 64\); it waits in the serve queue/ }, 5),
   'the worker said it left a connection on the serve queue for want of a descriptor');
unlike($s->log_text, qr/connection from the manager was lost/, '... and lost none');
my $m = metrics_of($sport);
my $refused = $m->{'narwhal_failures_total{kind="fd_limit"}'} // 0;
cmp_ok($refused, '>', 0, '... counted: narwhal_failures_total{kind="fd_limit"}');
# Meanwhile the serve queue is out of the worker's epoll set, tried again
# every NW_FD_ROOM_RETRY_MS (50): about 40 tries in the 2 s, where a
# worker woken at once by the level-triggered queue tried 1.9 million
# times (a CPU busy for nothing).
cmp_ok($refused, '<', 400, "... tried again now and then, not in a busy loop ($refused tries)");
my $after = request(raw_connect($port), '/after');
is($after && $after->{status}, 200, 'the server goes on');

close $_ for values %c;
$s->stop;

# 2. With a second worker: a frame whose wake-up the full worker took is
# not left waiting for that worker to have room again. The serve queue
# wakes one idle worker, the first of those in epoll; the full one then
# leaves the frame and steps out of epoll, and nothing wakes the other.
# The manager sees a frame waiting NW_SERVE_REPOST_MS (100 ms) while a
# worker is idle, takes it back and sends it again: the other worker
# takes it. Before, it waited until the full worker let its parked /hog
# connection go (--keepalive-wait 5: about 5 s). Every request here comes
# through the serve queue (each client idle in the manager first), so
# the first worker in line serves /hog and the first request after it
# (through its spare), and the next ones one at a time.
{
    my $port = free_port();
    my $s = spawn_server(app => $APP, port => $port, command => [
        'sh', '-c', 'ulimit -n 64 && exec "$@"', 'sh', narwhal_cmd(), '--listen', "127.0.0.1:$port",
        '--workers', 2, '--max-workers', 2, '--keepalive-timeout', 30, '--keepalive-wait', 5, $APP ]);
    my @c = map { raw_connect($port) } 1 .. 5;
    request($_, '/') for @c;
    sleep 5.5;      # (past --keepalive-wait: the manager holds them all)
    my $b = shift @c;
    my $hog = request($b, '/hog');
    my ($full) = ($hog && $hog->{body}) =~ /pid=(\d+)/;
    ok($full, 'a worker filled its open-file table');
    sleep 0.3;
    my (@late, %by);
    for my $i (0 .. $#c) {
        my $t0 = time;
        my $r = request($c[$i], '/again');
        my $took = time - $t0;
        push @late, sprintf('%d: %s after %.2f s', $i, $r ? $r->{status} : 'none', $took)
            if !$r || $r->{status} != 200 || $took > 1.5;
        $by{$r && $r->{body} =~ /pid=(\d+)/ ? ($1 == ($full // 0) ? 'full' : 'other') : 'none'}++;
        sleep 0.2;  # (the full worker is back in epoll, and first in line again, or not)
    }
    is("@late", '', 'one request at a time through the serve queue beside a full worker: '
                    . 'each answered within 1.5 s') or diag explain \%by;
    like($s->log_text, qr/manager warn: a request waited \d+ ms on the serve queue while a worker was idle/,
         '... the manager said it sent one again') if @late == 0 && ($by{other} // 0);
    close $_ for @c, $b;
    $s->stop;
}
done_testing;
