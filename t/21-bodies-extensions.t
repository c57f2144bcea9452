use strict;
use warnings;
use Test::More;
use IO::Socket::IP ();
use lib 't/lib';
use Narwhal::Options ();
use Time::HiRes ();
use NarwhalTest qw(spawn_server raw_request raw_connect read_response parse_response tmpdir wait_until
                   read_until_close);

# Response bodies of every kind (file handles through sendfile, objects with
# getline, delayed responses) and the psgix.* extensions, over TCP v4, v6 and
# a unix socket.

my $dir = tmpdir();
my $file = "$dir/payload.bin";
open(my $fh, '>', $file) or die $!;
print $fh join('', map { chr($_ % 251) } 1 .. 300_000);
close $fh;
my $marker = "$dir/cleanup.marker";

my $app = <<"APP";
my \$file = '$file';
my \$marker = '$marker';
package OwnClose { sub close { my \$s = shift; open my \$m, '>', \$marker; print \$m 'own close'; CORE::close(\$s) } }
package Lines { sub new { bless { n => 0 }, shift } sub getline { my \$s = shift; \$s->{n}++ < 3 ? "line\$s->{n}\\n" : undef } sub close { 1 } }
my %routes = (
    '/file' => sub { open(my \$fh, '<', \$file) or die; [200, ['Content-Type' => 'application/octet-stream'], \$fh] },
    '/file-offset' => sub { open(my \$fh, '<', \$file) or die; seek(\$fh, 1000, 0); [200, [], \$fh] },
    '/file-layer' => sub { open(my \$fh, '<:crlf', \$file) or die; [200, [], \$fh] },
    '/file-utf8' => sub { open(my \$fh, '<:utf8', \$file) or die; [200, [], \$fh] },
    '/file-read' => sub { open(my \$fh, '<', \$file) or die; read(\$fh, my \$x, 10); [200, [], \$fh] },
    '/file-kept' => sub { open(\$main::kept, '<', \$file) or die; [200, [], \$main::kept] },
    '/kept-open' => sub { [200, [], [defined(fileno(\$main::kept)) ? 'open' : 'closed']] },
    '/file-iofile' => sub { require IO::File; my \$fh = IO::File->new(\$file, 'r') or die; [200, [], \$fh] },
    '/file-own-class' => sub { open(my \$fh, '<', \$file) or die; [200, [], bless(\$fh, 'OwnClose')] },
    '/lines' => sub { [200, [], Lines->new] },
    '/delayed' => sub { sub { \$_[0]->([200, ['X-D' => 1], ['delayed body']]) } },
    '/cleanup' => sub {
        my \$env = shift;
        push \@{ \$env->{'psgix.cleanup.handlers'} }, sub { open my \$m, '>', \$marker; print \$m "ran \$\$"; };
        [200, [], ['cleanup queued']];
    },
    '/harakiri' => sub { my \$env = shift; \$env->{'psgix.harakiri.commit'} = 1; [200, [], [\$\$]] },
    '/pid' => sub { [200, [], [\$\$]] },
    '/io' => sub {
        my \$env = shift;
        return sub {
            my \$io = \$env->{'psgix.io'};
            syswrite(\$io, "HTTP/1.1 200 OK\\r\\nContent-Length: 6\\r\\nConnection: close\\r\\n\\r\\nraw io");
        };
    },
    '/upgrade' => sub {
        my \$env = shift;
        return sub {
            my \$io = \$env->{'psgix.io'};
            syswrite(\$io, "HTTP/1.1 101 Switching Protocols\\r\\nUpgrade: echo\\r\\nConnection: Upgrade\\r\\n\\r\\n");
            my \$n = sysread(\$io, my \$buf, 100);    # a plain read, as on other servers
            syswrite(\$io, defined \$n ? "echo:\$buf" : "error:\$!");
        };
    },
    '/addr' => sub { my \$e = shift; [200, [], ["\$e->{REMOTE_ADDR}|\$e->{SERVER_NAME}|\$e->{SERVER_PORT}"]] },
    '/flags' => sub {
        my \$e = shift;
        [200, [], [join ',', map { "\$_=" . (\$e->{\$_} ? 1 : 0) } qw(psgi.streaming psgi.multiprocess psgi.multithread
            psgi.nonblocking psgi.run_once psgix.input.buffered psgix.harakiri psgix.cleanup)]];
    },
);
sub { my \$env = shift; (\$routes{\$env->{PATH_INFO}} || sub { [404, [], ['?']] })->(\$env) };
APP

my $sock = "$dir/ext.sock";
my $srv = spawn_server(app => $app, unix => $sock, args => ['--max-workers' => 1]);
my $port = $srv->port;

