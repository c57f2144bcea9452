use strict;
use warnings;
use Test::More;
use lib 't/lib';
use JSON::PP ();
use Time::HiRes qw(time sleep);
use NarwhalTest qw(spawn_server write_app wait_until manager_fallback free_port http_get worker_pids
                   raw_connect read_response);

# narwhal_connections counts every open client connection once: idle in
# the manager, parked in a worker, being served. Connections parked in a
# worker were in no state (16 clients on 4 workers showed as 4).

my @NM = manager_fallback();
plan skip_all => 'the status pages need the connection manager'
    if !NarwhalTest::managed();

my $APP = NarwhalTest::sleepy_app('"pid=$$\n"');

sub states {
    my ($sport) = @_;
    my $r = http_get("http://127.0.0.1:$sport", '/metrics');
    my %s;
    $s{$1} = $2 while $r->{content} =~ /^narwhal_connections\{state="(\w+)"\} (\d+)$/mg;
    return \%s;
}
sub total { my $s = shift; my $t = 0; $t += $_ for values %$s; return $t }

my $sport = free_port();
# connections stay parked in their worker for 30 s (--keepalive-wait)
my $s = spawn_server(app => $APP, args => [ '--max-workers', 2, '--keepalive-wait', 30,
                                            '--status-listen', "127.0.0.1:$sport" ]);
wait_until(sub { worker_pids($s->pid) == 2 }, 5);

my @keep;
for (1 .. 10) {
    my $c = raw_connect($s->port);
    syswrite($c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    my $r = read_response($c, 5);
    push @keep, $c if $r && $r->{status} == 200;
}
is(scalar @keep, 10, 'ten keep-alive clients served, their connections open');
my $busy = raw_connect($s->port);
syswrite($busy, "GET /sleep/3 HTTP/1.1\r\nHost: x\r\n\r\n");
ok(wait_until(sub { (states($sport)->{worker} // 0) == 1 }, 3), 'one request being served');
my $st = states($sport);
cmp_ok($st->{parked} // 0, '>', 0, "some connections are parked in workers ($st->{parked})");
is(total($st), 11, 'the states add up to the 11 open connections') or diag explain $st;

my $j = eval { JSON::PP->new->decode(http_get("http://127.0.0.1:$sport", '/status.json')->{content}) } || {};
is($j->{connections}{total}, 11, '/status.json says 11 in all');
is($j->{connections}{parked}, $st->{parked}, '... and the same parked count');
like(http_get("http://127.0.0.1:$sport", '/status')->{content}, qr{open connections}, '/status shows the total');

close $_ for @keep;
ok(wait_until(sub { total(states($sport)) == 1 }, 5), 'closed ones leave the count (the busy one is left)')
    or diag explain states($sport);
read_response($busy, 5);
$s->stop;
done_testing();
