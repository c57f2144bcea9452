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

# /hold runs until the test creates its file: the busy request lasts as
# long as the checks below need it, and not a moment longer.
my $RELEASE = NarwhalTest::tmpdir() . '/t58-release';
my $APP = write_app(<<"APP");
sub {
    my \$env = shift;
    if (\$env->{PATH_INFO} eq '/hold') {
        my \$end = time + 30;
        Time::HiRes::sleep(0.01) until -e '$RELEASE' || time > \$end;
    }
    [200, ['Content-Type' => 'text/plain'], ["pid=\$\$\n"]];
}
APP

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

# The busy request first, on one worker; then the ten clients, which the
# other worker serves and parks. (The other way round, the busy request
# could land on the worker the ten are parked in, whose park watcher hands
# them to the manager 50 ms into it: a count taken before that and one
# after would disagree.)
my $busy = raw_connect($s->port);
syswrite($busy, "GET /hold HTTP/1.1\r\nHost: x\r\n\r\n");
ok(wait_until(sub { (states($sport)->{worker} // 0) == 1 }, 3), 'one request being served');
my @keep;
for (1 .. 10) {
    my $c = raw_connect($s->port);
    syswrite($c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    my $r = read_response($c, 5);
    push @keep, $c if $r && $r->{status} == 200;
}
is(scalar @keep, 10, 'ten keep-alive clients served, their connections open');
# (the last of the ten is counted as in its worker until the worker is
# back from it and has parked it, a moment after the client has its answer)
my $st;
wait_until(sub { $st = states($sport); ($st->{worker} // 0) == 1 }, 5);
cmp_ok($st->{parked} // 0, '>', 0, "some connections are parked in workers ($st->{parked})");
is(total($st), 11, 'the states add up to the 11 open connections') or diag explain $st;

my $j = eval { JSON::PP->new->decode(http_get("http://127.0.0.1:$sport", '/status.json')->{content}) } || {};
is($j->{connections}{total}, 11, '/status.json says 11 in all');
is($j->{connections}{parked}, $st->{parked}, '... and the same parked count');
like(http_get("http://127.0.0.1:$sport", '/status')->{content}, qr{open connections}, '/status shows the total');

close $_ for @keep;
ok(wait_until(sub { total(states($sport)) == 1 }, 5), 'closed ones leave the count (the busy one is left)')
    or diag explain states($sport);
open(my $release, '>', $RELEASE) or die "$RELEASE: $!";
close $release;
read_response($busy, 5);
close $busy;    # (an open one would keep the stop lingering for it: 1 s)
$s->stop;
done_testing();
