use strict;
use warnings;
use Test::More;
use Test2::IPC;    # (the clients run in processes of their own)
use Socket qw(PF_INET SOCK_STREAM SOL_SOCKET SO_RCVBUF pack_sockaddr_in inet_aton);
use Time::HiRes qw(time sleep);
use lib 't/lib';
use NarwhalTest qw(spawn_servers in_parallel read_response manager_built);

# A client's keep-alive time starts when the response has left the
# server, not when it began (DESIGN.md, "Slow readers"): a client that
# takes longer than --keepalive-timeout to read a response still finds
# its connection open when it sends the next request. It used to be
# closed as its last bytes arrived: the response sat in the socket's send
# buffer, which a slow reader empties last, while the keep-alive time
# ran. Real sockets: a small receive buffer, a client that reads at 2 MB
# a second, a 4 MB response (about 2 s) under --keepalive-timeout 1; an
# array body (the manager finishes it) and a streamed one (the worker
# writes it all), with the manager and without.

my $MB = 1024 * 1024;
my $app = <<"APP";
my \$big = 'x' x (4 * $MB);
sub {
    my \$env = shift;
    my \$p = \$env->{PATH_INFO};
    return [200, ['Content-Type' => 'text/plain'], [\$big]] if \$p eq '/big';
    if (\$p eq '/stream') {
        return sub {
            my \$w = \$_[0]->([200, ['Content-Type' => 'text/plain']]);
            \$w->write(substr(\$big, \$_ * 65536, 65536)) for 0 .. 63;
            \$w->close;
        };
    }
    return [200, ['Content-Type' => 'text/plain'], ["small\\n"]];
}
APP

my @modes = manager_built() ? ('manager', 'no-manager') : ('no-manager');
my %srv;
@srv{@modes} = spawn_servers(map {
    { app => $app, args => [ '--max-workers', 4, '--keepalive-timeout', 1,
                             $_ eq 'no-manager' ? '--no-manager' : () ] }
} @modes);

# A connection whose receive buffer is small (set before connect: the
# window follows it), so that the response waits in the server's socket.
sub small_window_connect {
    my ($port) = @_;
    socket(my $s, PF_INET, SOCK_STREAM, 0) or die "socket: $!";
    setsockopt($s, SOL_SOCKET, SO_RCVBUF, pack('i', 8192)) or die "SO_RCVBUF: $!";
    connect($s, pack_sockaddr_in($port, inet_aton('127.0.0.1'))) or die "connect: $!";
    return $s;
}

# Read one response at $rate bytes a second; its body's length (-1:
# the connection closed first) and how long it took.
sub read_slowly {
    my ($s, $rate) = @_;
    my ($buf, $t0) = ('', time);
    while (1) {
        my $res = NarwhalTest::parse_response($buf);
        return (length $res->{body}, time - $t0) if $res;
        my $n = sysread($s, my $chunk, 16384);
        return (-1, time - $t0) unless $n;
        $buf .= $chunk;
        my $wait = $t0 + length($buf) / $rate - time;     # (one reading of the clock:
        sleep($wait) if $wait > 0;                          # a second could be past it)
    }
}

in_parallel(map {
    my ($mode, $path) = @$_;
    sub {
        my $s = small_window_connect($srv{$mode}->port);
        syswrite($s, "GET $path HTTP/1.1\r\nHost: x\r\n\r\n");
        my ($len, $took) = read_slowly($s, 2 * $MB);
        is($len, 4 * $MB, "$mode, $path: the whole 4 MB body, read slowly");
        cmp_ok($took, '>', 1.5, "$mode, $path: ... in more than --keepalive-timeout ("
                                . sprintf('%.2f s', $took) . ')');
        syswrite($s, "GET /small HTTP/1.1\r\nHost: x\r\n\r\n");
        my $res = read_response($s, 5);
        is($res && $res->{body}, "small\n",
           "$mode, $path: the next request on the connection is answered");
        # the keep-alive time still holds once the response has left
        my $t0 = time;
        my $got = sysread($s, my $more, 100);
        my $idle = time - $t0;
        ok(!$got && $idle > 0.8 && $idle < 3,
           "$mode, $path: ... and the connection closes after --keepalive-timeout idle ("
           . sprintf('%.2f s', $idle) . ')');
    }
} map { my $m = $_; map { [ $m, $_ ] } '/big', '/stream' } @modes);

done_testing();
