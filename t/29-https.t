use strict;
use warnings;
use Test::More;
use lib 't/lib';
use Digest::MD5 ();
use IO::Socket::INET ();
use POSIX ();
use Time::HiRes qw(time sleep);
use NarwhalTest qw(spawn_server free_port write_app tmpdir run_cmd narwhal_cmd missing missing_all
                   wait_until raw_connect read_response http_get metrics_of);
use JSON::PP ();

# HTTPS, the relayed way (docs/DESIGN.md, "HTTPS"): the connection
# manager does TLS on the TLS listeners and relays plaintext to the
# workers. Real clients (curl, openssl s_client, HTTP::Tiny with
# IO::Socket::SSL) against a server with a plain and a TLS listener, on a
# throwaway certificate made by the openssl command.

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
# /big: a file body (the sendfile path, into the pair); /sleep: slow.
my $APP = write_app(<<"APP");
use strict;
sub {
    my \$env = shift;
    my (\$n, \$buf) = (0, '');
    while (my \$r = \$env->{'psgi.input'}->read(\$buf, 65536)) { \$n += \$r }
    if (\$env->{PATH_INFO} eq '/big') {
        open(my \$fh, '<', '$BIG') or die;
        return [200, ['Content-Type' => 'application/octet-stream'], \$fh];
    }
    select(undef, undef, undef, 1) if \$env->{PATH_INFO} eq '/sleep';
    return [200, ['Content-Type' => 'text/plain'],
            [join(' ', "scheme=\$env->{'psgi.url_scheme'}", 'https=' . (\$env->{HTTPS} // ''),
                  "remote=\$env->{REMOTE_ADDR}:\$env->{REMOTE_PORT}", "port=\$env->{SERVER_PORT}",
                  "body=\$n") . "\\n"]];
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
