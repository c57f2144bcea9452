use strict;
use warnings;
use Test::More;
use lib 't/lib';
use IO::Select ();
use IO::Socket::INET ();
use Socket qw(IPPROTO_TCP);
use Time::HiRes qw(time sleep);
use NarwhalTest qw(spawn_server write_app wait_until manager_fallback free_port perl_cmd root
                   raw_connect metrics_of missing);

# A connection the kernel will not pass on is not closed unanswered. The
# manager gives requests to the workers as descriptors over a unix socket
# (SCM_RIGHTS), and Linux refuses such a pass (ETOOMANYREFS) while the
# sending user (not root) has more descriptors in flight than its
# open-file limit: the manager used to close each refused client at once,
# with no answer, no line and no count (700 clients behind one stuck
# worker with a limit of 64: 48 answered). Now a refused request waits in
# the manager's queue for the workers to take what is in flight.
#
# The server runs as nobody (--user), so the test needs root; and a low
# open-file limit (prlimit), so that few descriptors in flight are too
# many. The clients never retry: each counts its one answer, or none.

my @NM = manager_fallback();
plan skip_all => 'the connection manager hands requests to the workers'
    if !NarwhalTest::managed();
plan skip_all => 'needs root (the server must run as another user: root may pass any '
               . 'number of descriptors), a nobody user and a nogroup group, and prlimit'
    unless $> == 0 && defined getpwnam('nobody') && defined getgrnam('nogroup')
           && system('prlimit --version >/dev/null 2>&1') == 0;

my $DIR = NarwhalTest::tmpdir();
my $APP = write_app(<<"APP");
sub {
    my \$env = shift;
    if (\$env->{PATH_INFO} eq '/slow') {
        open(my \$fh, '>', '$DIR/slow-began');
        Time::HiRes::sleep(3);
    }
    [200, ['Content-Type' => 'text/plain'], ["ok\\n"]];
}
APP
chmod 0755, $DIR;    # (nobody loads the app from here)
chmod 0644, $APP;
chmod 0777, $DIR;    # (and the app writes its mark here)

my $CLIENTS = 700;
my $port = free_port();
my $sport = free_port();
my $log = "$DIR/server-$port.log";
my $s = spawn_server(port => $port, stderr => $log,
    command => [ 'prlimit', '--nofile=64:64', '--', perl_cmd(), root() . '/bin/narwhal',
                 '--listen', "127.0.0.1:$port", '--status-listen', "127.0.0.1:$sport",
                 '--max-workers', 1, '--max-connections', 1000,
                 '--user', 'nobody', '--group', 'nogroup', $APP ]);
ok(wait_until(sub { (metrics_of($sport)->{'narwhal_workers{state="idle"}'} // 0) == 1 }, 10),
   'the one worker is up');

# The worker is held by a 3 s request; meanwhile the manager takes the new
# clients (the pool is stuck) and queues them for the serve queue.
my $slow = raw_connect($port) or die "connect: $!";
syswrite($slow, "GET /slow HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
ok(wait_until(sub { -e "$DIR/slow-began" }, 5), 'the worker is stuck on a 3 s request');
sleep 0.1;

my (%buf, %sock, %eof);
my $sel = IO::Select->new;
for my $i (1 .. $CLIENTS) {
    my $c = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port, Timeout => 5)
        or do { diag "client $i: connect: $!"; next };
    syswrite($c, "GET /$i HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    $c->blocking(0);
    $sock{ fileno $c } = $c;
    $buf{ fileno $c } = '';
    $sel->add($c);
}
is(scalar keys %sock, $CLIENTS, "$CLIENTS clients connected and sent their request");

my $end = time + 60;
while ($sel->count && time < $end) {
    for my $c ($sel->can_read(1)) {
        my $n = sysread($c, my $chunk, 65536);
        next if !defined $n && $!{EAGAIN};
        if ($n) {
            $buf{ fileno $c } .= $chunk;
            next;
        }
        $sel->remove($c);   # (the end of its one response, or of nothing)
    }
}
my %status;
$status{ $buf{$_} =~ m{^HTTP/1\.1 (\d{3}) } ? $1 : 'none' }++ for keys %buf;
is($status{none} // 0, 0, 'no client was closed unanswered') or diag explain \%status;
is($status{200} // 0, $CLIENTS, "all $CLIENTS were served") or diag explain \%status;

my $m = metrics_of($sport);
cmp_ok($m->{'narwhal_manager_accepted_total'} // 0, '>', 0,
       'the manager took clients while the worker was stuck');
is($m->{'narwhal_refused_total{reason="serve_queue"}'} // 0, 0,
   'none refused: each refused hand-off was tried again') or diag explain $m;
my $text = do { local $/; open(my $fh, '<', $log) or die "$log: $!"; <$fh> };
like($text, qr/manager warn: the serve queue refused a request: Too many references/,
     'the refusals are said in the log (once, then counted)');
note $_ for grep { /manager|error/ } split /\n/, $text;
close $_ for values %sock;
close $slow;
$s->stop;
done_testing();
