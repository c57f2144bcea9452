use strict;
use warnings;
use Test::More;
use lib 't/lib';
use JSON::PP ();
use POSIX ();
use Time::HiRes qw(time sleep);
use NarwhalTest qw(spawn_server sleepy_app wait_until manager_fallback free_port http_get
                   metrics_of raw_connect read_response);

# narwhal_connections puts every open client connection in exactly one
# state, whenever it is read. 12 keep-alive clients of a 200 ms app on 4
# workers: 4 requests run while the other 8 wait, between the manager
# and the workers (a worker whose requests block hands its clients to the
# manager after each response, and their next requests wait on the serve
# queue). The gauge read "worker 4" and 0 in every other state, five times
# out of five: a busy worker stood for one connection, and nothing counted
# the serve queue. Each sample must add up to the 12.

my @NM = manager_fallback();
plan skip_all => 'the status pages need the connection manager'
    if !NarwhalTest::managed();

my $CLIENTS = 12;
my $sport = free_port();
my $s = spawn_server(app => sleepy_app(), args => [ '--max-workers', 4,
                                                    '--status-listen', "127.0.0.1:$sport" ]);
ok(wait_until(sub { (metrics_of($sport)->{'narwhal_workers{state="idle"}'} // 0) == 4 }, 10),
   'four workers up');

# Each client: one connection, a request of 200 ms after another, until
# told to stop (a file), never retrying.
my $STOP = NarwhalTest::tmpdir() . '/t81-stop';
my @kids;
for my $i (1 .. $CLIENTS) {
    my $pid = fork // die "fork: $!";
    if (!$pid) {
        my $c = raw_connect($s->port) or POSIX::_exit(3);
        my $n = 0;
        until (-e $STOP) {
            syswrite($c, "GET /sleep/0.2 HTTP/1.1\r\nHost: x\r\n\r\n");
            my $r = read_response($c, 10);
            POSIX::_exit(1) unless $r && $r->{status} == 200;
            $n++;
        }
        POSIX::_exit($n ? 0 : 2);
    }
    push @kids, $pid;
}

sub states {
    my $m = metrics_of($sport);
    return { map { /^narwhal_connections\{state="(\w+)"\}$/ ? ($1 => $m->{$_}) : () } keys %$m };
}
sub total { my $t = 0; $t += $_ for values %{ $_[0] }; return $t }

# (until all twelve have connected and the requests flow)
ok(wait_until(sub { total(states()) == $CLIENTS }, 10), "the $CLIENTS clients are counted")
    or diag explain states();
sleep 0.5;
my ($bad, $queued, $waiting) = (0, 0, 0);
for my $n (1 .. 10) {
    my $st = states();
    my $t = total($st);
    $bad++ if $t != $CLIENTS;
    $queued++ if ($st->{queued} // 0) > 0;
    note join ' ', "sample $n: total $t:", map { "$_=$st->{$_}" } sort keys %$st;
    diag explain $st if $t != $CLIENTS;
    my $j = eval { JSON::PP->new->decode(http_get($sport, '/status.json')->{content}) } || {};
    $waiting++ if ($j->{requests_waiting}{total} // 0) > 0;
    sleep 0.1;
}
is($bad, 0, "every sample of narwhal_connections adds up to the $CLIENTS open connections");
cmp_ok($queued, '>', 0, "... some with requests queued for a worker ($queued of 10)");
cmp_ok($waiting, '>', 0, "/status.json says requests wait for a worker ($waiting of 10)");

open(my $fh, '>', $STOP) or die "$STOP: $!";
close $fh;
my $failed = 0;
for my $pid (@kids) {
    waitpid($pid, 0);
    $failed++ if $?;
}
is($failed, 0, 'every client got every answer');
ok(wait_until(sub { total(states()) == 0 }, 5), 'and once they are gone, nothing is counted')
    or diag explain states();
$s->stop;
done_testing();
