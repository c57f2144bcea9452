use strict;
use warnings;
use Test::More;
use Test2::IPC;    # (parts of this file run in processes of their own)
use lib 't/lib';
use Socket ();
use Time::HiRes qw(time sleep);
use NarwhalTest qw(spawn_server write_app raw_connect read_response read_until_close wait_until
                   manager_fallback worker_pids pid_alive in_parallel free_port metrics_of);
use NarwhalTest::Clients ();

# A connection changes owner: a worker parks it, hands it to the manager,
# the manager hands it back (SERVE) to whichever worker is free, a leaving
# worker's parked connections are adopted by the others, a response the
# client reads slowly is finished by the manager. Whatever the path, the
# connection keeps what is its own: the addresses its PROXY header gave
# (REMOTE_ADDR, REMOTE_PORT, SERVER_PORT), its keep-alive deadline, and
# its request count against --max-keepalive-reqs. One block per path.

my @NM = manager_fallback();
my $MANAGED = NarwhalTest::managed();

my $APP = write_app(<<'APP');
sub { my $env = shift;
      kill SEGV => $$ if $env->{PATH_INFO} eq '/crash';
      my $body = $env->{PATH_INFO} eq '/big' ? 'x' x (8 << 20)
               : "remote=$env->{REMOTE_ADDR} port=$env->{REMOTE_PORT} server_port=$env->{SERVER_PORT} pid=$$\n";
      [200, ['Content-Type' => 'text/plain'], [$body]] }
APP

my $GET = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
sub v1 { my ($i) = @_; "PROXY TCP4 203.0.113.$i 10.0.0.1 5${i}000 80\r\n" }
sub said { my ($i) = @_; qr/^remote=203\.0\.113\.$i port=5${i}000 server_port=80 pid=/ }
sub body_of { my $r = shift; return $r ? $r->{body} : '(no answer)' }
sub pid_of { my $r = shift; return $r && $r->{body} =~ /pid=(\d+)/ ? $1 : 0 }

# Retire the worker that served a response (never signal pid 0: the group).
sub retire {
    my ($pid) = @_;
    return unless $pid > 1;
    kill USR2 => $pid;
    wait_until(sub { !pid_alive($pid) }, 5);
}

# 1. Recycling under keep-alive PROXY clients: every request is answered,
# each with the address its own connection's header gave. A worker at
# its count gives its parked connections to the others (adoption, with
# the manager) or closes them (without): before adopted connections kept
# their PROXY state, the adopter waited for a header that had come long
# ago, read the next GET as a bad one and closed the connection unanswered
# (about 29 connections a recycle at 50 clients).
my $part_recycling = sub {
    my $s = spawn_server(app => $APP, args => [ @NM, '--proxy-protocol', '--max-workers', 2,
                                                 '--max-reqs-per-child', 500, '--min-worker-lifetime', 0 ]);
    my $dir = NarwhalTest::tmpdir();
    # (1.5 s: tens of thousands of requests here, thousands on a loaded
    # machine: several recycles either way)
    my @clients = NarwhalTest::Clients::start_clients($dir, $s->port, 8, '/', 1.5, 0,
                                                      proxy => \&v1, expect => \&said);
    my $t = NarwhalTest::Clients::collect(@clients);
    my $counts = "$t->{sent} sent, $t->{answered} answered, $t->{failed} failed, $t->{reset} reset, "
               . "$t->{wrong} with another address";
    ok($t->{sent} > 2000, "8 PROXY keep-alive clients, a worker recycled every 500 requests ($counts)");
    is($t->{answered}, $t->{sent}, '... every request answered, with its own connection\'s addresses');
    $s->stop;
};

