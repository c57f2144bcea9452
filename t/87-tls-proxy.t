use strict;
use warnings;
use Test::More;
use lib 't/lib';
use IO::Socket::INET ();
use Socket ();
use Time::HiRes qw(time sleep);
use NarwhalTest qw(spawn_server free_port write_app tmpdir run_cmd missing_all wait_until
                   metrics_of);

# TLS passed through a TCP balancer with a PROXY header (docs/DESIGN.md,
# "HTTPS"): under --proxy-protocol the connection manager reads the
# header (v1 or v2) before the TLS handshake, from the peers --proxy-from
# allows, and the app sees the balancer's client as REMOTE_ADDR. A real
# HAProxy in TCP mode (send-proxy-v2 and send-proxy), curl as the client
# from another loopback address; and hand-written clients for what a
# balancer does not send: a header in pieces, a stalled one, none, LOCAL.

plan skip_all => 'the connection manager is not built or is switched off (TLS needs it)'
    unless NarwhalTest::managed();
missing_all('needs the openssl and curl commands and IO::Socket::SSL (Debian: apt-get install '
            . 'openssl curl libio-socket-ssl-perl)')
    unless grep({ -x "$_/openssl" } split /:/, $ENV{PATH}) && grep({ -x "$_/curl" } split /:/, $ENV{PATH})
           && eval { require IO::Socket::SSL; 1 };

my $TMP = tmpdir();
my ($CERT, $KEY) = map { "$TMP/$_" } qw(cert.pem key.pem);
system("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout $KEY -out $CERT "
       . "-days 2 -subj /CN=localhost >/dev/null 2>&1") == 0
    or plan skip_all => 'openssl could not make a certificate';