sub get {
    my ($path, $where, $ver) = @_;
    my $raw = raw_request($where // $port, "GET $path HTTP/" . ($ver // '1.1') . "\r\nHost: t\r\nConnection: close\r\n\r\n", 5);
    return parse_response($raw, 0, 1);
}

my $expect = do { local $/; open my $f, '<', $file; <$f> };
my $res = get('/file');
is($res->{headers}{'content-length'}, 300_000, 'file body: Content-Length from the file size');
ok($res->{body} eq $expect, 'file body: bytes identical (sendfile)');
$res = get('/file-offset');
is($res->{headers}{'content-length'}, 299_000, 'file body from its current offset');
ok($res->{body} eq substr($expect, 1000), 'file body from offset: bytes identical');
$res = get('/file', $port, '1.0');
ok($res->{body} eq $expect, 'file body over HTTP/1.0');
$res = get('/file-layer');
is($res->{status}, 200, 'a handle with a :crlf layer is read through getline');
ok(!defined $res->{headers}{'content-length'} && $res->{headers}{'transfer-encoding'} eq 'chunked',
   'and streamed chunked, not sendfile');
$res = get('/file-utf8');
ok(!defined $res->{headers}{'content-length'} && ($res->{headers}{'transfer-encoding'} // '') eq 'chunked',
   'a handle with a :utf8 layer is read through getline too');
$res = get('/file-read');
is($res->{headers}{'content-length'}, 300_000 - 10,
   'a handle the app read from (PerlIO buffered ahead): sent from where the app stopped');
ok($res->{body} eq substr($expect, 10), 'and those bytes exactly');
$res = get('/file-kept');
ok($res->{body} eq $expect, 'a handle the app keeps: sent');
is(get('/kept-open')->{body}, 'closed', 'and closed by the server after the response, as PSGI asks');
$res = get('/file-iofile');
is($res->{headers}{'content-length'}, 300_000, 'an IO::File body: sendfile, with its length');
ok($res->{body} eq $expect, 'an IO::File body: bytes identical');
unlink $marker;
$res = get('/file-own-class');
ok($res->{body} eq $expect, 'a handle blessed into a class of its own: sent');
ok(wait_until(sub { -s $marker }, 3) && do { open my $m, '<', $marker; <$m> eq 'own close' },
   'and closed through its own close method');
$res = get('/lines');
is($res->{body}, "line1\nline2\nline3\n", 'getline body');
is($res->{headers}{'transfer-encoding'}, 'chunked', 'getline body chunked on 1.1');
$res = get('/delayed');
is($res->{body}, 'delayed body', 'delayed response with a complete triplet');

unlink $marker;
$res = get('/cleanup');
is($res->{body}, 'cleanup queued', 'response sent before cleanup');
ok(wait_until(sub { -s $marker }, 5), 'psgix.cleanup handler ran after the response');

my $p1 = get('/harakiri')->{body};
ok(wait_until(sub { my $p = get('/pid')->{body}; $p && $p ne $p1 }, 10),
   'psgix.harakiri.commit: the worker was replaced');

$res = get('/io');
is($res->{body}, 'raw io', 'psgix.io: the app wrote the response itself');

$res = get('/flags');
is($res->{body}, join(',', qw(psgi.streaming=1 psgi.multiprocess=1 psgi.multithread=0 psgi.nonblocking=0
    psgi.run_once=0 psgix.input.buffered=1 psgix.harakiri=1 psgix.cleanup=1)), 'psgi flags');

$res = get('/addr', $sock);
is($res->{body}, '|t|80', 'unix socket: empty REMOTE_ADDR, SERVER_NAME/PORT from Host');
$res = get('/file', $sock);
ok($res->{body} eq $expect, 'file body over a unix socket');

SKIP: {
    my $probe = IO::Socket::IP->new(LocalHost => '::1', LocalPort => 0, Listen => 1);
    skip 'no IPv6 loopback here', 2 unless $probe;
    my $p6 = $probe->sockport;
    close $probe;
    my $v6 = spawn_server(app => $app, no_listen => 1, unix => "$dir/v6.sock",
                          args => ['--listen' => "[::1]:$p6", '--max-workers' => 1]);
    # The unix socket said "up"; the IPv6 listener is opened just after it.
    my $s = wait_until(sub { IO::Socket::IP->new(PeerHost => '::1', PeerPort => $p6) }, 5)
        or die "connect ::1: $!";
    syswrite($s, "GET /addr HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    my $r = read_response($s, 5);
    is($r->{body}, "::1|::1|$p6", 'IPv6: REMOTE_ADDR, SERVER_NAME, SERVER_PORT');
    ok(1, 'IPv6 listener served');
}

# A body limit by default: a client cannot make a worker spool gigabytes.
{
    my $srv = spawn_server(args => [ '--max-workers', 1 ]);
    my $limit = Narwhal::Options::option('max_request_body')->{default};
    cmp_ok($limit, '>', 0, "a request-body limit by default ($limit bytes)");
    my $raw = raw_request($srv->port, "POST / HTTP/1.1\r\nHost: t\r\nContent-Length: " . ($limit + 1) . "\r\n\r\n", 5);
    like($raw, qr{^HTTP/1\.1 413 }, 'a body over it gets 413 without being read');
    my $none = spawn_server(args => [ '--max-workers', 1, '--max-request-body', 0 ]);
    my $c = raw_connect($none->port) or die;
    syswrite($c, "POST / HTTP/1.1\r\nHost: t\r\nContent-Length: " . ($limit + 1) . "\r\nExpect: 100-continue\r\n\r\n");
    my $r = read_response($c, 5);
    is($r && $r->{status}, 100, '--max-request-body 0 lifts it (100 Continue for the same length)');
}

# psgix.io is handed over in blocking mode: after a 101, a plain sysread
# waits for the client's bytes instead of failing with EAGAIN.
{
    my $c = raw_connect($port) or die;
    syswrite($c, "GET /upgrade HTTP/1.1\r\nHost: t\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n");
    my $head = '';
    while ($head !~ /\r\n\r\n/) { sysread($c, $head, 4096, length $head) or last }
    like($head, qr{^HTTP/1\.1 101 }, 'psgix.io: the app answered 101 itself');
    Time::HiRes::sleep(0.3);     # the app is in its sysread by now
    syswrite($c, "ping");
    my $got = read_until_close($c, 5) // '';
    is($got, 'echo:ping', "psgix.io is blocking: the app's sysread waited for the client's bytes");
}

done_testing;
