# Stress, not run by `make test`: prove -b xt/soak-signals.t
# wrk keeps 200 keep-alive connections busy for 20 s while the master gets
# HUP, TTIN or TTOU every second. Expect no socket errors and no non-2xx
# responses.
use strict;
use warnings;
use Test::More;
use lib 't/lib';
use NarwhalTest qw(spawn_server);

plan skip_all => 'wrk not installed' unless grep { -x "$_/wrk" } split /:/, $ENV{PATH};
my $srv = spawn_server(app => "sub { [200, ['Content-Type' => 'text/plain'], ['soak']] }",
                       args => ['--max-workers' => 2]);
my $port = $srv->port;
my $pid = open(my $wrk, '-|', 'wrk', '-t2', '-c200', '-d20s', '--timeout', '5s',
               "http://127.0.0.1:$port/") or die "wrk: $!";
for my $i (1 .. 18) {
    sleep 1;
    kill(($i % 3 == 0 ? 'TTIN' : $i % 3 == 1 ? 'HUP' : 'TTOU'), $srv->pid);
}
my $out = do { local $/; <$wrk> };
close $wrk;
diag($out);
my ($reqs) = $out =~ /(\d+) requests in/;
ok($reqs && $reqs > 10_000, "wrk made requests ($reqs)");
unlike($out, qr/Non-2xx/, 'no non-2xx responses');
my ($connect, $read, $write, $timeout) = $out =~ /Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)/;
is($connect // 0, 0, 'no connect errors');
is($timeout // 0, 0, 'no timeouts');
is(($read // 0) + ($write // 0), 0, 'no read or write errors');
done_testing;