# 2. Adoption, one connection at a time: a worker that retires (USR2, as
# on HUP, TTOU or an early replacement) gives its parked connection to
# another worker, which serves its next request with the same addresses,
# counts it against --max-keepalive-reqs, and keeps its keep-alive
# deadline (it was reset to --read-timeout, 20 s, at the adoption). The
# two connections on servers of their own (the same options), at once.
sub adoption_server {
    my $s = spawn_server(app => $APP, args => [ '--proxy-protocol', '--max-workers', 2,
                                                 '--keepalive-wait', 1.5, '--keepalive-timeout', 2,
                                                 '--max-keepalive-reqs', 3 ]);
    wait_until(sub { worker_pids($s->pid) == 2 }, 10);
    return $s;
}
my $part_adoption = sub { SKIP: {
    skip 'adoption needs the connection manager', 5 unless $MANAGED;
    my $s = adoption_server();
    my $c = raw_connect($s->port);
    syswrite($c, v1(7) . $GET);
    my $r = read_response($c, 5);
    my $first = pid_of($r);
    retire($first);                         # parked there: it goes to the other worker
    syswrite($c, $GET);
    $r = read_response($c, 5);
    like(body_of($r), said(7), 'adopted after its worker retired: the same addresses, SERVER_PORT too');
    ok(pid_of($r) && pid_of($r) != $first, '... served by another worker');
    ok($r && ($r->{headers}{connection} // '') !~ /close/i, '... its 2nd request of 3 keeps it open');
    my $second = pid_of($r);
    retire($second);
    syswrite($c, $GET);
    $r = read_response($c, 5);
    like(body_of($r), said(7), 'adopted twice: still the same addresses');
    like($r ? $r->{headers}{connection} // '' : '', qr/close/i,
         '... and its 3rd request is its last (--max-keepalive-reqs 3 counts across adoptions)');
    $s->stop;
}};
# (the idle one on a server whose keep-alive timeout is 1.2 s, parked for
# 1 s: the retirement comes first, at once; that the connection was
# adopted, not closed by its first worker, the count of adoptions says)
my $part_deadline = sub { SKIP: {
    skip 'adoption needs the connection manager', 2 unless $MANAGED;
    my $sport = free_port();
    my $s = spawn_server(app => $APP, args => [ '--proxy-protocol', '--max-workers', 2,
                                                 '--keepalive-wait', 1, '--keepalive-timeout', 1.2,
                                                 '--status-listen', "127.0.0.1:$sport" ]);
    wait_until(sub { worker_pids($s->pid) == 2 }, 10);
    my $d = raw_connect($s->port);
    syswrite($d, v1(8) . $GET);
    my $t0 = time;
    my $served_by = pid_of(read_response($d, 5));
    kill USR2 => $served_by if $served_by > 1;
    my $rest = read_until_close($d, 8);
    my $after = time - $t0;
    ok($after < 2.4, sprintf('an adopted idle connection is closed at its keep-alive deadline '
                             . '(1.2 s; closed after %.1f s)', $after));
    ok(wait_until(sub { (metrics_of($sport)->{'narwhal_handoffs_total{direction="worker_to_worker"}'} // 0) == 1 }, 5),
       '... adopted by the other worker');
    $s->stop;
}};

# 2b. A worker that crashes gives its parked connections away from its
# crash handler (async-signal-safe): the same record, the same addresses.
my $part_crash = sub { SKIP: {
    skip 'adoption needs the connection manager', 2 unless $MANAGED;
    my $s = spawn_server(app => $APP, args => [ '--proxy-protocol', '--max-workers', 1,
                                                 '--keepalive-wait', 3 ]);
    my $c = raw_connect($s->port);
    syswrite($c, v1(4) . $GET);
    my $first = pid_of(read_response($c, 5));
    my $k = raw_connect($s->port);
    syswrite($k, v1(3) . "GET /crash HTTP/1.1\r\nHost: x\r\n\r\n");
    read_until_close($k, 5);
    syswrite($c, $GET);
    my $r = read_response($c, 5);
    like(body_of($r), said(4), 'parked in a worker that crashed: adopted with its addresses');
    ok(pid_of($r) && pid_of($r) != $first, '... by its successor');
    close $c;    # (an open one would keep the stop lingering for it)
    $s->stop;
}};

# 3. Through the manager and back (HANDOFF, then SERVE): the addresses
# and the request count go with it.
my $part_handoff = sub { SKIP: {
    skip 'hand-offs need the connection manager', 3 unless $MANAGED;
    my $s = spawn_server(app => $APP, args => [ '--proxy-protocol', '--max-workers', 2,
                                                 '--keepalive-wait', 0, '--max-keepalive-reqs', 3 ]);
    my $c = raw_connect($s->port);
    my @r;
    for my $n (1 .. 3) {
        syswrite($c, ($n == 1 ? v1(5) : '') . $GET);
        push @r, read_response($c, 5);
        sleep 0.2;                           # idle: the manager holds it meanwhile
    }
    is(scalar(grep { body_of($_) =~ said(5) } @r), 3, 'through the manager twice: the same addresses');
    ok(($r[1] && ($r[1]{headers}{connection} // '') !~ /close/i), '... the 2nd request keeps it open');
    like($r[2] ? $r[2]{headers}{connection} // '' : '', qr/close/i,
         '... the 3rd is its last (the count went through the manager)');
    $s->stop;
}};

# 4. A response the client reads slowly, finished by the manager (offload),
# then the next request on the same connection. The client's receive
# buffer is 64 KiB, set before the connect, so that the kernel does not
# grow it, and the body is 8 MiB: more than that and the server's send
# buffer (4 MiB at most, tcp_wmem) take, so the worker cannot write it
# all at once (with the kernel's buffers as they came, a 4 MiB body
# sometimes fitted, and no offload happened).
my $part_offload = sub { SKIP: {
    skip 'offload needs the connection manager', 3 unless $MANAGED;
    my $sport = free_port();
    my $s = spawn_server(app => $APP, args => [ '--proxy-protocol', '--max-workers', 1,
                                                 '--max-keepalive-reqs', 3,
                                                 '--status-listen', "127.0.0.1:$sport" ]);
    my $c = IO::Socket::INET->new(Proto => 'tcp') or die "socket: $!";
    $c->setsockopt(Socket::SOL_SOCKET(), Socket::SO_RCVBUF(), 65536) or die "SO_RCVBUF: $!";
    $c->connect(Socket::pack_sockaddr_in($s->port, Socket::inet_aton('127.0.0.1'))) or die "connect: $!";
    syswrite($c, v1(6) . "GET /big HTTP/1.1\r\nHost: x\r\n\r\n");
    # the worker gives up writing, the manager has the rest: read after that
    ok(wait_until(sub { (metrics_of($sport)->{narwhal_offloaded_total} // 0) == 1 }, 10),
       'a response the client does not read: the worker leaves its rest to the manager');
    my $r = read_response($c, 10);
    is(length(body_of($r)), 8 << 20, '8 MiB read after a pause: the manager wrote the rest');
    syswrite($c, $GET);
    $r = read_response($c, 5);
    like(body_of($r), said(6), '... the next request on it has the same addresses');
    close $c;    # (an open one would keep the stop lingering for it)
    $s->stop;
}};

# The rest at once: each part has its own server, and they wait (for
# retirements, keep-alive deadlines, a slow reader), beside the busy
# recycling clients; then the crash alone (a loaded full run once saw its
# parked connection served by the crashed worker's pid with the others
# running beside it).
in_parallel($part_recycling, $part_adoption, $part_deadline, $part_handoff, $part_offload);
$part_crash->();

done_testing();
