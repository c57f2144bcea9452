use strict;
use warnings;
use Test::More;
use lib 't/lib';
use IO::Socket::INET ();
use JSON::PP ();
use POSIX ();
use Time::HiRes qw(time sleep);
use NarwhalTest qw(spawn_server free_port write_app tmpdir run_cmd wait_until metrics_of http_get
                   missing_all);
use NarwhalTest::Clients ();

# Hostile handshakes never hold a worker or a client (docs/DESIGN.md,
# "HTTPS"): 2,000 connections that stall in the middle of their
# ClientHello, beside 20 HTTPS keep-alive clients that never retry. The
# clients lose nothing and keep their times; no worker ever sees a stalled
# one; each is closed at --read-timeout and counted as a timeout. And
# each TLS connection counts against --max-connections: at the limit a
# parked one is closed to make room, and with none idle a new client
# waits in the listen queue until a stall expires, then is served.

plan skip_all => 'the connection manager is not built or is switched off (TLS needs it)'
    unless NarwhalTest::managed();
missing_all('needs the openssl command and IO::Socket::SSL (Debian: openssl, libio-socket-ssl-perl)')
    unless grep({ -x "$_/openssl" } split /:/, $ENV{PATH}) && eval { require IO::Socket::SSL; 1 };

my $TMP = tmpdir();
my ($CERT, $KEY) = ("$TMP/cert.pem", "$TMP/key.pem");
system("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout $KEY -out $CERT "
       . "-days 2 -subj /CN=localhost >/dev/null 2>&1") == 0
    or plan skip_all => 'openssl could not make a certificate';

# The stalling client, a process of its own with its open-file limit
# raised: N connections, each sending a TLS record header and the start of
# a ClientHello that says 512 bytes follow, then nothing. It writes
# "open N" once they are all open, then the seconds from then until the
# server closed each ("closed N FIRST LAST"), or what was still open.
my $STALL = "$TMP/stall.pl";
{
    open(my $fh, '>', $STALL) or die;
    print $fh <<'PL';
use strict; use IO::Socket::INET; use IO::Select; use Time::HiRes qw(time);
my ($port, $n, $out, $wait) = @ARGV;
my $hello = pack('C n n', 0x16, 0x0301, 512) . "\x01\x00\x01\xfc\x03\x03" . ("\x11" x 20);
my @s;
for (1 .. $n) {
    my $c = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port, Timeout => 5) or last;
    syswrite($c, $hello);
    push @s, $c;
}
my $t0 = time;
{ open(my $f, '>', "$out.tmp") or die; print $f "open " . scalar(@s) . "\n"; close $f; rename "$out.tmp", $out }
my $sel = IO::Select->new(@s);
my ($closed, $first, $last) = (0, 0, 0);
while ($sel->count && time < $t0 + $wait) {
    for my $c ($sel->can_read(0.2)) {
        my $r = sysread($c, my $b, 4096);
        next if defined $r && $r > 0;
        $sel->remove($c);
        close $c;
        $closed++;
        $first ||= time - $t0;
        $last = time - $t0;
    }
}
open(my $f, '>>', $out) or die;
printf $f "closed %d %.2f %.2f\n", $closed, $first, $last;
PL
}

# Start it; wait until its connections are open. Returns (pid, file, n).
sub stall {
    my ($port, $n, $wait) = @_;
    my $out = "$TMP/stall-$port";
    my $pid = fork // die "fork: $!";
    if (!$pid) {
        exec('sh', '-c', 'ulimit -n 4096 2>/dev/null || ulimit -n "$(ulimit -Hn)"; exec "$@"', 'sh',
             $^X, $STALL, $port, $n, $out, $wait) or POSIX::_exit(127);
    }
    wait_until(sub { -s $out }, 20) or die "the stalling client did not start";
    my ($open) = (slurp($out) =~ /^open (\d+)/);
    return ($pid, $out, $open);
}

