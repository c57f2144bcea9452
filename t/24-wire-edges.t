use strict;
use warnings;
use Test::More;
use Test2::IPC;    # (parts of this file run in processes of their own)
use POSIX ();
use Time::HiRes qw(time sleep);
use lib 't/lib';
use NarwhalTest qw(spawn_server spawn_servers stop_servers in_parallel in_background raw_connect read_until_close read_response free_port perl_cmd
                   wait_until worker_pids);

# The wire's last edges (docs/RFC-CHECKLIST.md): the same bytes get the
# same answer from the worker's path and the manager's, however they are
# cut and paced; nothing invalid reaches the app (a second Content-Length,
# an invalid Host, a target that is not origin-form or absolute-form);
# 1xx and 204 responses carry no Content-Length or Transfer-Encoding;
# "OPTIONS *" is the server's to answer and CONNECT is refused; a slow
# head gets its 408 when it is due. Raw sockets, both modes in one run:
# a server with the manager (and a short --keepalive-wait, so that a pause
# hands the connection to the manager) and one with --no-manager.

my $app = <<'APP';
my $log = $ENV{NARWHAL_T24_LOG};
sub T24::Lines::getline { shift @{ $_[0]{lines} } }
sub T24::Lines::close { 1 }
sub {
    my $env = shift;
    if ($log && open my $f, '>>', $log) {
        print $f "$env->{REQUEST_METHOD} $env->{REQUEST_URI}\n";
        close $f;
    }
    my $p = $env->{PATH_INFO};
    return [204, ['Content-Length' => 5, 'X-A' => 1], []] if $p eq '/nobody';
    return [204, ['Transfer-Encoding' => 'chunked'], []] if $p eq '/nobody-te';
    return [304, ['Content-Length' => 5, 'ETag' => '"x"'], []] if $p eq '/notmod';
    # the app's own Transfer-Encoding, on every kind of body
    return [200, ['Transfer-Encoding' => 'chunked'], ['hello', ' world']] if $p eq '/te';
    return [200, ['Content-Length' => 11, 'Transfer-Encoding' => 'chunked'], ['hello world']]
        if $p eq '/te-cl';
    return [200, ['Transfer-Encoding' => 'gzip'], ['hello world']] if $p eq '/te-gzip';
    if ($p eq '/te-file') {
        open my $f, '<', $ENV{NARWHAL_T24_FILE} or die;
        return [200, ['Transfer-Encoding' => 'chunked'], $f];
    }
    if ($p eq '/te-getline') {
        my @lines = ('hello', ' world');
        return [200, ['Transfer-Encoding' => 'chunked'],
                bless { lines => \@lines }, 'T24::Lines'];
    }
    if ($p eq '/te-stream') {
        return sub {
            my $w = $_[0]->([200, ['Transfer-Encoding' => 'chunked']]);
            $w->write('hello');
            $w->write(' world');
            $w->close;
        };
    }
    if ($p eq '/hints') {
        $env->{'psgix.informational'}->(103, [Link => '</a.css>', 'Content-Length' => 3,
                                              'Transfer-Encoding' => 'chunked']);
        return [200, ['Content-Type' => 'text/plain'], ['hinted']];
    }
    my $in = $env->{'psgi.input'};
    my $body = '';
    while ($in->read(my $buf, 100)) { $body .= $buf }
    [200, ['Content-Type' => 'text/plain'],
     ["m=$env->{REQUEST_METHOD} u=$env->{REQUEST_URI} p=$env->{PATH_INFO} "
      . "cl=" . ($env->{CONTENT_LENGTH} // '-') . " host=" . ($env->{HTTP_HOST} // '-')
      . " body=$body"]];
}
APP

my $tmp = NarwhalTest::tmpdir();
my %log = (manager => "$tmp/t24-manager.log", 'no-manager' => "$tmp/t24-nomanager.log");
my $hello_file = "$tmp/t24-hello.txt";
{ open my $f, '>', $hello_file or die; print $f 'hello world'; close $f }
my %srv;
# (four workers each: sections 1 and 2 below send from four processes at
# once, one connection to each server at a time, so that without the
# manager each connection still has a worker to itself)
@srv{'manager', 'no-manager'} = spawn_servers(
    { app => $app, env => { NARWHAL_T24_LOG => $log{manager}, NARWHAL_T24_FILE => $hello_file },
      args => [ '--max-workers', 4, '--keepalive-wait', 0.05, '--read-timeout', 5,
                '--keepalive-timeout', 5 ] },
    { app => $app, env => { NARWHAL_T24_LOG => $log{'no-manager'}, NARWHAL_T24_FILE => $hello_file },
      args => [ '--max-workers', 4, '--no-manager', '--read-timeout', 5,
                '--keepalive-timeout', 5 ] });
our @modes = ('manager', 'no-manager');

# Send the pieces with a pause between them; the answers, as a list of
# "status body" (Date left out), until the server closes. exchange_all
# does it on one connection to each server at once (a hash of the answers
# by mode): the pieces and pauses are the same on each, and the two
# servers wait in parallel rather than one after the other.
sub exchange_all {
    my ($pause, @pieces) = @_;
    my %sock = map { my $s = raw_connect($srv{$_}->port) or die "connect: $!"; ($_ => $s) } @modes;
    my %open = map { $_ => 1 } @modes;
    for my $i (0 .. $#pieces) {
        sleep $pause if $i;
        for my $mode (grep { $open{$_} } @modes) {
            syswrite($sock{$mode}, $pieces[$i]) // delete $open{$mode};
        }
    }
    my %raw = map { $_ => '' } @modes;
    my %reading = %sock;
    my $end = time + 3;
    while (%reading && (my $left = $end - time) > 0) {
        my $rin = '';
        vec($rin, fileno $_, 1) = 1 for values %reading;
        last if select(my $rout = $rin, undef, undef, $left) <= 0;
        for my $mode (keys %reading) {
            next unless vec($rout, fileno $reading{$mode}, 1);
            my $got = sysread($reading{$mode}, my $buf, 65536);
            if ($got) { $raw{$mode} .= $buf } else { delete $reading{$mode} }
        }
    }
    return map { $_ => answers($raw{$_}) } @modes;
}

sub answers {
    my ($raw) = @_;
    my @answers;
    while ($raw =~ s{^HTTP/1\.1 (\d+)[^\r]*\r\n((?:[^\r]+\r\n)*)\r\n}{}) {
        my ($status, $head) = ($1, $2);
        my ($len) = $head =~ /^Content-Length: (\d+)\r$/mi;
        my $body = substr($raw, 0, $len // 0, '');
        push @answers, "$status $body";
    }
    push @answers, "junk: $raw" if length $raw;
    return join ' | ', @answers;
}

# The same, on one server.
sub exchange {
    my ($mode, $pause, @pieces) = @_;
    local @modes = ($mode);
    return { exchange_all($pause, @pieces) }->{$mode};
}

sub statuses { join ',', map { /^(\d+)/ ? $1 : '?' } split / \| /, $_[0] }

# ---- 6. a slow head's 408 comes when it is due --------------------------
# (servers of its own, in a process of its own, while sections 1-5 run: it
# spends its time waiting for the heads it trickles. Its servers start at
# once; the heads wait for the cut points of section 1 to be done, which
# keep the CPU busy: beside them, a client was preempted between its
# first write and its clock read, and a 408 seemed to come early)
#
# --read-timeout 1 and --min-head-rate 100: a head trickling at 50 bytes a
# second (slower than the rate) is due at 1 s after its first byte; one
# arriving at 800 bytes a second stays ahead and is served. Each head is
# sent by a client process of its own, the three slow ones and the fast
# one to each mode's server all at once (the measures are wall-clock
# times, not CPU: they do not slow each other).
my $head = "GET /slow HTTP/1.1\r\nHost: a\r\nX-Pad: " . ('p' x 1000) . "\r\n\r\n";
sub slow_head {
    my ($port) = @_;
    my $c = raw_connect($port) or die;
    my ($t0, $sent, $answer) = (undef, 0, undef);
    while ($sent < length $head) {
        syswrite($c, substr($head, $sent, 5)) or last;
        $t0 //= time;
        $sent += 5;
        my $rin = '';
        vec($rin, fileno $c, 1) = 1;
        if (select(my $r = $rin, undef, undef, 0.1)) {
            $answer = time;
            last;
        }
    }
    my $res = read_response($c, 3);
    return sprintf 'slow %s %.3f %s', ($res && $res->{status}) // 'none', ($answer // time) - $t0,
                   $res && ($res->{headers}{date} // '') =~ /^\w{3}, \d\d \w{3} \d{4} [\d:]{8} GMT$/
                   ? 'dated' : 'undated';
}
sub fast_head {
    my ($port) = @_;
    my $c = raw_connect($port) or die;
    my $t0 = time;
    for (my $sent = 0; $sent < length $head; $sent += 80) {
        syswrite($c, substr($head, $sent, 80));
        sleep 0.1;
    }
    my $res = read_response($c, 5);
    return sprintf 'fast %s %.3f', ($res && $res->{status}) // 'none', time - $t0;
}
sub timed_heads {
    my (%timed, %client);
    # (four workers: the four heads are timed at the same time)
    @timed{@modes} = spawn_servers(map { { app => $app, args => [
        '--max-workers', 4, '--read-timeout', 1, '--read-timeout-max', 3,
        '--min-head-rate', 100, ($_ eq 'no-manager' ? '--no-manager' : ()) ] } } @modes);
    # (every worker up first: heads sent while some were still starting
    # got their 408s up to 0.3 s late on a loaded machine)
    for my $s (values %timed) { wait_until(sub { worker_pids($s->pid) == 4 }, 10) }
    wait_until(sub { -e "$tmp/t24-cuts-done" }, 60);
    # (the eight clients 12.5 ms apart, not all woken at once every 0.1 s)
    my $phase = 0;
    for my $mode (@modes) {
        my $s = $timed{$mode};
        for my $kind ('slow1', 'slow2', 'slow3', 'fast') {
            my $file = "$tmp/t24-$kind-$mode";
            my $start = 0.0125 * $phase++;
            my $pid = fork // die "fork: $!";
            if (!$pid) {
                sleep $start;
                open(my $fh, '>', "$file.part") or POSIX::_exit(1);
                print $fh ($kind eq 'fast' ? fast_head($s->port) : slow_head($s->port)), "\n";
                close $fh;
                rename "$file.part", $file;
                POSIX::_exit(0);
            }
            push @{ $client{$mode} }, [ $pid, $file ];
        }
    }
    for my $mode (@modes) {
        my @lines;
        for (@{ $client{$mode} }) {
            my ($pid, $file) = @$_;
            waitpid($pid, 0);
            push @lines, -e $file ? do { open(my $fh, '<', $file) or die; map { chomp; $_ } <$fh> } : ();
        }
        my @slow = map { [ (split ' ')[1, 2, 3] ] } grep { /^slow / } @lines;
        my ($fast) = map { [ (split ' ')[1, 2] ] } grep { /^fast / } @lines;
        my @status = map { $_->[0] } @slow;
        is("@status", '408 408 408', "$mode: a head at 50 bytes/s under --min-head-rate 100: 408");
        is(join(' ', map { $_->[2] } @slow), 'dated dated dated',
           "$mode: ... with a Date (RFC 9110 6.6.1; the manager's own 408 too)");
        my @t = map { $_->[1] } @slow;
        ok(@t == 3 && !grep({ $_ < 0.95 || $_ > 1.1 } @t),
           "$mode: ... within 0.1 s of the 1 s due (@t s after the first byte)");
        is($fast && $fast->[0], 200,
           sprintf("$mode: a head at 800 bytes/s is served past --read-timeout (%s s)", $fast ? $fast->[1] : '-'));
        cmp_ok($fast ? $fast->[1] : 0, '>', 1.1, "$mode: ... which it outlasted");
    }
}

my $timed_heads = in_background(\&timed_heads);    # (section 6, above)

my $close = "Host: a\r\nConnection: close\r\n\r\n";

# Under plackup -E development, Plack::Middleware::Lint wraps the app:
# every request that reaches it must pass (a PATH_INFO not beginning with
# '/' was a 500 from Lint). (Servers of their own, in a process of its own,
# while sections 1-6 run.)
my $lint = in_background(sub { SKIP: {
    my $plackup = '/usr/bin/plackup';
    skip 'plackup is not installed', 12 unless -x $plackup;
    my $file = NarwhalTest::write_app($app);
    my %lint;
    @lint{@modes} = spawn_servers(map {
        my $mode = $_;
        my $port = free_port();
        { port => $port, command => [
            perl_cmd(), $plackup, '-s', 'Narwhal', '-E', 'development', '--host', '127.0.0.1',
            '--port', $port, '--max-workers', '1',
            ($mode eq 'no-manager' ? '--no-manager=1' : ()), $file ] }
    } @modes);
    for my $mode (@modes) {
        local $srv{$mode} = $lint{$mode};
        my %want = ("OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n" => '200',
                    "CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\n\r\n" => '501',
                    "GET * HTTP/1.1\r\n$close" => '400',
                    "GET http://h HTTP/1.1\r\n$close" => '200',
                    "GET http://h?q=1 HTTP/1.1\r\n$close" => '200',
                    "OPTIONS / HTTP/1.1\r\n$close" => '200');
        for my $req (sort keys %want) {
            (my $line = $req) =~ s/\r\n.*//s;
            is(statuses(exchange($mode, 0, $req)), $want{$req},
               "$mode, plackup -E development (Lint): $line: $want{$req}");
        }
    }
    stop_servers(values %lint);
}});

# ---- 1. one rule before the request line, whatever the cutting ----------

my @streams = (
    [ 'a bare CR before the request line', "\rGET /e HTTP/1.1\r\n$close", '400' ],
    [ 'a bare CR before XGET', "\rXGET /e HTTP/1.1\r\n$close", '400' ],
    [ 'empty lines (CRLF, LF) before the request line', "\r\n\nGET /e HTTP/1.1\r\n$close", '200' ],
    [ 'a bare CR after an empty line', "\n\r\r\nGET /e HTTP/1.1\r\n$close", '400' ],
    [ 'keep-alive, then a bare CR before the second request',
      "GET /e?first=1 HTTP/1.1\r\nHost: a\r\n\r\n\rGET /e?second=1 HTTP/1.1\r\n$close", '200,400' ],
    [ 'keep-alive, then an empty line before the second request',
      "GET /e?first=1 HTTP/1.1\r\nHost: a\r\n\r\n\r\nGET /e?second=1 HTTP/1.1\r\n$close", '200,200' ],
);

sub every_cut {
    my ($st) = @_;
    my ($name, $bytes, $want) = @$st;
    my (%seen, @wrong);
    # every cut point, a short pause (the manager's side sees the pieces
    # apart: a worker hands a partial head over at once)
    for my $cut (1 .. length($bytes) - 1) {
        my @pieces = (substr($bytes, 0, $cut), substr($bytes, $cut));
        my %got = exchange_all(0.01, @pieces);
        push @wrong, "cut $cut: manager '$got{manager}', no-manager '$got{'no-manager'}'"
            if $got{manager} ne $got{'no-manager'} || statuses($got{manager}) ne $want;
    }
    ok(!@wrong, "$name: every cut point, both modes: $want, the same answers")
        or diag join "\n", @wrong[0 .. ($#wrong < 4 ? $#wrong : 4)];
}
# (the streams in four processes at once, about 95 cuts each: the two
# long ones alone, the short ones two by two)
in_parallel(map { my @i = @$_; sub { every_cut($streams[$_]) for @i } } [4], [5], [0, 1], [2, 3]);
open(my $done, '>', "$tmp/t24-cuts-done") or die "$tmp/t24-cuts-done: $!";    # (section 6 goes on)
close $done;

# Pauses long enough for the worker to hand an idle connection to the
# manager (--keepalive-wait 0.05), at the cut points the issue named:
# after the lone CR, and between the first request and the second.
my @paced = (
    [ 'CR, pause, GET', 0.3, "\r", "GET /e HTTP/1.1\r\n$close", '400' ],
    [ 'CR, pause, XGET', 0.3, "\r", "XGET /e HTTP/1.1\r\n$close", '400' ],
    [ 'CR, pause, LF, pause, GET', 0.3, "\r", "\n", "GET /e HTTP/1.1\r\n$close", '200' ],
    [ 'first request, pause 0.1 s, CR GET', 0.1, "GET /e?first=1 HTTP/1.1\r\nHost: a\r\n\r\n",
      "\rGET /e?second=1 HTTP/1.1\r\n$close", '200,400' ],
    [ 'first request, pause 1 s, CR GET', 1, "GET /e?first=1 HTTP/1.1\r\nHost: a\r\n\r\n",
      "\rGET /e?second=1 HTTP/1.1\r\n$close", '200,400' ],
    [ 'first request, pause, CR, pause, GET', 0.3, "GET /e?first=1 HTTP/1.1\r\nHost: a\r\n\r\n",
      "\r", "GET /e?second=1 HTTP/1.1\r\n$close", '200,400' ],
    [ 'first request, pause, CRLF, pause, GET', 0.3, "GET /e?first=1 HTTP/1.1\r\nHost: a\r\n\r\n",
      "\r\n", "GET /e?second=1 HTTP/1.1\r\n$close", '200,200' ],
);
sub paced {
    my ($p) = @_;
    my ($name, $pause, @rest) = @$p;
    my $want = pop @rest;
    my %got = exchange_all($pause, @rest);
    is(statuses($got{manager}), $want, "$name: $want with the manager");
    is($got{'no-manager'}, $got{manager}, "$name: the same answers with --no-manager");
}
# (in four processes at once, as the cuts above: 1, 0.7, 0.9 and 0.9 s of
# pauses)
in_parallel(map { my @i = @$_; sub { paced($paced[$_]) for @i } } [4], [2, 3], [0, 5], [1, 6]);

# The app never ran a request whose method came after a bare CR.
for my $mode (@modes) {
    my $seen = -e $log{$mode} ? do { local (@ARGV, $/) = $log{$mode}; <> } : '';
    unlike($seen, qr/^XGET/m, "$mode: XGET after a bare CR never reached the app");
}

# ---- 2. Content-Length twice ------------------------------------------

for my $mode (@modes) {
    my $got = exchange($mode, 0, "POST /cl HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n"
                                 . "Content-Length: 5\r\n\r\nhello");
    is(statuses($got), '400', "$mode: two Content-Length: 5 lines: 400, as one '5, 5' line");
    $got = exchange($mode, 0, "POST /cl HTTP/1.1\r\nHost: a\r\nContent-Length: 5, 5\r\n\r\nhello");
    is(statuses($got), '400', "$mode: Content-Length: 5, 5: 400");
    $got = exchange($mode, 0, "POST /cl HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n"
                              . "Connection: close\r\n\r\nhello");
    like($got, qr/^200 .*cl=5 .*body=hello$/, "$mode: one Content-Length: 5: the app sees 5");
}

# ---- 3. 1xx and 204 carry no Content-Length or Transfer-Encoding ---------

sub raw_head {
    my ($mode, $req) = @_;
    my $s = raw_connect($srv{$mode}->port) or die;
    syswrite $s, $req;
    return read_until_close($s, 3);
}
for my $mode (@modes) {
    my $r = raw_head($mode, "GET /nobody HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
    like($r, qr{^HTTP/1\.1 204 }, "$mode: 204 from the app");
    unlike($r, qr/^Content-Length:/mi, "$mode: ... without the app's Content-Length");
    like($r, qr/^X-A: 1\r$/m, "$mode: ... with its other headers");
    $r = raw_head($mode, "GET /nobody-te HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
    unlike($r, qr/^(?:Transfer-Encoding|Content-Length):/mi,
           "$mode: 204 with the app's Transfer-Encoding: neither is sent");
    $r = raw_head($mode, "GET /hints HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
    my ($early) = $r =~ m{^(HTTP/1\.1 103 .*?\r\n\r\n)}s;
    ok($early && $early =~ /^Link: /m, "$mode: 103 sent");
    unlike($early // '', qr/^(?:Content-Length|Transfer-Encoding):/mi,
           "$mode: ... without the app's Content-Length or Transfer-Encoding");
    like($r, qr/\r\n\r\nhinted$/, "$mode: ... and the final response after it");
    # RFC 9110 8.6: a 304 may carry the length a 200 would have: the app's is kept
    $r = raw_head($mode, "GET /notmod HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
    like($r, qr/^Content-Length: 5\r$/mi, "$mode: 304 keeps the app's Content-Length (the 200's length)");
}

# ---- 3b. the app's Transfer-Encoding is never sent with a Content-Length --
# (RFC 9112 6.2, 6.3). Its last coding "chunked" is the server's to apply,
# on every kind of body: the app's body goes out in chunks, its own
# Content-Length is not sent and none is added, and the connection serves
# the next request. Another coding ends the body by closing. HTTP/1.0
# never gets a Transfer-Encoding (RFC 9112 6.1).

for my $mode (@modes) {
    for my $path ('/te', '/te-cl', '/te-file', '/te-getline', '/te-stream') {
        my $s = raw_connect($srv{$mode}->port) or die;
        syswrite $s, "GET $path HTTP/1.1\r\nHost: a\r\n\r\n";
        my $r = read_response($s, 3);
        my @fields = map { lc $_->[0] } @{ $r ? $r->{header_list} : [] };
        is(join(',', grep { /^(?:transfer-encoding|content-length)$/ } @fields), 'transfer-encoding',
           "$mode: $path: the app's Transfer-Encoding, once, and no Content-Length");
        is($r && $r->{headers}{'transfer-encoding'}, 'chunked', "$mode: $path: ... chunked");
        is($r && $r->{body}, 'hello world', "$mode: $path: ... and the app's body in chunks");
        syswrite $s, "GET /te HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n";
        my $next = read_response($s, 3);
        is($next && $next->{body}, 'hello world', "$mode: $path: ... then the next request is served");
    }
    my $r = raw_head($mode, "GET /te-gzip HTTP/1.1\r\nHost: a\r\n\r\n");
    like($r, qr/^Transfer-Encoding: gzip\r$/mi, "$mode: Transfer-Encoding: gzip from the app");
    unlike($r, qr/^Content-Length:/mi, "$mode: ... without a Content-Length");
    like($r, qr/^Connection: close\r\n\r\nhello world\z/mi, "$mode: ... the body ends with the connection");
    $r = raw_head($mode, "HEAD /te HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
    unlike($r, qr/^Content-Length:/mi, "$mode: HEAD: no Content-Length beside the app's Transfer-Encoding");
    like($r, qr/\r\n\r\n\z/, "$mode: HEAD: ... and no body");
    for my $path ('/te', '/te-cl', '/te-file', '/te-getline') {
        $r = raw_head($mode, "GET $path HTTP/1.0\r\n\r\n");
        unlike($r, qr/^Transfer-Encoding:/mi, "$mode: HTTP/1.0, $path: the app's Transfer-Encoding is not sent");
        like($r, qr/\r\n\r\nhello world\z/, "$mode: HTTP/1.0, $path: ... its body as it is");
    }
}

# ---- 4. Host must be host[:port] ---------------------------------------

for my $mode (@modes) {
    for my $host ('a b', 'a/b', 'a?b', 'a@b', 'a:b', '[::1', 'a%zz', "a\x80") {
        my $got = exchange($mode, 0, "GET /h HTTP/1.1\r\nHost: $host\r\nConnection: close\r\n\r\n");
        (my $shown = $host) =~ s/([^\x21-\x7e ])/sprintf '\\x%02x', ord $1/ge;
        is(statuses($got), '400', "$mode: Host: $shown: 400");
    }
    for my $host ('example.com:8080', '[::1]:5000', '127.0.0.1', 'a_b.c-d~e') {
        my $got = exchange($mode, 0, "GET /h HTTP/1.1\r\nHost: $host\r\nConnection: close\r\n\r\n");
        like($got, qr/^200 .* host=\Q$host\E /, "$mode: Host: $host: served, HTTP_HOST as sent");
    }
    my $got = exchange($mode, 0, "GET http://a<b/h HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
    is(statuses($got), '400', "$mode: an absolute-form target with an invalid host: 400");
}

# ---- 5. OPTIONS *, CONNECT, other target forms ---------------------------

for my $mode (@modes) {
    my $r = raw_head($mode, "OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n");
    like($r, qr{^HTTP/1\.1 200 OK\r\n}, "$mode: OPTIONS *: 200 from the server");
    like($r, qr/^Allow: GET, HEAD, POST, PUT, DELETE, PATCH, OPTIONS\r$/m, "$mode: ... with Allow");
    like($r, qr/^Content-Length: 0\r$/m, "$mode: ... and no body");
    is(statuses(exchange($mode, 0, "CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\n\r\n")), '501',
       "$mode: CONNECT a:443: 501");
    for my $t ('*', 'a:443', 'a', '?q') {
        is(statuses(exchange($mode, 0, "GET $t HTTP/1.1\r\n$close")), '400',
           "$mode: GET $t: 400");
    }
    like(exchange($mode, 0, "OPTIONS /x HTTP/1.1\r\n$close"), qr/^200 m=OPTIONS u=\/x p=\/x /,
         "$mode: OPTIONS /x: the app's");
    like(exchange($mode, 0, "GET http://h HTTP/1.1\r\n$close"), qr/^200 m=GET u= p= cl=- host=h /,
         "$mode: GET http://h (absolute-form, no path): the app's, PATH_INFO empty");
    my $seen = do { local (@ARGV, $/) = $log{$mode}; <> };
    unlike($seen, qr/^(?:OPTIONS \*|CONNECT|GET (?:\*|a:443|a|\?q))$/m,
           "$mode: none of those reached the app");
}

$lint->();
$timed_heads->();

done_testing;
