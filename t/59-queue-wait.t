use strict;
use warnings;
use Test::More;
use lib 't/lib';
use IO::Select ();
use Time::HiRes qw(time sleep);
use NarwhalTest qw(spawn_server write_app wait_until manager_fallback free_port http_get worker_pids
                   raw_connect read_response);

# Latency as the client sees it: a slow app behind too few workers makes
# requests wait in the connection manager's queue. That wait is in
# narwhal_request_queue_seconds, the app's time in
# narwhal_request_duration_seconds, and together they make what the
# clients measured (within 15% + 50 ms). The duration histogram resolves
# a fast app (buckets from 100 us).

my @NM = manager_fallback();
plan skip_all => 'the status pages need the connection manager'
    if @NM || grep { $_ eq '--no-manager' } NarwhalTest::extra_args();

my $APP = write_app(<<'APP');
sub {
    my $env = shift;
    Time::HiRes::sleep($1) if $env->{PATH_INFO} =~ m{^/sleep/([\d.]+)};
    [200, ['Content-Type' => 'text/plain'], ["ok\n"]];
}
APP

sub metrics {
    my ($sport) = @_;
    my $text = http_get("http://127.0.0.1:$sport", '/metrics')->{content} // '';
    my %v = map { /^(\S+) (\S+)$/ ? ($1 => $2) : () } grep { !/^#/ } split /\n/, $text;
    return \%v;
}

my $sport = free_port();
# One worker; connections go to the manager as soon as they are quiet.
my $s = spawn_server(app => $APP, args => [ '--max-workers', 1, '--keepalive-wait', 0,
                                            '--status-listen', "127.0.0.1:$sport" ]);
wait_until(sub { worker_pids($s->pid) == 1 }, 5);

my @c = map { raw_connect($s->port) } 1 .. 4;
for my $c (@c) {     # each served once; then idle in the manager
    syswrite($c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    read_response($c, 5);
}
ok(wait_until(sub { (metrics($sport)->{'narwhal_connections{state="idle"}'} // 0) == 4 }, 5),
   'four idle connections in the manager');
my $before = metrics($sport);

# All four ask at once for 0.3 s of work: one worker serves them in turn.
my %sent;
for my $i (0 .. 3) {
    $sent{$i} = time;
    syswrite($c[$i], "GET /sleep/0.3 HTTP/1.1\r\nHost: x\r\n\r\n");
}
my %took;
my %buf;
my $sel = IO::Select->new(@c);
my $end = time + 10;
while (keys %took < 4 && time < $end) {
    for my $h ($sel->can_read(0.5)) {
        my ($i) = grep { $c[$_] == $h } 0 .. 3;
        sysread($h, $buf{$i}, 65536, length($buf{$i} // '')) or next;
        $took{$i} //= time - $sent{$i} if $buf{$i} =~ /\r\n\r\nok\n/;
    }
}
is(scalar keys %took, 4, 'four answers');
my $client = 0;
$client += $_ for values %took;
sleep 0.2;
my $after = metrics($sport);
my $queue = $after->{narwhal_request_queue_seconds_sum} - $before->{narwhal_request_queue_seconds_sum};
my $service = $after->{narwhal_request_duration_seconds_sum} - $before->{narwhal_request_duration_seconds_sum};
is($after->{narwhal_request_queue_seconds_count} - $before->{narwhal_request_queue_seconds_count}, 4,
   'four waits in the queue histogram');
cmp_ok($queue, '>', 1.2, sprintf('they waited (%.3f s in all; about 0 + 0.3 + 0.6 + 0.9)', $queue));
my $sum = $queue + $service;
cmp_ok(abs($sum - $client), '<', 0.15 * $client + 0.05,
       sprintf('queue %.3f s + service %.3f s = %.3f s, the clients measured %.3f s', $queue, $service, $sum, $client));
# The queue histogram's buckets: cumulative, ending at the count.
my @qb = map { $after->{"narwhal_request_queue_seconds_bucket{le=\"$_\"}"} }
         qw(0.001 0.0025 0.005 0.01 0.025 0.05 0.1 0.25 0.5 1 2.5 5 10 30 +Inf);
ok(!grep({ !defined } @qb), 'the queue histogram has its buckets, 1 ms to 30 s');
is($qb[-1], $after->{narwhal_request_queue_seconds_count}, '+Inf is the count');

# A fast app: its requests fall in the first buckets, not all in one.
for (1 .. 20) {
    syswrite($c[0], "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    read_response($c[0], 5);
}
my $m = metrics($sport);
cmp_ok($m->{'narwhal_request_duration_seconds_bucket{le="0.005"}'} // 0, '>=', 20,
       'fast requests are under 5 ms');
ok(defined $m->{'narwhal_request_duration_seconds_bucket{le="0.0001"}'}
   && defined $m->{'narwhal_request_duration_seconds_bucket{le="0.00025"}'}, '... with buckets below 5 ms to tell them apart');
$s->stop;
done_testing();