my $APP = write_app(<<'APP');
sub { my $env = shift;
      [200, ['Content-Type' => 'text/plain'],
       [join(' ', map { "$_=" . ($env->{$_} // '-') } qw(REMOTE_ADDR REMOTE_PORT SERVER_PORT psgi.url_scheme HTTPS)) . "\n"]] }
APP

sub server {    # extra args -> (server, its TLS port, status port); a plain listener too
    my ($sport, $tport) = (free_port(), free_port());
    my $s = spawn_server(app => $APP, args => [ '--listen', "127.0.0.1:$tport:ssl", '--tls-cert', $CERT,
                                                '--tls-key', $KEY, '--proxy-protocol', '--read-timeout', 1,
                                                '--status-listen', "127.0.0.1:$sport", @_ ]);
    return ($s, $tport, $sport);
}

sub v2_header {    # command (PROXY or LOCAL), src ip, src port, dst ip, dst port
    my ($cmd, $sip, $sport, $dip, $dport) = @_;
    my $body = $cmd eq 'LOCAL' ? '' : Socket::inet_aton($sip) . Socket::inet_aton($dip) . pack('nn', $sport, $dport);
    return "\r\n\r\n\0\r\nQUIT\n" . pack('CCn', $cmd eq 'LOCAL' ? 0x20 : 0x21, $cmd eq 'LOCAL' ? 0 : 0x11,
                                         length $body) . $body;
}

# A client that writes @pieces (a PROXY header, maybe in parts, with a
# pause between), then shakes hands and asks for /: the answer's body, or
# undef with the reason in $@.
sub tls_get {
    my ($port, @pieces) = @_;
    my $from = ref $pieces[0] eq 'HASH' ? shift(@pieces)->{from} : '127.0.0.1';
    my $sock = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$port", LocalAddr => $from, Timeout => 5)
        or return undef;
    for my $p (@pieces) {
        if (ref $p) { sleep $$p; next }
        syswrite($sock, $p);
    }
    IO::Socket::SSL->start_SSL($sock, SSL_verify_mode => 0, Timeout => 5)
        or do { $@ = "handshake: " . IO::Socket::SSL::errstr(); return undef };
    print $sock "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    local $/;
    my $r = <$sock> // '';
    return $r =~ /\r\n\r\n(.*)/s ? $1 : do { $@ = "no answer"; undef };
}

my ($s, $port, $sport) = server('--proxy-from', '127.0.0.1');

# 1. Hand-written clients: a v2 header, a v1 header in two pieces, LOCAL.
like(tls_get($port, v2_header('PROXY', '192.0.2.7', 40001, '198.51.100.1', 443)) // "failed: $@",
     qr/^REMOTE_ADDR=192\.0\.2\.7 REMOTE_PORT=40001 SERVER_PORT=443 psgi\.url_scheme=https HTTPS=on$/,
     'a PROXY v2 header before the hello: the app sees its client and port, over https');
like(tls_get($port, "PROXY TCP4 192.0.2.8 198.51.100.1 40002 ", \0.3, "8443\r\n") // "failed: $@",
     qr/^REMOTE_ADDR=192\.0\.2\.8 REMOTE_PORT=40002 SERVER_PORT=8443 /,
     'a v1 header in two pieces, 0.3 s apart');
like(tls_get($port, v2_header('LOCAL')) // "failed: $@", qr/^REMOTE_ADDR=127\.0\.0\.1 REMOTE_PORT=\d+ SERVER_PORT=$port /,
     'a LOCAL header (a health check): the socket\'s own addresses');

# 2. Refused: no header (a client straight to the port), a bad one, a
# stalled one (the handshake's deadline, --read-timeout 1).
ok(!defined tls_get($port), 'a TLS client without a PROXY header is closed before its handshake');
ok(!defined tls_get($port, "PROXY TCP4 nonsense\r\n"), 'a bad v1 header too');
my $t0 = time;
my $stalled = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$port", Timeout => 5) or die;
syswrite($stalled, "PROXY TCP4 192.0.2.9");
my $got = sysread($stalled, my $buf, 10);
my $took = time - $t0;
ok(defined $got && !$got, 'a header that stops halfway is closed...');
cmp_ok($took, '<', 4, sprintf '... at the handshake deadline (--read-timeout 1: %.1f s)', $took);
my $m;
ok(wait_until(sub { $m = metrics_of($sport); ($m->{'narwhal_proxy_rejected_total{reason="bad_header"}'} // 0) >= 2 }, 5),
   'narwhal_proxy_rejected_total{reason="bad_header"} counts the two');
is($m->{'narwhal_tls_refused_total{reason="timeout"}'}, 1, '... and the stalled one is a TLS timeout');
like($s->log_text, qr/manager warn: refused a TLS connection under --proxy-protocol from 127\.0\.0\.1:\d+: no valid PROXY header/,
     'the log says which peer sent no valid header');

# 4. A peer outside --proxy-from (127.0.0.2; the server allows 127.0.0.1):
# closed before anything is read.
ok(!defined tls_get($port, { from => '127.0.0.2' }, v2_header('PROXY', '192.0.2.7', 40001, '198.51.100.1', 443)),
   'a peer outside --proxy-from is closed, header or not');
ok(wait_until(sub { (metrics_of($sport)->{'narwhal_proxy_rejected_total{reason="not_allowed"}'} // 0) == 1 }, 5),
   'counted: narwhal_proxy_rejected_total{reason="not_allowed"}');
like($s->log_text, qr/refused a TLS connection under --proxy-protocol from 127\.0\.0\.2:\d+: its address is not in --proxy-from/,
     '... and said');

# 3. Behind HAProxy in TCP mode: curl from 127.0.0.5, HAProxy from
# 127.0.0.1 with send-proxy-v2 on one frontend, send-proxy on the other.
SKIP: {
    my ($haproxy) = grep { -x } map { "$_/haproxy" } split(/:/, $ENV{PATH}), '/usr/sbin';
    skip 'needs haproxy (Debian: apt-get install haproxy)', 4 unless $haproxy;
    my ($f2, $f1) = (free_port(), free_port());
    open(my $cfg, '>', "$TMP/haproxy.cfg") or die;
    print $cfg <<"CFG";
defaults
    mode tcp
    timeout connect 2s
    timeout client 10s
    timeout server 10s
frontend v2
    bind 127.0.0.1:$f2
    default_backend v2
frontend v1
    bind 127.0.0.1:$f1
    default_backend v1
backend v2
    server n 127.0.0.1:$port send-proxy-v2
backend v1
    server n 127.0.0.1:$port send-proxy
CFG
    close $cfg;
    my $hpid = fork // die;
    if (!$hpid) {
        open(STDOUT, '>', "$TMP/haproxy.log");
        open(STDERR, '>&', \*STDOUT);
        exec $haproxy, '-db', '-f', "$TMP/haproxy.cfg";
        exit 127;
    }
    my $curl = sub {
        my ($front, $n) = @_;
        my $r = run_cmd([ 'curl', '-sk', '--interface', '127.0.0.5', ("https://localhost:$front/") x $n,
                          '--resolve', "localhost:$front:127.0.0.1", '-w', '%{http_code} %{num_connects}\n' ]);
        return $r->{out} // '';
    };
    wait_until(sub { $curl->($f2, 1) =~ /200/ }, 10);
    my $two = $curl->($f2, 2);
    like($two, qr/\AREMOTE_ADDR=127\.0\.0\.5 REMOTE_PORT=\d+ SERVER_PORT=$f2 psgi\.url_scheme=https HTTPS=on\n200 1\nREMOTE_ADDR=127\.0\.0\.5 [^\n]*\n200 0\n\z/,
         'through HAProxy send-proxy-v2: REMOTE_ADDR is curl\'s 127.0.0.5, two requests on one connection');
    like($curl->($f1, 1), qr/\AREMOTE_ADDR=127\.0\.0\.5 REMOTE_PORT=\d+ SERVER_PORT=$f1 psgi\.url_scheme=https/,
         'through HAProxy send-proxy (v1): the same');
    my $r = run_cmd([ 'curl', '-sk', '-o', '/dev/null', '-w', '%{http_code}', "https://127.0.0.1:$port/" ]);
    isnt($r->{out} // '', '200', 'curl straight to the TLS port, with no header: no answer');
    $m = metrics_of($sport);
    cmp_ok($m->{'narwhal_proxy_rejected_total{reason="bad_header"}'} // 0, '>=', 3, '... counted');
    kill 'TERM', $hpid;
    waitpid($hpid, 0);
}
$s->stop;

done_testing;
