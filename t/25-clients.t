use strict;
use warnings;
use Test::More;
use lib 't/lib';
use Digest::MD5 qw(md5_hex);
use File::Spec ();
use NarwhalTest qw(spawn_server write_app tmpdir run_cmd http_get manager_fallback missing);

# Real clients against a running server: curl, HTTP::Tiny, ab, wrk.
# A client that is not installed is skipped.

my @NM = manager_fallback();    # --no-manager until the manager program is built
diag 'narwhal-manager is not built: servers run with --no-manager' if @NM;

my $APP = write_app(<<'APP');
use strict;
use Digest::MD5 ();
sub {
    my $env = shift;
    my $in = $env->{'psgi.input'};
    my $body = '';
    while (1) {
        my $n = $in->read(my $buf, 65536);
        last unless $n;
        $body .= $buf;
    }
    my $te = $env->{HTTP_TRANSFER_ENCODING} // '-';
    return [200, ['Content-Type' => 'text/plain', 'X-Method' => $env->{REQUEST_METHOD}],
            ["method=$env->{REQUEST_METHOD} len=" . length($body) . ' md5=' . Digest::MD5::md5_hex($body)
             . " proto=$env->{SERVER_PROTOCOL} port=$env->{REMOTE_PORT} te=$te pid=$$\n"]];
}
APP

my $s = spawn_server(app => $APP, args => [ @NM, '--max-workers', '4' ]);
my $port = $s->port;
my $URL = "http://127.0.0.1:$port";

sub have { my ($bin) = @_; return (grep { -x "$_/$bin" } split /:/, $ENV{PATH}) ? 1 : 0 }

sub write_file {
    my ($name, $bytes) = @_;
    my $f = File::Spec->catfile(tmpdir(), $name);
    open(my $fh, '>', $f) or die "$f: $!";
    binmode $fh;
    print $fh $bytes;
    close $fh;
    return $f;
}

# $n random bytes (from the kernel: a Perl loop took about 1 s for the 4 MB here).
sub random_bytes {
    my ($n) = @_;
    open(my $fh, '<:raw', '/dev/urandom') or die "/dev/urandom: $!";
    read($fh, my $bytes, $n) == $n or die "/dev/urandom: short read";
    return $bytes;
}

# curl
SKIP: {
    missing('curl is not installed', 24) unless have('curl');
    my @curl = ('curl', '-sS', '-m', '10');

    my $r = run_cmd([ @curl, '-w', '\n%{http_code}', "$URL/path?x=1" ]);
    is($r->{code}, 0, 'curl GET: exit 0') or diag $r->{err};
    like($r->{out}, qr/^method=GET len=0 .*\n200$/s, 'curl GET: 200 from the app');

    $r = run_cmd([ @curl, '-w', '\n%{http_code}', '-d', 'a=1&b=2', "$URL/form" ]);
    is($r->{code}, 0, 'curl POST -d: exit 0');
    like($r->{out}, qr/^method=POST len=7 md5=\Q${\ md5_hex('a=1&b=2') }\E /,
         'curl POST -d: the app got the body');
    like($r->{out}, qr/\n200$/, 'curl POST -d: 200');

    # HEAD twice on one connection: no body may follow either head.
    $r = run_cmd([ @curl, '-I', "$URL/a", "$URL/b" ]);
    is($r->{code}, 0, 'curl -I (two URLs, one connection): exit 0') or diag $r->{err};
    my @heads = $r->{out} =~ m{^HTTP/1\.1 200 }mg;
    is(scalar @heads, 2, 'curl -I: two 200 heads');
    like($r->{out}, qr/^X-Method: HEAD\r?$/mi, 'curl -I: the app saw HEAD');
    like($r->{out}, qr/^Content-Length: \d+\r?$/mi, 'curl -I: Content-Length of the GET body');
    unlike($r->{out}, qr/method=/, 'curl -I: no body');

    $r = run_cmd([ @curl, '--http1.0', '-i', "$URL/old" ]);
    is($r->{code}, 0, 'curl --http1.0: exit 0');
    like($r->{out}, qr{^HTTP/1\.[01] 200 }, 'curl --http1.0: 200');
    like($r->{out}, qr/proto=HTTP\/1\.0 /, 'curl --http1.0: SERVER_PROTOCOL is HTTP/1.0');

    # Chunked uploads: small, and larger than --body-in-memory (a temp file).
    for my $size (100_000, 2_500_000) {
        my $data = random_bytes($size);
        my $file = write_file("upload-$size", $data);
        $r = run_cmd([ @curl, '-v', '-w', '\n%{http_code}', '-H', 'Transfer-Encoding: chunked',
                       '--data-binary', "\@$file", "$URL/upload" ], timeout => 20);
        is($r->{code}, 0, "curl chunked upload of $size bytes: exit 0") or diag $r->{err};
        like($r->{out}, qr/ len=$size md5=${\ md5_hex($data) } /,
             "curl chunked upload of $size bytes: the app got every byte");
        like($r->{err}, qr/^> Transfer-Encoding: chunked\r?$/mi, 'curl sent it chunked');
        unlike($r->{err}, qr/^> Content-Length/mi, 'with no Content-Length');
        like($r->{out}, qr/\n200$/, 'chunked upload: 200');
    }
    my $data = random_bytes(1_500_000);
    my $file = write_file('upload-plain', $data);
    $r = run_cmd([ @curl, '--data-binary', "\@$file", "$URL/upload" ], timeout => 20);
    like($r->{out}, qr/ len=1500000 md5=${\ md5_hex($data) } /,
         'curl Content-Length upload of 1.5 MB (Expect: 100-continue): every byte');
}

