use strict;
use warnings;
use Test::More;
use lib 't/lib';
use Digest::MD5 ();
use Digest::SHA ();
use IO::Socket::INET ();
use MIME::Base64 ();
use POSIX ();
use Socket ();
use Time::HiRes qw(time sleep);
use NarwhalTest qw(spawn_server free_port write_app tmpdir run_cmd narwhal_cmd missing missing_all
                   wait_until raw_connect read_response http_get metrics_of);
use JSON::PP ();

# HTTPS, the relayed way (docs/DESIGN.md, "HTTPS"): the connection
# manager does TLS on the TLS listeners and relays plaintext to the
# workers. Real clients (curl, openssl s_client, wrk, HTTP::Tiny and
# hand-written ones with IO::Socket::SSL) against a server with a plain
# and a TLS listener, on a throwaway certificate made by the openssl
# command.

plan skip_all => 'the connection manager is not built or is switched off (TLS needs it)'
    unless NarwhalTest::managed();
missing_all('needs the openssl and curl commands (Debian: apt-get install openssl curl)')
    unless grep({ -x "$_/openssl" } split /:/, $ENV{PATH}) && grep({ -x "$_/curl" } split /:/, $ENV{PATH});

my $TMP = tmpdir();
my ($CERT, $KEY, $OTHER) = map { "$TMP/$_" } qw(cert.pem key.pem other.pem);
system("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout $KEY -out $CERT "
       . "-days 2 -subj /CN=localhost -addext subjectAltName=DNS:localhost,IP:127.0.0.1 >/dev/null 2>&1"
       . " && openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out $OTHER >/dev/null 2>&1") == 0
    or plan skip_all => 'openssl could not make a certificate';

my $BIG = "$TMP/big.bin";
{
    open(my $fh, '>', $BIG) or die "$BIG: $!";
    print $fh pack('N*', map { $_ * 2654435761 % 4294967296 } 1 .. 1_250_000);    # 5 MB
}
my $BIG_MD5 = do { open(my $fh, '<', $BIG) or die; binmode $fh; Digest::MD5->new->addfile($fh)->hexdigest };