sub slurp { open(my $f, '<', $_[0]) or return ''; local $/; return scalar <$f> }

sub p99 { my @t = @_; return @t ? $t[int(0.99 * $#t)] : 999 }

sub tls_gauge {
    my ($sport, $state) = @_;
    return metrics_of($sport)->{"narwhal_tls_connections{state=\"$state\"}"} // -1;
}

# 20 clients that never retry, keep-alive over TLS, for $secs; their
# counts and times.
sub clients {
    my ($port, $secs) = @_;
    my @runs = NarwhalTest::Clients::start_clients($TMP, $port, 20, '/', $secs, 0, tls => 1,
                                                   times => 1);
    my $n = NarwhalTest::Clients::collect(@runs);
    return ($n, [ NarwhalTest::Clients::times_of(@runs) ]);
}

my $APP = write_app(<<'APP');
sub { [200, ['Content-Type' => 'text/plain'], ["hello\n"]] }
APP

# ---------------------------------------------------------------- the flood

{
    my ($port, $sport) = (free_port(), free_port());
    my $s = spawn_server(app => $APP, args => [ '--listen', "127.0.0.1:$port:ssl", '--tls-cert', $CERT,
                                                '--tls-key', $KEY, '--workers', 2, '--read-timeout', 5,
                                                '--status-listen', "127.0.0.1:$sport" ]);
    ok(wait_until(sub { $s->log_text =~ /TLS: relayed/ }, 10), 'a TLS listener') or diag $s->log_text;
    my $ulp = slurp('/proc/sys/net/ipv4/tcp_available_ulp');
    my $kernel = $ulp =~ /\btls\b/ ? qr/kTLS offered by the kernel, not used yet/
                                     : qr/no kTLS in this kernel: no tls module/;
    like($s->log_text, qr/TLS: relayed on 127\.0\.0\.1:$port \($kernel\)/,
         'the start line says which way, and what the kernel offers');

    my ($alone, $alone_t) = clients($port, 2);
    ok($alone->{answered} > 100, "20 HTTPS keep-alive clients alone: $alone->{answered} answered");

    my ($pid, $out, $open) = stall($port, 2000, 15);
    cmp_ok($open, '>=', 1000, "$open connections stall mid-handshake");
    ok(wait_until(sub { tls_gauge($sport, 'handshake') == $open }, 10),
       '... each held by the manager in its handshake (narwhal_tls_connections)')
        or diag tls_gauge($sport, 'handshake');

    my ($beside, $beside_t) = clients($port, 2);
    is($beside->{failed} + $beside->{reset} + $beside->{wrong}, 0,
       "beside them, the clients lose nothing ($beside->{answered} answered)")
        or diag explain $beside;
    ok($beside->{answered} > 100, '... and are served');
    my ($p99_alone, $p99_beside) = (p99(@$alone_t), p99(@$beside_t));
    cmp_ok($p99_beside, '<', 3 * $p99_alone + 0.1,
           sprintf('... their p99 stays (%.1f ms alone, %.1f ms beside the stalls)',
                   1000 * $p99_alone, 1000 * $p99_beside));

    my $st = eval { JSON::PP->new->decode(http_get($sport, '/status.json')->{content}) } || {};
    is($st->{tls_connections}{handshake}, $open, 'status.json: the stalls are in their handshake');
    is(scalar(@{ $st->{workers} || [] }), 2, 'status.json: two workers');
    is(0 + grep({ $_->{state} ne 'idle' } @{ $st->{workers} || [] }), 0,
       '... and every worker is idle: none holds a stalled handshake')
        or diag explain $st->{workers};

    waitpid($pid, 0);
    my ($closed, $first, $last) = (slurp($out) =~ /^closed (\d+) ([\d.]+) ([\d.]+)$/m);
    is($closed, $open, 'every stalled connection is closed by the server');
    ok($last < 5 + 3, sprintf('... by --read-timeout 5 s after it began (the last at %.1f s)', $last // -1));
    my $m = metrics_of($sport);
    is($m->{'narwhal_tls_refused_total{reason="timeout"}'}, $open, '... each counted as a timeout');
    is($m->{'narwhal_tls_connections{state="handshake"}'}, 0, '... and none held now');
    like($s->log_text, qr/TLS connection refused: timeout/, '... and logged');
    cmp_ok(scalar(() = $s->log_text =~ /TLS connection refused: timeout/g), '<', 10, '... rate-limited');
    is($s->stop, 0, 'the server stops cleanly');
}

# ---------------------------------------------------------------- the limit

{
    my ($port, $sport) = (free_port(), free_port());
    my $s = spawn_server(app => $APP, args => [ '--listen', "127.0.0.1:$port:ssl", '--tls-cert', $CERT,
                                                '--tls-key', $KEY, '--workers', 2, '--read-timeout', 2,
                                                '--max-connections', 20,
                                                '--status-listen', "127.0.0.1:$sport" ]);
    ok(wait_until(sub { $s->log_text =~ /TLS: relayed/ }, 10), 'with --max-connections 20');
    my $idle = IO::Socket::SSL->new(PeerAddr => '127.0.0.1', PeerPort => $port, SSL_verify_mode => 0,
                                    Timeout => 5) or die IO::Socket::SSL::errstr();
    print $idle "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    like(read_answer($idle), qr{^HTTP/1\.1 200 }, 'a keep-alive TLS client is served, then idle');
    # (it counts twice: its TLS side in the manager and its plain side parked)
    my ($pid, $out, $open) = stall($port, 18, 10);
    ok(wait_until(sub { tls_gauge($sport, 'handshake') == 18 }, 5), '18 stalls fill the rest');
    my ($pid2, $out2, $open2) = stall($port, 1, 10);
    ok(wait_until(sub { tls_gauge($sport, 'handshake') == 19 }, 5),
       'one more: taken at once, the idle client closed to make room');
    ok(wait_until(sub { !defined(read_answer($idle, 0.2)) }, 5), '... the idle client sees the close');

    my $t0 = time;
    my $late = IO::Socket::SSL->new(PeerAddr => '127.0.0.1', PeerPort => $port, SSL_verify_mode => 0,
                                    Timeout => 10);
    ok($late, 'full with none idle: a new client still gets its handshake') or diag IO::Socket::SSL::errstr();
    my $waited = time - $t0;
    print $late "GET / HTTP/1.1\r\nHost: x\r\n\r\n" if $late;
    like($late ? read_answer($late) // '' : '', qr{^HTTP/1\.1 200 }, '... and its answer');
    cmp_ok($waited, '>', 0.8, sprintf('... after waiting in the listen queue for a stall to expire (%.1f s)',
                                      $waited));
    like($s->log_text, qr/holds --max-connections, none idle: TLS clients wait/, '... which the log says');
    waitpid($_, 0) for $pid, $pid2;
    is($s->stop, 0, 'the server stops cleanly');
}

# One answer from a TLS connection (Content-Length), or undef at its end
# or after $secs.
sub read_answer {
    my ($c, $secs) = @_;
    my $buf = '';
    my $end = time + ($secs // 5);
    while (time < $end) {
        my $rin = '';
        vec($rin, fileno($c), 1) = 1;
        $c->pending or select(my $r = $rin, undef, undef, 0.1) or next;
        my $n = sysread($c, $buf, 65536, length $buf);
        return undef unless $n;     # (its end, or a reset)
        my ($len) = $buf =~ /^Content-Length:\s*(\d+)/mi;
        my $head = index($buf, "\r\n\r\n");
        return $buf if $head >= 0 && defined $len && length($buf) >= $head + 4 + $len;
    }
    return length $buf ? $buf : '';
}

done_testing;