# HTTP::Tiny: one keep-alive connection for 20 requests.
{
    require HTTP::Tiny;
    my $http = HTTP::Tiny->new(timeout => 5, keep_alive => 1);
    my (%ports, $ok);
    for my $i (1 .. 20) {
        my $res = $http->get("$URL/ka/$i");
        next unless $res->{status} == 200;
        $ok++;
        $ports{$1}++ if $res->{content} =~ /port=(\d+)/;
    }
    is($ok, 20, 'HTTP::Tiny: 20 requests, all 200');
    is(scalar keys %ports, 1, 'HTTP::Tiny: all on one connection (one REMOTE_PORT)')
        or diag explain \%ports;
    my $res = $http->post("$URL/post", { content => 'x' x 5000 });
    like($res->{content}, qr/ len=5000 /, 'HTTP::Tiny POST on the same connection');
}

# ab
SKIP: {
    missing('ab is not installed', 6) unless have('ab');
    my $r = run_cmd([ 'ab', '-q', '-s', '10', '-n', '500', '-c', '10', "$URL/" ], timeout => 30);
    is($r->{code}, 0, 'ab -n 500 -c 10: exit 0') or diag $r->{err};
    like($r->{out}, qr/^Complete requests:\s+500$/m, 'ab: 500 complete');
    like($r->{out}, qr/^Failed requests:\s+0$/m, 'ab: 0 failed') or diag $r->{out};
    unlike($r->{out}, qr/^Non-2xx responses/m, 'ab: no non-2xx');

    # More keep-alive connections (10) than workers (4): without the
    # connection manager idle connections pin the workers (a known limit).
    my $no_manager = !NarwhalTest::managed();
    local $TODO = $no_manager ? 'keep-alive connections beyond --max-workers need the manager' : undef;
    $r = run_cmd([ 'ab', '-q', '-s', '10', '-k', '-n', '500', '-c', '10', "$URL/" ], timeout => 30);
    like($r->{out}, qr/^Failed requests:\s+0$/m, 'ab -k: 0 failed') or diag "$r->{out}$r->{err}";
    like($r->{out}, qr/^Keep-Alive requests:\s+500$/m, 'ab -k: every request kept alive');
}

# wrk
SKIP: {
    missing('wrk is not installed', 4) unless have('wrk');
    # (1 s: tens of thousands of requests, and both cores busy all along)
    my $r = run_cmd([ 'wrk', '-t1', '-c20', '-d1s', "$URL/" ], timeout => 20);
    is($r->{code}, 0, 'wrk: exit 0') or diag $r->{err};
    my ($n) = $r->{out} =~ /(\d+) requests in/;
    cmp_ok($n // 0, '>', 100, 'wrk: requests were served (' . ($n // 0) . ')');
    unlike($r->{out}, qr/Socket errors/, 'wrk: no socket errors') or diag $r->{out};
    unlike($r->{out}, qr/Non-2xx/, 'wrk: no non-2xx responses') or diag $r->{out};
}

is($s->stop, 0, 'the server stops with status 0 after the clients');
unlike($s->log_text, qr/worker \d+ (?:exited|was killed)/, 'no worker died meanwhile')
    or diag $s->log_text;

done_testing;