# /echo: what $env says of the connection, and the body's length;
# /big: a file body (the sendfile path, into the pair); /sleep (and
# /p/sleep): a second;
# /p/...: the path, the worker and the body's length (pipelining, 100-
# continue, which worker); with Upgrade: websocket, a WebSocket that
# echoes each frame through psgix.io, until a close frame (echoed too).
my $APP = write_app(<<'APP' =~ s/__BIG__/$BIG/r);
use strict;
use Digest::SHA ();
sub ws_frame {
    my ($op, $data) = @_;
    my $n = length $data;
    return pack('C', 0x80 | $op) . ($n < 126 ? pack('C', $n) : $n < 65536 ? pack('Cn', 126, $n) : pack('CQ>', 127, $n))
         . $data;
}
sub ws_echo {
    my ($env) = @_;
    my $io = $env->{'psgix.io'} or return [500, ['Content-Type' => 'text/plain'], ["no psgix.io\n"]];
    my $accept = Digest::SHA::sha1_base64(($env->{HTTP_SEC_WEBSOCKET_KEY} // '') . '258EAFA5-E914-47DA-95CA-C5AB0DC11B65')
               . '=';
    return sub {
        syswrite($io, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                      . "Sec-WebSocket-Accept: $accept\r\n\r\n");
        my $read = sub {
            my ($n, $b) = (shift, '');
            while (length $b < $n) { sysread($io, $b, $n - length $b, length $b) or return undef }
            return $b;
        };
        while (defined(my $h = $read->(2))) {
            my ($b0, $b1) = unpack 'CC', $h;
            my $len = $b1 & 127;
            $len = unpack 'n', $read->(2) if $len == 126;
            $len = unpack 'Q>', $read->(8) if $len == 127;
            my $mask = $b1 & 128 ? $read->(4) : "\0\0\0\0";
            my $data = $len ? $read->($len) : '';
            last unless defined $data;
            $data ^= substr($mask x (1 + int($len / 4)), 0, $len);
            syswrite($io, ws_frame($b0 & 15, $data));
            last if ($b0 & 15) == 8;
        }
        close $io;
    };
}
sub {
    my $env = shift;
    return ws_echo($env) if lc($env->{HTTP_UPGRADE} // '') eq 'websocket';
    my ($n, $buf) = (0, '');
    while (my $r = $env->{'psgi.input'}->read($buf, 65536)) { $n += $r }
    if ($env->{PATH_INFO} eq '/big') {
        open(my $fh, '<', '__BIG__') or die;
        return [200, ['Content-Type' => 'application/octet-stream'], $fh];
    }
    select(undef, undef, undef, 1) if $env->{PATH_INFO} =~ m{^(?:/p)?/sleep$};
    return [200, ['Content-Type' => 'text/plain'], ["path=$env->{PATH_INFO} pid=$$ body=$n\n"]]
        if $env->{PATH_INFO} =~ m{^/p/};
    return [200, ['Content-Type' => 'text/plain'],
            [join(' ', "scheme=$env->{'psgi.url_scheme'}", 'https=' . ($env->{HTTPS} // ''),
                  "remote=$env->{REMOTE_ADDR}:$env->{REMOTE_PORT}", "port=$env->{SERVER_PORT}",
                  "body=$n") . "\n"]];
}
APP

my ($TPORT, $SPORT) = (free_port(), free_port());
my $s = spawn_server(app => $APP, args => [ '--listen', "127.0.0.1:$TPORT:ssl", '--tls-cert', $CERT,
                                            '--tls-key', $KEY, '--workers', 2,
                                            '--status-listen', "127.0.0.1:$SPORT" ]);
my $PORT = $s->{port};
my $URL = "https://127.0.0.1:$TPORT";
my @CURL = ('curl', '-sS', '--max-time', '20', '--cacert', $CERT);

sub curl { my $r = run_cmd([ @CURL, @_ ], timeout => 30); return $r->{code} == 0 ? $r->{out} : "failed: $r->{err}" }

ok(wait_until(sub { $s->log_text =~ /listening on .*TLS: relayed on 127\.0\.0\.1:$TPORT/ }, 5),
   'the start line says TLS: relayed, and where') or diag $s->log_text;

like(curl("$URL/echo"), qr/^scheme=https https=on remote=127\.0\.0\.1:[1-9]\d* port=$TPORT body=0$/,
     'GET over TLS: psgi.url_scheme https, HTTPS on, the client\'s address and the TLS port');
like(curl("http://127.0.0.1:$PORT/echo"), qr/^scheme=http https= remote=127\.0\.0\.1:[1-9]\d* port=$PORT /,
     'the plain listener beside it: http');

my $file = "$TMP/upload.bin";
{ open(my $fh, '>', $file) or die; print $fh 'x' x 1_000_000 }
like(curl('--data-binary', "\@$file", "$URL/echo"), qr/ body=1000000$/, 'a 1 MB upload');
like(curl('-H', 'Transfer-Encoding: chunked', '--data-binary', "\@$file", "$URL/echo"),
     qr/ body=1000000$/, 'a chunked upload');
{
    my $r = run_cmd([ @CURL, "$URL/big" ], timeout => 30);
    is(Digest::MD5::md5_hex($r->{out}), $BIG_MD5, 'a 5 MB file body arrives whole');
}
{
    my $out = curl('-w', ' connects=%{num_connects}\n', "$URL/a", "$URL/b", "$URL/c");
    my @ports = $out =~ /remote=127\.0\.0\.1:(\d+)/g;
    is(scalar(@ports), 3, 'three requests on keep-alive');
    is(join(',', $out =~ /connects=(\d+)/g), '1,0,0', '... over one connection');
    is(scalar(keys %{ { map { $_ => 1 } @ports } }), 1, '... one client port');
}

# Plain HTTP on the TLS port: a 400 that says so, and a close.
{
    my $c = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $TPORT, Timeout => 5) or die;
    syswrite($c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    my $got = NarwhalTest::read_until_close($c, 5);
    like($got, qr{^HTTP/1\.1 400 }, 'plain HTTP on the TLS port: 400');
    like($got, qr/speaks HTTPS/, '... saying why');
    like($got, qr/\r\nConnection: close\r\n/i, '... and the connection closes');
}

# TLS 1.1 is refused (the client allowed to offer it).
{
    my $r = run_cmd([ 'openssl', 's_client', '-tls1_1', '-cipher', 'DEFAULT@SECLEVEL=0',
                      '-connect', "127.0.0.1:$TPORT" ], timeout => 10, stdin => '');
    unlike($r->{out}, qr/Cipher is (?!\(NONE\))/, 'openssl s_client -tls1_1: no session');
    like($r->{out} . $r->{err}, qr/alert protocol version|no protocols available|wrong version/i,
         '... a protocol version refusal');
}

# The refusals above on /metrics, one series for each reason, and their
# total on /status.json.
{
    my $m = metrics_of($SPORT);
    is($m->{'narwhal_tls_refused_total{reason="plain_http"}'}, 1, '/metrics: plain_http 1');
    is($m->{'narwhal_tls_refused_total{reason="version"}'}, 1, '/metrics: version 1');
    my @series = grep { /^narwhal_tls_refused_total\{/ } keys %$m;
    is(scalar(@series), 8, '... a series for each reason') or diag join ' ', sort @series;
    is(0 + grep({ $m->{$_} } @series), 2, '... the others 0');
    my $text = http_get($SPORT, '/metrics')->{content};
    like($text, qr/^# HELP narwhal_tls_refused_total .+\n# TYPE narwhal_tls_refused_total counter$/m,
         '... with HELP and TYPE');
    my $json = eval { JSON::PP->new->decode(http_get($SPORT, '/status.json')->{content}) } || {};
    is($json->{tls_refused}, 2, '/status.json: tls_refused 2');
    SKIP: {
        my ($promtool) = grep { -x } map { "$_/promtool" } split /:/, $ENV{PATH};
        skip 'no promtool', 1 unless $promtool;
        my $r = run_cmd([ $promtool, 'check', 'metrics' ], stdin => $text, timeout => 20);
        is($r->{code}, 0, '... promtool check metrics passes') or diag $r->{out}, $r->{err};
    }
}

SKIP: {
    skip 'IO::Socket::SSL is not installed', 2 unless eval { require IO::Socket::SSL; 1 };
    require HTTP::Tiny;
    my $res = HTTP::Tiny->new(verify_SSL => 1, SSL_options => { SSL_ca_file => $CERT })
                        ->post("$URL/echo", { content => 'hello' });
    is($res->{status}, 200, 'HTTP::Tiny with IO::Socket::SSL: 200') or diag "$res->{status} $res->{content}";
    like($res->{content}, qr/^scheme=https https=on .* body=5$/, '... its POST seen as https');
}

my $SSL = eval { require IO::Socket::SSL; 1 };
my $NO_SSL = 'IO::Socket::SSL is not installed (Debian: apt-get install libio-socket-ssl-perl)';

# Pipelining over TLS: requests written at once (one write, one TLS
# record) on one connection, each answered, in order, a POST's body its
# own; then 200 of them at once, some 64 KB: more than the relay's
# buffers hold (16 KiB each way), so they wait on the pair and go on.
SKIP: {
    $SSL or missing($NO_SSL, 7);
    my $c = tls_connect($TPORT) or die 'connect: ' . IO::Socket::SSL::errstr();
    my @paths = map { "/p/$_" } 1 .. 5;
    my $req = join '', map { $_ eq '/p/3' ? "POST $_ HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\n\r\nhello world"
                                          : "GET $_ HTTP/1.1\r\nHost: x\r\n\r\n" } @paths;
    is(syswrite($c, $req), length $req, 'pipelining: five requests in one write');
    my @res = read_responses($c, 5, 10);
    is(join(' ', map { $_->{status} } @res), '200 200 200 200 200', '... five answers, each 200');
    is(join(' ', map { $_->{body} =~ m{path=(\S+)} } @res), "@paths", '... in order');
    is(join(' ', map { $_->{body} =~ /body=(\d+)/ } @res), '0 0 11 0 0', "... the POST's body its own");

    my @many = map { "/p/m$_" } 1 .. 200;
    my $pad = 'x' x 280;
    print $c join '', map { "GET $_ HTTP/1.1\r\nHost: x\r\nX-Pad: $pad\r\n\r\n" } @many;
    @res = read_responses($c, 200, 20);
    is(scalar(@res), 200, '200 pipelined requests (64 KB) at once: 200 answers');
    is(join(' ', map { $_->{body} =~ m{path=(\S+)} } @res), "@many", '... in order');
    print $c "GET /p/after HTTP/1.1\r\nHost: x\r\n\r\n";
    my ($after) = read_responses($c, 1, 10);
    like($after && $after->{body}, qr{^path=/p/after }, '... and the connection goes on');
}

# Expect: 100-continue over TLS. curl (asked for it: when curl asks by
# itself depends on its version) gets the interim 100, sends the body and
# the app reads all of it; a raw client sees the 100 arrive, alone,
# before it has sent a byte of the body.
{
    my $file = "$TMP/2k.bin";
    spew($file, 'y' x 2048);
    my $r = run_cmd([ @CURL, '-v', '-H', 'Expect: 100-continue', '--data-binary', "\@$file", "$URL/p/expect" ],
                    timeout => 30);
    like($r->{out}, qr{^path=/p/expect pid=\d+ body=2048$}, 'Expect: 100-continue, curl: the app read the whole body')
        or diag $r->{err};
    like($r->{err}, qr{^< HTTP/1\.1 100 Continue\r?$}m, '... after curl got the 100 Continue');
}
SKIP: {
    $SSL or missing($NO_SSL, 3);
    my $c = tls_connect($TPORT) or die 'connect: ' . IO::Socket::SSL::errstr();
    print $c "POST /p/expect-raw HTTP/1.1\r\nHost: x\r\nContent-Length: 2048\r\nExpect: 100-continue\r\n\r\n";
    my ($got, $end) = ('', time + 5);
    while ($got !~ /\r\n\r\n/ && time < $end) { tls_read($c, $got, $end - time) or last }
    is($got, "HTTP/1.1 100 Continue\r\n\r\n", 'Expect: 100-continue, raw client: the 100 before the body is sent');
    print $c 'z' x 2048;
    my ($res) = read_responses($c, 1, 10);
    is($res && $res->{status}, 200, '... then, the body sent, the answer');
    like($res && $res->{body}, qr{^path=/p/expect-raw pid=\d+ body=2048$}, '... to the whole body');
}

# A WebSocket over TLS through psgix.io: the app takes the socket (the
# plain end of the relay), writes the 101 itself and echoes frames
# (masked from the client, unmasked back), small, 16-bit and 64-bit
# lengths, until the close frame, which it echoes and then closes.
SKIP: {
    $SSL or missing($NO_SSL, 10);
    my $c = tls_connect($TPORT) or die 'connect: ' . IO::Socket::SSL::errstr();
    my $key = MIME::Base64::encode_base64(join('', map { chr int rand 256 } 1 .. 16), '');
    print $c "GET /ws HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
           . "Sec-WebSocket-Key: $key\r\nSec-WebSocket-Version: 13\r\n\r\n";
    my ($buf, $end) = ('', time + 5);
    while ($buf !~ /\r\n\r\n/ && time < $end) { tls_read($c, $buf, $end - time) or last }
    my ($head) = $buf =~ /^(.*?\r\n)\r\n/s;
    $buf =~ s/^.*?\r\n\r\n//s;
    like($head // $buf, qr{^HTTP/1\.1 101 Switching Protocols\r\n},
         'WebSocket over TLS: the app answers 101 through psgix.io');
    my $accept = Digest::SHA::sha1_base64($key . '258EAFA5-E914-47DA-95CA-C5AB0DC11B65') . '=';
    like($head // '', qr/\r\nSec-WebSocket-Accept: \Q$accept\E\r\n/, '... with the Sec-WebSocket-Accept of our key');
    for my $msg ('hello', 'x' x 300, join('', map { chr(32 + $_ % 90) } 1 .. 100_000)) {
        print $c ws_client_frame(1, $msg);
        my ($fin, $op, $masked, $data) = ws_read_frame($c, $buf);
        is(join(' ', $fin // '-', $op // '-', $masked // '-', length($data // '')), '1 1 0 ' . length $msg,
           'a text frame of ' . length($msg) . ' bytes: echoed as one unmasked text frame');
        ok(defined $data && $data eq $msg, '... the same text');
    }
    print $c ws_client_frame(8, pack('n', 1000) . 'bye');
    my ($fin, $op, $masked, $data) = ws_read_frame($c, $buf);
    is(($op // '-') . ' ' . ($data // ''), '8 ' . pack('n', 1000) . 'bye', 'the close frame echoed');
    $end = time + 5;
    my $n;
    while (time < $end) { $n = tls_read($c, $buf, $end - time); last unless $n }
    ok(defined $n && $n == 0 && $buf eq '', '... and the connection ends, nothing after it');
}

# Session resumption (TLS 1.3 tickets, whose keys the manager holds): a
# second connection with the first one's session resumes, and it does
# whichever of the two workers answers it (the one not kept busy by a
# /p/sleep, in turn).
{
    my $sess = "$TMP/session.pem";
    my $first = s_client($TPORT, '/p/first', '-sess_out', $sess);
    like($first, qr/^New, TLSv1\.3, /m, 'resumption: a full handshake first (TLS 1.3)') or diag $first;
    ok(-s $sess, '... its session kept (a ticket came)');
    my %reused;
    my $again = s_client($TPORT, '/p/again', '-sess_in', $sess);
    like($again, qr/^Reused, TLSv1\.3, /m, '... a new connection with it resumes') or diag $again;
    $reused{$1}++ if $again =~ /^Reused,.*\bpath=\/p\/again pid=(\d+)/ms;
    my @others;
    for (1 .. 3) {
        last if keys %reused >= 2;
        my $busy = raw_connect($PORT) or die "connect: $!";
        syswrite($busy, "GET /p/sleep HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        sleep 0.2;
        my $out = s_client($TPORT, '/p/other', '-sess_in', $sess);
        my $slept = read_response($busy, 5);
        my ($sleeper) = ($slept && $slept->{body} // '') =~ /pid=(\d+)/;
        push @others, $out;
        $reused{$1}++ if $out =~ /^Reused,.*\bpath=\/p\/other pid=(\d+)/ms && $1 != ($sleeper // 0);
    }
    is(scalar(keys %reused), 2, '... served by either worker: resumed all the same')
        or diag join "\n---\n", @others;
}

# wrk over https: 8 keep-alive connections for 2 s, no socket error, no
# answer but 2xx.
SKIP: {
    my ($wrk) = grep { -x } map { "$_/wrk" } split /:/, $ENV{PATH};
    $wrk or missing('needs the wrk command (Debian: apt-get install wrk)', 4);
    my $r = run_cmd([ $wrk, '-t1', '-c8', '-d2s', "$URL/p/wrk" ], timeout => 30);
    is($r->{code}, 0, 'wrk over https: it ran') or diag $r->{out}, $r->{err};
    my ($n) = $r->{out} =~ /(\d+) requests in /;
    cmp_ok($n // 0, '>', 500, '... requests answered: ' . ($n // 'none'));
    is(($r->{out} =~ /^\s*(Socket errors:.*)$/m)[0] // 'none', 'none', '... no socket error');
    is(($r->{out} =~ /^\s*(Non-2xx.*)$/m)[0] // 'none', 'none', '... no answer but 2xx');
}

# A graceful stop with a TLS keep-alive client: the request in flight is
# answered, whole, and the client then reads the end.
SKIP: {
    skip 'IO::Socket::SSL is not installed', 4 unless eval { require IO::Socket::SSL; 1 };
    my $c = IO::Socket::SSL->new(PeerAddr => '127.0.0.1', PeerPort => $TPORT, SSL_ca_file => $CERT,
                                 SSL_verifycn_name => 'localhost', Timeout => 5)
        or die "connect: " . IO::Socket::SSL::errstr();
    print $c "GET /first HTTP/1.1\r\nHost: x\r\n\r\n";
    my $first = read_one($c);
    like($first, qr{^HTTP/1\.1 200 .*scheme=https}s, 'keep-alive client: first answer');
    print $c "GET /sleep HTTP/1.1\r\nHost: x\r\n\r\n";
    sleep 0.3;
    kill TERM => $s->pid;
    my $rest = read_all($c, 10);
    like($rest, qr{^HTTP/1\.1 200 .*scheme=https}s, 'TERM while a TLS request runs: it is answered');
    like($rest, qr/\r\nConnection: close\r\n/i, '... with Connection: close');
    is($s->stop('none'), 0, '... and the server stops cleanly');
}

# HUP reads the certificate pair again: new handshakes get the new one,
# a TLS connection made before it goes on; a pair that does not load is
# one error line naming the file, and the last good pair stays.
{
    my %pair;
    for my $cn (qw(a b)) {
        system("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout $TMP/$cn.key "
               . "-out $TMP/$cn.crt -days 2 -subj /CN=$cn -addext subjectAltName=DNS:localhost "
               . ">/dev/null 2>&1") == 0 or die "openssl: pair $cn";
        $pair{$cn} = [ map { slurp("$TMP/$cn.$_") } qw(crt key) ];
    }
    my ($rcert, $rkey) = ("$TMP/reload-cert.pem", "$TMP/reload-key.pem");
    my $put = sub { my ($crt, $key) = @_; spew($rcert, $crt); spew($rkey, $key) };
    $put->(@{ $pair{a} });
    my $port = free_port();
    my $h = spawn_server(app => $APP, args => [ '--listen', "127.0.0.1:$port:ssl", '--tls-cert', $rcert,
                                                '--tls-key', $rkey, '--workers', 1 ]);
    ok(wait_until(sub { served_cn($port) eq 'a' }, 5), 'reload: pair A served first');

    my $c;
    SKIP: {
        skip 'IO::Socket::SSL is not installed', 1 unless eval { require IO::Socket::SSL; 1 };
        $c = IO::Socket::SSL->new(PeerAddr => '127.0.0.1', PeerPort => $port, Timeout => 5,
                                  SSL_verify_mode => IO::Socket::SSL::SSL_VERIFY_NONE())
            or die "connect: " . IO::Socket::SSL::errstr();
        print $c "GET /before HTTP/1.1\r\nHost: x\r\n\r\n";
        like(read_one($c), qr{^HTTP/1\.1 200 .*scheme=https}s, 'reload: a keep-alive TLS connection on A');
    }

    $put->(@{ $pair{b} });
    kill HUP => $h->pid;
    ok(wait_until(sub { served_cn($port) eq 'b' }, 10), 'HUP: new handshakes get pair B')
        or diag $h->log_text;
    like($h->log_text, qr/TLS certificate reloaded from \Q$rcert\E/, '... and the log says so');
    SKIP: {
        skip 'IO::Socket::SSL is not installed', 1 unless $c;
        # (after the worker that served it has been retired, too)
        wait_until(sub { $h->log_text =~ /generation 1 finished/ }, 10) or diag $h->log_text;
        print $c "GET /after HTTP/1.1\r\nHost: x\r\n\r\n";
        like(read_one($c), qr{^HTTP/1\.1 200 .*scheme=https}s,
             '... the connection made on A before the HUP still answers');
    }

    $put->($pair{a}[0], $pair{b}[1]);     # A's certificate, B's key
    kill HUP => $h->pid;
    ok(wait_until(sub { $h->log_text =~ /TLS certificate not reloaded/ }, 10), 'HUP with a mismatched pair: said')
        or diag $h->log_text;
    my @said = grep { /TLS/ && /not reloaded|does not match/ } split /\n/, $h->log_text;
    is(scalar(@said), 1, '... in one line') or diag join("\n", @said);
    like($said[0] // '', qr/\Q$rkey\E/, '... naming the file');
    is(served_cn($port), 'b', '... and new handshakes still get pair B');
    is($h->stop, 0, 'reload: the server stops cleanly');
}

# A HUP under load loses nothing: two clients that never retry (each a
# process doing keep-alive requests, a new connection every fifth one, so
# that handshakes go on throughout; a request without a whole 200 answer
# is a failure, and so is a connection or a handshake that fails) while
# the master gets two HUPs (new workers; the certificate pair read
# again). A session from before the HUPs resumes after them (the ticket
# keys stay).
SKIP: {
    $SSL or missing($NO_SSL, 9);
    my $port = free_port();
    my $h = spawn_server(app => $APP, args => [ '--listen', "127.0.0.1:$port:ssl", '--tls-cert', $CERT,
                                                '--tls-key', $KEY, '--workers', 2 ]);
    my $sess = "$TMP/hup-session.pem";
    my $before = s_client($port, '/p/before', '-sess_out', $sess);
    my $stop = "$TMP/hup-stop";
    my @clients = map { hup_client($port, "$TMP/hup-client-$_", $stop) } 1 .. 2;
    sleep 0.5;
    kill HUP => $h->pid;
    ok(wait_until(sub { $h->log_text =~ /generation 1 finished/ }, 10), 'HUP under load: generation 1 replaced')
        or diag $h->log_text;
    kill HUP => $h->pid;
    ok(wait_until(sub { $h->log_text =~ /generation 2 finished/ }, 10), '... a second HUP: generation 2 too')
        or diag $h->log_text;
    sleep 0.5;
    spew($stop, '');
    my ($ok, $failed, %pids, @errors) = (0, 0);
    for my $cl (@clients) {
        waitpid($cl->{pid}, 0);
        my ($counts, $pids, @err) = split /\n/, slurp($cl->{out});
        my ($o, $f) = split ' ', $counts // '';
        $ok += $o // 0;
        $failed += $f // 1;
        $pids{$_} = 1 for split ' ', $pids // '';
        push @errors, @err;
    }
    is($failed, 0, 'clients that never retry: no request failed through two HUPs')
        or diag join "\n", @errors[0 .. ($#errors < 9 ? $#errors : 9)];
    cmp_ok($ok, '>', 200, "... and they were answered ($ok requests)");
    cmp_ok(scalar(keys %pids), '>=', 3,
           '... by workers of more than one generation (' . join(' ', sort keys %pids) . ')');
    ok(wait_until(sub { my @r = $h->log_text =~ /TLS certificate reloaded/g; @r == 2 }, 5),
       '... the certificate pair read again at each HUP') or diag $h->log_text;
    like($before, qr/^New, TLSv1\.3, /m, 'a session made before the HUPs...') or diag $before;
    my $after = s_client($port, '/p/after', '-sess_in', $sess);
    like($after, qr/^Reused, TLSv1\.3, .*\bpath=\/p\/after pid=/ms, '... resumes after them') or diag $after;
    is($h->stop, 0, '... and the server stops cleanly');
}

# Bad certificate pairs: one line naming the file, a non-zero exit,
# nothing listening.
for my $case ([ 'a missing certificate', "$TMP/none.pem", $KEY, qr/none\.pem/ ],
              [ 'a missing key', $CERT, "$TMP/none.pem", qr/none\.pem/ ],
              [ 'a key of another certificate', $CERT, $OTHER, qr/other\.pem|does not match/ ]) {
    my ($what, $cert, $key, $says) = @$case;
    my $port = free_port();
    my $r = run_cmd([ narwhal_cmd(), '--listen', "127.0.0.1:$port:ssl", '--tls-cert', $cert,
                      '--tls-key', $key, $APP ], timeout => 15);
    isnt($r->{code}, 0, "$what: non-zero exit");
    is(scalar(grep { length } split /\n/, $r->{err}), 1, "$what: one line") or diag $r->{err};
    like($r->{err}, qr/^narwhal: TLS: .*$says/, "$what: names it");
    ok(!IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port, Timeout => 2),
       "$what: nothing listens");
}

done_testing;

# The CN of the certificate a new handshake on port gets ('' if none).
sub served_cn {
    my ($port) = @_;
    my $out = `openssl s_client -connect 127.0.0.1:$port -servername localhost </dev/null 2>/dev/null | openssl x509 -noout -subject 2>/dev/null`;
    return $out =~ /CN\s*=\s*(\S+)/ ? $1 : '';
}

sub slurp { my ($f) = @_; open(my $fh, '<', $f) or die "$f: $!"; local $/; return <$fh> }
sub spew { my ($f, $text) = @_; open(my $fh, '>', $f) or die "$f: $!"; print $fh $text; close $fh or die "$f: $!" }

# One response with a Content-Length body.
sub read_one {
    my ($c) = @_;
    my $buf = '';
    my $end = time + 10;
    while (time < $end) {
        my $n = sysread($c, $buf, 65536, length $buf);
        last unless $n;
        next unless $buf =~ /\r\n\r\n/;
        my ($len) = $buf =~ /\r\nContent-Length: (\d+)/i;
        last if defined $len && length($buf) >= index($buf, "\r\n\r\n") + 4 + $len;
    }
    return $buf;
}

sub read_all {
    my ($c, $secs) = @_;
    my $buf = '';
    my $end = time + $secs;
    while (time < $end) {
        my $n = sysread($c, $buf, 65536, length $buf);
        last unless $n;
    }
    return $buf;
}

# A TLS client of port (IO::Socket::SSL, our certificate checked), or
# undef. Its reads give up after 10 s: an answer lost fails a test
# rather than hanging it.
sub tls_connect {
    my ($port) = @_;
    my $c = IO::Socket::SSL->new(PeerAddr => '127.0.0.1', PeerPort => $port, SSL_ca_file => $CERT,
                                 SSL_verifycn_name => 'localhost', Timeout => 5) or return undef;
    setsockopt($c, Socket::SOL_SOCKET(), Socket::SO_RCVTIMEO(), pack('l!l!', 10, 0)) or die "SO_RCVTIMEO: $!";
    return $c;
}

# What comes on a TLS connection, appended to $_[1]: the bytes read, 0 at
# the end, undef when nothing came within $secs (or on an error).
sub tls_read {
    my ($c, undef, $secs) = @_;
    if (!$c->pending) {
        my $rin = '';
        vec($rin, fileno($c), 1) = 1;
        return undef unless select(my $r = $rin, undef, undef, $secs) > 0;
    }
    return sysread($c, $_[1], 65536, length $_[1]);
}

# Up to $n responses read from a TLS connection within $secs.
sub read_responses {
    my ($c, $n, $secs) = @_;
    my ($buf, @res) = ('');
    my $end = time + $secs;
    while (@res < $n) {
        if (my $r = NarwhalTest::parse_response($buf)) {
            push @res, $r;
            $buf = substr($buf, $r->{consumed});
            next;
        }
        my $left = $end - time;
        last if $left <= 0 || !tls_read($c, $buf, $left);
    }
    return @res;
}

# A client's WebSocket frame: final, masked.
sub ws_client_frame {
    my ($op, $data) = @_;
    my $n = length $data;
    my $mask = pack 'N', int rand 2**32;
    return pack('C', 0x80 | $op)
         . ($n < 126 ? pack('C', 0x80 | $n) : $n < 65536 ? pack('Cn', 0x80 | 126, $n) : pack('CQ>', 0x80 | 127, $n))
         . $mask . ($data ^ substr($mask x (1 + int($n / 4)), 0, $n));
}

# The next frame from $c (what was read past it stays in $_[1]):
# (fin, opcode, masked, payload unmasked), or () when it did not come
# whole within 10 s.
sub ws_read_frame {
    my ($c) = @_;
    my $end = time + 10;
    my $need = sub {
        my ($n) = @_;
        while (length $_[1] < $n) { my $left = $end - time; return 0 if $left <= 0 || !tls_read($c, $_[1], $left) }
        return 1;
    };
    $need->(2, $_[1]) or return;
    my ($b0, $b1) = unpack 'CC', $_[1];
    my ($len, $at) = ($b1 & 127, 2);
    if ($len == 126) { $need->(4, $_[1]) or return; ($len, $at) = (unpack('x2 n', $_[1]), 4) }
    if ($len == 127) { $need->(10, $_[1]) or return; ($len, $at) = (unpack('x2 Q>', $_[1]), 10) }
    my $masked = $b1 >> 7;
    $need->($at + 4 * $masked + $len, $_[1]) or return;
    my $mask = $masked ? substr($_[1], $at, 4) : "\0\0\0\0";
    my $data = substr($_[1], $at + 4 * $masked, $len) ^ substr($mask x (1 + int($len / 4)), 0, $len);
    substr($_[1], 0, $at + 4 * $masked + $len) = '';
    return ($b0 >> 7, $b0 & 15, $masked, $data);
}

# openssl s_client to port over TLS 1.3 (more arguments after), asking
# for $path with Connection: close and reading to the end (the session
# ticket comes after the handshake): what it printed.
sub s_client {
    my ($port, $path, @args) = @_;
    my $r = run_cmd([ 'openssl', 's_client', '-connect', "127.0.0.1:$port", '-servername', 'localhost',
                      '-tls1_3', '-ign_eof', @args ],
                    stdin => "GET $path HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", timeout => 10);
    return $r->{out};
}

# A client of port over TLS in a process of its own, until the file $stop
# exists (15 s at most): keep-alive GETs, a new connection after five
# (or a Connection: close), never a retry. Its file says "answered
# failed", the worker pids that answered, then a line for each failure.
sub hup_client {
    my ($port, $out, $stop) = @_;
    my $pid = fork // die "fork: $!";
    return { pid => $pid, out => $out } if $pid;
    my ($ok, $failed, %pids, @errors, $c, $on) = (0, 0);
    my $end = time + 15;
    eval {
        while (time < $end && !-e $stop) {
            if (!$c) {
                $c = tls_connect($port);
                if (!$c) { $failed++; push @errors, 'connect: ' . IO::Socket::SSL::errstr(); sleep 0.05; next }
                $on = 0;
            }
            my ($r) = print($c "GET /p/hup HTTP/1.1\r\nHost: x\r\n\r\n") ? read_responses($c, 1, 10) : ();
            if ($r && $r->{status} == 200 && $r->{body} =~ /pid=(\d+)/) {
                $ok++;
                $pids{$1} = 1;
                undef $c if ++$on >= 5 || ($r->{headers}{connection} // '') =~ /close/i;
            } else {
                $failed++;
                push @errors, 'request ' . ($on + 1) . ' of a connection: '
                              . ($r ? "status $r->{status}" : 'no answer');
                undef $c;
            }
        }
        1;
    } or do { $failed++; push @errors, "the client died: $@" };
    spew($out, join "\n", "$ok $failed", join(' ', keys %pids), @errors, '');
    POSIX::_exit(0);
}
