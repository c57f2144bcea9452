use strict;
use warnings;
use Test::More;
use Test2::IPC;    # (parts of this file run in processes of their own)
use Time::HiRes ();
use lib 't/lib';
use NarwhalTest qw(spawn_server raw_request raw_connect read_response parse_response read_until_close
                   in_background);

# Raw-byte tests of the HTTP/1.1 rules: each malformed or oversized request
# gets the right status and a closed connection; framing, keep-alive and
# pipelining behave as RFC 9112 says.

my $app = <<'APP';
my %routes = (
    '/env' => sub {
        my $env = shift;
        my @k = qw(REQUEST_METHOD REQUEST_URI PATH_INFO QUERY_STRING SERVER_PROTOCOL
                   SERVER_NAME SERVER_PORT REMOTE_ADDR REMOTE_PORT CONTENT_LENGTH
                   CONTENT_TYPE HTTP_X_MULTI HTTP_HOST SCRIPT_NAME);
        [200, ['Content-Type' => 'text/plain'],
         [map { "$_=" . ($env->{$_} // '<undef>') . "\n" } @k]];
    },
    '/echo' => sub {
        my $env = shift;
        my $in = $env->{'psgi.input'};
        my $body = '';
        while ($in->read(my $buf, 7)) { $body .= $buf }
        my $kind = ref($in) eq 'GLOB' || eval { fileno($in) >= 0 } ? 'file' : 'memory';
        [200, ['X-Input' => $kind, 'X-Length' => $env->{CONTENT_LENGTH} // ''], [$body]];
    },
    '/nobody' => sub { [204, ['X-A' => 1], ['ignored']] },
    '/notmod' => sub { [304, [], ['ignored']] },
    '/stream' => sub {
        my $env = shift;
        sub {
            my $w = shift->([200, ['Content-Type' => 'text/plain']]);
            $w->write("one,");
            $w->write("");
            $w->write("two,");
            $w->write("three");
            $w->close;
        };
    },
    '/hints' => sub {
        my $env = shift;
        $env->{'psgix.informational'}->(103, [Link => '</a.css>; rel=preload']);
        [200, [], ['hinted']];
    },
    '/die' => sub { die "boom in the app\n" },
    '/stream_dies' => sub {
        sub {
            my $w = shift->([200, ['Content-Type' => 'text/plain']]);
            $w->write("part one,");
            die "the app gave up\n";
        };
    },
    '/length_dies' => sub {
        sub {
            my $w = shift->([200, ['Content-Type' => 'text/plain', 'Content-Length' => 100]]);
            $w->write("ten bytes.");
            die "the app gave up\n";
        };
    },
    '/invalid' => sub { "not a response" },
    '/badheader' => sub { [200, ['X-Bad' => "a\r\nSet-Cookie: evil=1"], ['x']] },
    '/pid' => sub { [200, [], [$$]] },
    '/sleep' => sub { select undef, undef, undef, 0.3; [200, [], ['slept']] },
    '/big' => sub { [200, [], ['x' x 100_000, 'y' x 100_000]] },
    # as Plack::Middleware::Head does: the body left out for HEAD
    '/head-empty' => sub { [200, [], $_[0]{REQUEST_METHOD} eq 'HEAD' ? [] : ['nine byte']] },
);
sub {
    my $env = shift;
    my $h = $routes{$env->{PATH_INFO}} || sub { [404, [], ['no such route']] };
    $h->($env);
};
APP

# The server of the part of this file that runs in this process: the
# parts that wait for a timeout run at once, beside the others, each in a
# process of its own with a server of its own (see the end).
my ($srv, $port);
sub serve {
    $srv = spawn_server(app => $app, args => [
        '--max-workers' => 1, '--max-request-line' => 200, '--max-header-bytes' => 1000,
        '--max-headers' => 10, '--max-request-body' => 5000, '--body-in-memory' => 1000,
        '--keepalive-timeout' => 1, '--read-timeout' => 1, '--max-keepalive-reqs' => 3,
    ]);
    $port = $srv->port;
}

# Send raw bytes; return the parsed first response, the raw bytes, whether
# the server closed promptly.
sub exchange {
    my ($bytes, $timeout) = @_;
    my $t0 = Time::HiRes::time();
    my $raw = raw_request($port, $bytes, $timeout // 3);
    my $took = Time::HiRes::time() - $t0;
    return (parse_response($raw, 0, 1), $raw, $took < ($timeout // 3) - 0.5);
}

sub rejects {
    my ($name, $bytes, $status) = @_;
    my ($res, $raw, $closed) = exchange($bytes);
    is($res && $res->{status}, $status, "$name: $status");
    ok($closed, "$name: connection closed");
    like($res && $res->{headers}{connection} // '', qr/close/i, "$name: Connection: close")
        if $res;
}

my $H = "Host: t\r\n";

# The parts that wait for a 1 s timeout run at once and beside the others,
# each in a process of its own with a server of its own.
my @waits;
push @waits, in_background(sub { serve(); subtest 'keep-alive and pipelining' => sub {
    my $s = raw_connect($port);
    syswrite($s, "GET /env HTTP/1.1\r\n$H\r\n"
               . "POST /echo HTTP/1.1\r\n${H}Content-Length: 3\r\n\r\nabc"
               . "HEAD /env HTTP/1.1\r\n$H\r\n");
    my $r1 = read_response($s, 3);
    my $r2 = read_response($s, 3);
    my $r3 = read_response($s, 3, 1);
    like($r1 && $r1->{body}, qr/^REQUEST_METHOD=GET$/m, 'pipelined 1: GET');
    is($r2 && $r2->{body}, 'abc', 'pipelined 2: POST with its body');
    is($r3 && $r3->{status}, 200, 'pipelined 3: HEAD');
    like($r3 && $r3->{headers}{connection} // '', qr/close/, '--max-keepalive-reqs 3: third response closes');
    is(NarwhalTest::read_until_close($s, 2), '', 'HEAD sent no body, then the connection closed');

    $s = raw_connect($port);
    syswrite($s, "GET /env HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
    my $r = read_response($s, 3);
    is($r->{headers}{connection}, 'keep-alive', 'HTTP/1.0 keep-alive honoured');
    syswrite($s, "GET /env HTTP/1.0\r\n\r\n");
    $r = read_response($s, 3);
    is($r && $r->{status}, 200, 'second request on the HTTP/1.0 connection');

    my ($res, undef, $closed) = exchange("GET /env HTTP/1.1\r\n${H}Connection: close\r\n\r\n");
    ok($closed, 'Connection: close honoured');

    $s = raw_connect($port);
    syswrite($s, "GET /env HTTP/1.1\r\n$H\r\n");
    read_response($s, 3);
    my $t0 = Time::HiRes::time();
    is(NarwhalTest::read_until_close($s, 4), '', 'idle keep-alive connection closed...');
    my $idle = Time::HiRes::time() - $t0;
    ok($idle > 0.7 && $idle < 2.5, "...after --keepalive-timeout 1 (took ${\ sprintf '%.2f', $idle}s)");
} });

push @waits, in_background(sub { serve(); subtest 'slow request head gets 408' => sub {
    my $s = raw_connect($port);
    syswrite($s, "GET /env HTTP/1.1\r\n");
    my $t0 = Time::HiRes::time();
    my $raw = NarwhalTest::read_until_close($s, 4);
    like($raw, qr{^HTTP/1\.1 408 }, '408 after --read-timeout');
    ok(Time::HiRes::time() - $t0 < 2.5, 'within the deadline');
} });

push @waits, in_background(sub { serve(); subtest 'a head dribbled byte by byte gets 408' => sub {
    my $s = raw_connect($port);
    my $end = Time::HiRes::time() + 2.5;
    my $sent = 0;
    for my $byte (split //, "GET /env HTTP/1.1\r\nX-A: " . ('a' x 40)) {
        last if Time::HiRes::time() > $end;
        syswrite($s, $byte) or last;
        $sent++;
        Time::HiRes::sleep(0.05);
    }
    my $raw = NarwhalTest::read_until_close($s, 2);
    like($raw, qr{^HTTP/1\.1 408 }, 'a head dribbled byte by byte still ends at the deadline');
} });

push @waits, in_background(sub { subtest 'a body shorter than its Content-Length' => sub {
    my $s = spawn_server(app => $app, args => [ '--timeout', 1 ]);
    my $c = raw_connect($s->port);
    syswrite($c, "POST /echo HTTP/1.1\r\n${H}Content-Length: 10\r\n\r\nabc");
    my $t0 = Time::HiRes::time();
    my $raw = NarwhalTest::read_until_close($c, 4);
    my $took = Time::HiRes::time() - $t0;
    like($raw, qr{^HTTP/1\.1 408 }, 'a body shorter than its Content-Length: 408, the app not called');
    ok($took > 0.8 && $took < 2.5, sprintf('... after --timeout 1 without more of it (%.2f s), then closed', $took));
} });

serve();

subtest 'request line and headers' => sub {
    rejects('request line too long', "GET /" . ('a' x 300) . " HTTP/1.1\r\n$H\r\n", 414);
    rejects('head too large', "GET / HTTP/1.1\r\n$H" . ("X-Pad: " . ('p' x 90) . "\r\n") x 12 . "\r\n", 431);
    rejects('too many headers', "GET / HTTP/1.1\r\n$H" . join('', map { "X-$_: 1\r\n" } 1 .. 11) . "\r\n", 431);
    rejects('garbage request line', "HELLO\r\n\r\n", 400);
    rejects('bad method token', "GE(T / HTTP/1.1\r\n$H\r\n", 400);
    rejects('unsupported version', "GET / HTTP/2.0\r\n$H\r\n", 505);
    rejects('obs-fold', "GET / HTTP/1.1\r\n${H}X-A: 1\r\n  folded\r\n\r\n", 400);
    rejects('bare CR in a header', "GET / HTTP/1.1\r\n${H}X-A: a\rb\r\n\r\n", 400);
    rejects('NUL in a header', "GET / HTTP/1.1\r\n${H}X-A: a\0b\r\n\r\n", 400);
    rejects('space before colon', "GET / HTTP/1.1\r\n${H}X-A : 1\r\n\r\n", 400);
    rejects('HTTP/1.1 without Host', "GET / HTTP/1.1\r\n\r\n", 400);
    rejects('two Host headers', "GET / HTTP/1.1\r\n${H}Host: u\r\n\r\n", 400);
    my ($res) = exchange("GET /env HTTP/1.0\r\n\r\n");
    is($res->{status}, 200, 'HTTP/1.0 without Host is fine');
};

subtest 'body framing' => sub {
    rejects('Content-Length not digits', "POST /echo HTTP/1.1\r\n${H}Content-Length: 1x\r\n\r\nab", 400);
    rejects('Content-Length negative', "POST /echo HTTP/1.1\r\n${H}Content-Length: -1\r\n\r\n", 400);
    rejects('conflicting Content-Length', "POST /echo HTTP/1.1\r\n${H}Content-Length: 2\r\nContent-Length: 3\r\n\r\nabc", 400);
    rejects('Content-Length with Transfer-Encoding',
            "POST /echo HTTP/1.1\r\n${H}Content-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400);
    rejects('chunked not the final coding', "POST /echo HTTP/1.1\r\n${H}Transfer-Encoding: gzip\r\n\r\n", 400);
    rejects('chunked, gzip', "POST /echo HTTP/1.1\r\n${H}Transfer-Encoding: chunked, gzip\r\n\r\n", 400);
    rejects('gzip, chunked', "POST /echo HTTP/1.1\r\n${H}Transfer-Encoding: gzip, chunked\r\n\r\n", 501);
    rejects('Transfer-Encoding in HTTP/1.0', "POST /echo HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400);
    rejects('bad chunk size', "POST /echo HTTP/1.1\r\n${H}Transfer-Encoding: chunked\r\n\r\nzz\r\nab\r\n0\r\n\r\n", 400);
    rejects('chunk data longer than its size', "POST /echo HTTP/1.1\r\n${H}Transfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n0\r\n\r\n", 400);
    rejects('body over --max-request-body', "POST /echo HTTP/1.1\r\n${H}Content-Length: 6000\r\n\r\n", 413);
    rejects('chunked body over --max-request-body', "POST /echo HTTP/1.1\r\n${H}Transfer-Encoding: chunked\r\n\r\n"
            . ("3e8\r\n" . ('c' x 1000) . "\r\n") x 6 . "0\r\n\r\n", 413);

    my ($res) = exchange("POST /echo HTTP/1.1\r\n${H}Content-Length: 5\r\nConnection: close\r\n\r\nhello");
    is($res->{body}, 'hello', 'Content-Length body read');
    is($res->{headers}{'x-input'}, 'memory', 'small body kept in memory');
    ($res) = exchange("POST /echo HTTP/1.1\r\n${H}Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
                      . "5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n");
    is($res->{body}, 'hello world', 'chunked body decoded');
    is($res->{headers}{'x-length'}, 11, 'CONTENT_LENGTH set from the decoded chunked body');
    # where the RFC bounds a value, the value is bounded, not its spelling
    # (RFC 9110 8.6: Content-Length = 1*DIGIT; RFC 9112 7.1: chunk-size = 1*HEXDIG)
    ($res) = exchange("POST /echo HTTP/1.1\r\n${H}Content-Length: 000000000000000000005\r\n"
                      . "Connection: close\r\n\r\nhello");
    is($res && $res->{body}, 'hello', 'Content-Length of 21 digits, 20 leading zeros: a body of 5');
    is($res && $res->{headers}{'x-length'}, 5, '... CONTENT_LENGTH 5');
    ($res) = exchange("POST /echo HTTP/1.1\r\n${H}Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
                      . "00000000000000000000005\r\nhello\r\n0000000000000000000000\r\n\r\n");
    is($res && $res->{body}, 'hello', 'chunk sizes of 23 and 22 hex digits (leading zeros): decoded');
    rejects('Content-Length over 2^63 - 1', "POST /echo HTTP/1.1\r\n${H}Content-Length: 9223372036854775808\r\n\r\n", 413);
    rejects('chunk size over 2^64 - 1', "POST /echo HTTP/1.1\r\n${H}Transfer-Encoding: chunked\r\n\r\n"
            . "10000000000000000\r\n", 413);
    my $big = join '', map { chr(65 + $_ % 26) } 1 .. 3000;
    ($res) = exchange("POST /echo HTTP/1.1\r\n${H}Content-Length: 3000\r\nConnection: close\r\n\r\n$big");
    is($res->{body}, $big, 'body over --body-in-memory read back intact');
    is($res->{headers}{'x-input'}, 'file', 'and given as a real file');
};

subtest 'expect 100-continue' => sub {
    my $s = raw_connect($port);
    syswrite($s, "POST /echo HTTP/1.1\r\n${H}Content-Length: 4\r\nExpect: 100-continue\r\n\r\n");
    my $interim = read_response($s, 3);
    is($interim && $interim->{status}, 100, '100 Continue before the body is sent');
    syswrite($s, "data");
    my $res = read_response($s, 3);
    is($res && $res->{status}, 200, 'then the final response');
    is($res && $res->{body}, 'data', 'with the body');
    rejects('unknown expectation', "POST /echo HTTP/1.1\r\n${H}Content-Length: 1\r\nExpect: magic\r\n\r\nx", 417);
};

subtest 'env' => sub {
    my ($res) = exchange("GET /env?a=%20b&c HTTP/1.1\r\n${H}X-Multi: one\r\nX-Multi: two\r\nConnection: close\r\n\r\n");
    my %e = $res->{body} =~ /^(\w+)=(.*)$/mg;
    is($e{PATH_INFO}, '/env', 'PATH_INFO');
    is($e{QUERY_STRING}, 'a=%20b&c', 'QUERY_STRING raw');
    is($e{REQUEST_URI}, '/env?a=%20b&c', 'REQUEST_URI raw');
    is($e{HTTP_X_MULTI}, 'one, two', 'repeated headers joined with ", "');
    is($e{SERVER_PROTOCOL}, 'HTTP/1.1', 'SERVER_PROTOCOL');
    is($e{REMOTE_ADDR}, '127.0.0.1', 'REMOTE_ADDR');
    like($e{REMOTE_PORT}, qr/^\d+$/, 'REMOTE_PORT');
    is($e{SERVER_PORT}, $port, 'SERVER_PORT');
    is($e{SCRIPT_NAME}, '', 'SCRIPT_NAME empty');
    ($res) = exchange("GET /%65nv%2Fx HTTP/1.0\r\n\r\n");
    is($res->{status}, 404, 'percent-decoded PATH_INFO routes (/env/x does not exist)');
    ($res) = exchange("GET /%65nv HTTP/1.0\r\n\r\n");
    ($e{PATH_INFO}) = $res->{body} =~ /^PATH_INFO=(.*)$/m;
    is($e{PATH_INFO}, '/env', 'PATH_INFO percent-decoded');
    ($res) = exchange("GET http://example.com/env?q=1 HTTP/1.1\r\n${H}Connection: close\r\n\r\n");
    like($res->{body}, qr{^PATH_INFO=/env$}m, 'absolute-form target: PATH_INFO is the path');
    for my $case (["\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03", 'a TLS ClientHello'],
                  ["PROXY TCP4 192.0.2.1 192.0.2.2 5555 80\r\n", 'a PROXY protocol line'],
                  ["\x00\x01\x02\x03", 'binary junk']) {
        my ($bytes, $what) = @$case;
        my $t0 = Time::HiRes::time();
        my $raw = raw_request($port, $bytes, 5);
        my $took = Time::HiRes::time() - $t0;
        like($raw, qr{^HTTP/1\.1 400 }, "$what gets 400");
        cmp_ok($took, '<', 1, "$what: at once, not after the read timeout");
    }
    {
        my $raw = raw_request($port, "GET /stream_dies HTTP/1.1\r\n${H}\r\n", 5);
        like($raw, qr/\r\n\r\n9\r\npart one,\r\n/, 'a streamed response cut short by the app: what was written arrives');
        unlike($raw, qr/\r\n0\r\n\r\n/, 'and no last chunk: the client sees it truncated (RFC 9112 7.1)');
        $raw = raw_request($port, "GET /length_dies HTTP/1.1\r\n${H}\r\n", 5);
        like($raw, qr/\r\n\r\nten bytes\.\z/, 'a Content-Length response cut short: closed before the length is reached');
        like($srv->log_text, qr{GET /stream_dies: the app gave up}, "the app's error is logged with the request line");
    }
    ($res) = exchange("GET http://example.com:8080/env?q=1 HTTP/1.1\r\nHost: other.test\r\nConnection: close\r\n\r\n");
    like($res->{body}, qr{^HTTP_HOST=example\.com:8080$}m, 'absolute-form target: its authority replaces Host (RFC 9112 3.2.2)');
    like($res->{body}, qr{^REQUEST_URI=/env\?q=1$}m, 'absolute-form target: REQUEST_URI is the path and query only (PSGI)');
    like($res->{body}, qr{^QUERY_STRING=q=1$}m, 'absolute-form target: QUERY_STRING');
};

subtest 'responses' => sub {
    my ($res) = exchange("GET /nobody HTTP/1.1\r\n${H}Connection: close\r\n\r\n");
    is($res->{status}, 204, 'no-content status');
    ok(!exists $res->{headers}{'content-length'}, '204 has no Content-Length');
    my (undef, $raw) = exchange("GET /nobody HTTP/1.1\r\n${H}Connection: close\r\n\r\n");
    unlike($raw, qr/ignored/, '204 sends no body');
    (undef, $raw) = exchange("GET /notmod HTTP/1.1\r\n${H}Connection: close\r\n\r\n");
    like($raw, qr/^HTTP\/1\.1 304 /, 'not-modified status');
    unlike($raw, qr/ignored/, '304 sends no body');
    ($res, $raw) = exchange("GET /stream HTTP/1.1\r\n${H}Connection: close\r\n\r\n");
    is($res->{headers}{'transfer-encoding'}, 'chunked', 'streamed body chunked on HTTP/1.1');
    is($res->{body}, 'one,two,three', 'chunks reassemble');
    like($raw, qr/\r\n0\r\n\r\n\z/, 'ends with the last chunk');
    ($res, $raw) = exchange("GET /stream HTTP/1.0\r\n\r\n");
    ok(!$res->{headers}{'transfer-encoding'}, 'no chunking on HTTP/1.0');
    like($raw, qr/\r\n\r\none,two,three\z/, 'close-delimited body on HTTP/1.0');
    ($res) = exchange("GET /big HTTP/1.1\r\n${H}Connection: close\r\n\r\n");
    is(length $res->{body}, 200_000, 'large array body complete');
    is($res->{headers}{'content-length'}, 200_000, 'Content-Length computed');
    like($res->{headers}{date} // '', qr/^\w{3}, \d\d \w{3} \d{4} \d\d:\d\d:\d\d GMT$/, 'Date header');
    (undef, $raw) = exchange("HEAD /head-empty HTTP/1.1\r\n${H}Connection: close\r\n\r\n");
    unlike($raw, qr/^Content-Length:/mi,
           'HEAD, the app left the body out: no Content-Length (the GET\'s is not 0, RFC 9110 8.6)');
    ($res) = exchange("GET /head-empty HTTP/1.1\r\n${H}Connection: close\r\n\r\n");
    is($res->{headers}{'content-length'}, 9, '... the GET has its own');
    (undef, $raw) = exchange("HEAD /big HTTP/1.1\r\n${H}Connection: close\r\n\r\n");
    like($raw, qr/^Content-Length: 200000\r\n/mi, 'HEAD, the app returned the GET\'s body: its length');
    (undef, $raw) = exchange("GET /hints HTTP/1.1\r\n${H}Connection: close\r\n\r\n");
    like($raw, qr{^HTTP/1\.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\nHTTP/1\.1 200 }, '103 Early Hints first');
};

subtest 'app errors' => sub {
    my ($p1) = exchange("GET /pid HTTP/1.0\r\n\r\n");
    for my $path (qw(/die /invalid /badheader)) {
        my ($res, $raw) = exchange("GET $path HTTP/1.1\r\n${H}Connection: close\r\n\r\n");
        is($res && $res->{status}, 500, "$path: 500");
        unlike($raw, qr/evil/, "$path: nothing of the bad response leaks");
    }
    my ($p2) = exchange("GET /pid HTTP/1.0\r\n\r\n");
    is($p2->{body}, $p1->{body}, 'the same worker is still serving');
    like($srv->log_text, qr{^\S+Z narwhal\[\d+\] worker error: GET /die: boom in the app$}m,
         'the error is logged with its message');
};

# Lingering close: more pipelined requests than --max-keepalive-reqs in one
# write. The server answers as many as it may and closes without a reset,
# so a client that reads late still gets every response that was sent.
{
    my $ka = spawn_server(app => $app, args => [ '--max-workers', 1, '--max-keepalive-reqs', 100 ]);
    my $c = raw_connect($ka->port) or die;
    # more than a worker reads at once, so that requests are still unread
    # in the socket when it closes (a plain close then resets)
    syswrite($c, "GET /pid HTTP/1.1\r\nHost: t\r\n\r\n" x 10_000);
    Time::HiRes::sleep(0.5);    # the server has answered 100 and closed meanwhile
    my $all = read_until_close($c, 5) // '';
    my $n = () = $all =~ m{HTTP/1\.1 200 }g;
    is($n, 100, 'pipelined past --max-keepalive-reqs: every response sent is read by a late reader');
    like($all, qr/Connection: close\r\n/, 'the last one says Connection: close');
}

$_->() for @waits;
done_testing;
