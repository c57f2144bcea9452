use strict;
use warnings;
use Test::More;
use lib 't/lib';
use IO::Socket::INET ();
use Time::HiRes qw(time);
use NarwhalTest qw(spawn_server free_port http_get);

# The suite's own harness, where a flaw would show as a test failing at
# random elsewhere.

# 1. Two servers drew the same port from free_port: the one that binds
# second exits, and a connect to the port reaches the other. spawn_server
# must not take the other's listener for its server's: it starts its
# server again on a new port.
{
    my $taken = free_port();
    my $other = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => $taken,
                                      Listen => 5, ReuseAddr => 1) or die "listen: $!";
    my @draws = ($taken);
    my $draw = \&NarwhalTest::free_port;
    no warnings 'redefine';
    local *NarwhalTest::free_port = sub { @draws ? shift @draws : $draw->() };
    my $s = spawn_server();
    isnt($s->port, $taken, 'a server that lost its port to another is started on a new one');
    is(http_get($s->port, '/')->{status}, 200, '... and it serves there');
    unlike($s->log_text, qr/cannot listen/, '... its log its own');
}

# 2. A server that exits as it starts is reported at once, with its log.
{
    my $t0 = time;
    eval { spawn_server(args => [ '--no-such-option' ]) };
    like($@, qr/exited as it started.*no-such-option/s, 'a server that exits at start: its log says why');
    cmp_ok(time - $t0, '<', 5, '... at once, not after the start-up timeout');
}

done_testing();
