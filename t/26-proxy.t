use strict;
use warnings;
use Test::More;
use Test2::IPC;    # (parts of this file run in processes of their own)
use lib 't/lib';
use Time::HiRes qw(time sleep);
use NarwhalTest qw(spawn_server spawn_servers write_app raw_connect read_response read_until_close
                   wait_until manager_fallback narwhal_cmd run_cmd free_port worker_pids metrics_of
                   in_parallel);

# --proxy-protocol and --proxy-from with real sockets: the client's address
# comes from the header (v1 and v2, whole or a byte at a time, split across
# a hand-off to the manager), keep-alive keeps it across hand-offs, a
# connection without a valid header is closed unanswered, and --proxy-from
# turns other peers away.

my @NM = manager_fallback();
my $MANAGED = NarwhalTest::managed();

my $APP = write_app(<<'APP');
sub { my $env = shift;
      $env->{PATH_INFO} eq '/server'
          ? [200, ['Content-Type' => 'text/plain'], ["server_port=$env->{SERVER_PORT}\n"]]
          : [200, ['Content-Type' => 'text/plain'], ["remote=$env->{REMOTE_ADDR} port=$env->{REMOTE_PORT}\n"]] }
APP

sub server_args { return { app => $APP, args => [ @NM, '--proxy-protocol', @_ ] } }
sub server { spawn_server(%{ server_args(@_) }) }

my $GET = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
my $V1 = "PROXY TCP4 203.0.113.7 10.0.0.1 51234 80\r\n";
my $V2_TCP6 = "\r\n\r\n\0\r\nQUIT\n\x21\x21" . pack('n', 36)
            . "\x20\x01\x0d\xb8" . ("\0" x 11) . "\x01" . ("\0" x 16) . pack('nn', 4444, 443);
my $V2_LOCAL = "\r\n\r\n\0\r\nQUIT\n\x20\x00\x00\x00";

sub body_of { my $r = shift; return $r ? $r->{body} : '(no answer)' }

# The parts below run at once, each with servers of its own.
my $part_headers = sub {
    my $sport = free_port();
    # (--keepalive-wait 0.1: a connection served is parked that long, then it is the manager's)
    my $s = server('--max-workers', 2, '--keepalive-wait', 0.1,
                   ($MANAGED ? ('--status-listen', "127.0.0.1:$sport") : ()));
    my $port = $s->port;
    wait_until(sub { worker_pids($s->pid) == 2 }, 10);
    # The connections the workers have handed to the manager so far, and a
    # wait until they have handed one more (without a manager, a pause).
    my $handoffs = sub {
        return 0 unless $MANAGED;
        return metrics_of($sport)->{'narwhal_handoffs_total{direction="to_manager"}'} // 0;
    };
    my $one_more = sub {
        my ($before) = @_;
        return sleep 0.5 unless $MANAGED;
        ok(wait_until(sub { $handoffs->() > $before }, 10), '... handed to the manager meanwhile');
    };

    {
        my $c = raw_connect($port);
        my $before = $handoffs->();
        syswrite($c, $V1 . $GET);
        is(body_of(read_response($c, 5)), "remote=203.0.113.7 port=51234\n", 'v1: REMOTE_ADDR and REMOTE_PORT from the header');
        $one_more->($before);    # parked, then the manager's
        syswrite($c, $GET);
        is(body_of(read_response($c, 5)), "remote=203.0.113.7 port=51234\n", '... and on the next request, after a hand-off');
    }
    {
        my $c = raw_connect($port);
        for my $byte (split //, $V2_TCP6) { syswrite($c, $byte); sleep 0.002 }
        syswrite($c, $GET);
        is(body_of(read_response($c, 5)), "remote=2001:db8::1 port=4444\n", 'v2 TCP6, a byte at a time');
    }
    {
        my $c = raw_connect($port);
        my $before = $handoffs->();
        syswrite($c, substr($V1, 0, 12));
        $one_more->($before);    # the header is incomplete: the connection goes to the manager
        syswrite($c, substr($V1, 12) . $GET);
        is(body_of(read_response($c, 5)), "remote=203.0.113.7 port=51234\n", 'a header split across a pause');
    }
    {
        my $c = raw_connect($port);
        syswrite($c, $V1 . "GET /server HTTP/1.1\r\nHost: x\r\n\r\n");
        is(body_of(read_response($c, 5)), "server_port=80\n", 'SERVER_PORT is the port the client reached the balancer on');
        my $l = raw_connect($port);
        syswrite($l, $V2_LOCAL . "GET /server HTTP/1.1\r\nHost: x\r\n\r\n");
        is(body_of(read_response($l, 5)), "server_port=$port\n", '... and the listener\'s after a LOCAL header (never a stale one)');
    }
    {
        my $c = raw_connect($port);
        syswrite($c, $V2_LOCAL . $GET);
        is(body_of(read_response($c, 5)), "remote=127.0.0.1 port=" . $c->sockport . "\n",
           'LOCAL (a health check): the socket\'s own address');
    }
    for my $case ([ 'no header', $GET ], [ 'a bad header', "PROXY TCP4 1.2.3.4\r\n$GET" ],
                  [ 'a v1 header in lower case', lc($V1) . $GET ]) {
        my ($name, $bytes) = @$case;
        my $c = raw_connect($port);
        syswrite($c, $bytes);
        my $t0 = time;
        is(read_until_close($c, 5), '', "$name: closed without an answer");
        ok(time - $t0 < 2, '... at once');
    }
    SKIP: {
        skip 'hand-off counts need the status listener (the manager)', 1 unless $MANAGED;
        my $c = raw_connect($sport);
        syswrite($c, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        my ($n) = body_of(read_response($c, 5)) =~ /^narwhal_handoffs_total\{direction="to_manager"\} (\d+)$/m;
        ok($n && $n > 0, "connections went through the manager ($n hand-offs) and kept their addresses");
    }
    $s->stop;
};

# --proxy-from (two servers, started at once)
my $part_from = sub {
    my ($deny, $allow) = spawn_servers(server_args('--proxy-from', '10.0.0.0/8'),
                                       server_args('--proxy-from', '10.0.0.0/8', '--proxy-from', '127.0.0.1'));
    my $c = raw_connect($deny->port);
    syswrite($c, $V1 . $GET);
    is(read_until_close($c, 5), '', '--proxy-from 10.0.0.0/8: a peer at 127.0.0.1 is closed');
    $deny->stop;
    $c = raw_connect($allow->port);
    syswrite($c, $V1 . $GET);
    is(body_of(read_response($c, 5)), "remote=203.0.113.7 port=51234\n", '--proxy-from 127.0.0.1: served');
};

# Refusals: one line, non-zero exit.
my $part_refusals = sub {
    for my $case ([ [ '--proxy-from', '10.0.0.0/8' ], qr/--proxy-from needs --proxy-protocol/ ],
                  [ [ '--proxy-protocol', '--proxy-from', '10.0.0.0/40' ], qr/--proxy-from wants an address or CIDR, not '10\.0\.0\.0\/40'/ ]) {
        my ($args, $want) = @$case;
        my $r = run_cmd([ narwhal_cmd(), '--listen', '127.0.0.1:' . free_port(), @$args, $APP ], timeout => 10);
        isnt($r->{code}, 0, "@$args: refused");
        like($r->{err}, $want, '... saying why, in one line');
    }
};

in_parallel($part_headers, $part_from, $part_refusals);
done_testing();
