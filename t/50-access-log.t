use strict;
use warnings;
use Test::More;
use Test2::IPC;    # (parts of this file run in processes of their own)
use lib 't/lib';
use File::Temp ();
use JSON::PP ();
use Time::HiRes qw(time sleep);
use NarwhalTest qw(spawn_server write_app raw_connect read_response wait_until tmpdir
                   worker_pids manager_fallback missing in_parallel);

# The access log (--access-log, --access-log-format), read as a log
# reader would: the exact line layouts, hostile headers that cannot forge
# a line, lines out within a second or two while idle and when a worker
# leaves, USR1 rotation under --user, standard error, and the lines of
# requests the server answered itself or the watchdog ended.

my @NM = manager_fallback();
my $TMP = tmpdir();

my $APP = write_app(<<'APP');
use strict;
sub {
    my $env = shift;
    my $p = $env->{PATH_INFO};
    return [204, [], []] if $p eq '/empty';
    return [200, ['X-Request-Id' => 'req-42'], ["with id\n"]] if $p eq '/id';
    if ($p eq '/sleep') { sleep 10; return [200, [], ["late\n"]] }
    [200, ['Content-Type' => 'text/plain'], ["hello\n"]];
}
APP

# The workers' idle wait is 0.2 s here, not 1 s (NARWHAL_TEST_WORKER_WAIT):
# an idle worker writes its buffered lines that much sooner.
sub server { spawn_server(app => $APP, env => { NARWHAL_TEST_WORKER_WAIT => 0.2 }, args => [ @NM, @_ ]) }

sub request {
    my ($port, $head) = @_;
    my $c = raw_connect($port);
    syswrite($c, $head);
    return read_response($c, 10);
}

sub slurp { open(my $f, '<', $_[0]) or return ''; local $/; <$f> // '' }

sub lines_when {
    my ($file, $n) = @_;
    my @l;
    wait_until(sub { @l = split /\n/, slurp($file); @l >= $n }, 5);
    return @l;
}

# Each part below has a server of its own; they run at once, in four
# processes (at the end).

# 1. Combined: the layout, field by field.
my $part_combined = sub {
    my $log = "$TMP/combined.log";
    my $s = server('--max-workers', 1, '--access-log', $log);
    my $port = $s->port;
    wait_until(sub { worker_pids($s->pid) == 1 }, 10);
    my ($w) = worker_pids($s->pid);
    request($port, "GET /a?b=1 HTTP/1.1\r\nHost: x\r\nReferer: http://ref.example/\r\nUser-Agent: test-agent/1.0\r\n\r\n");
    request($port, "GET /empty HTTP/1.0\r\n\r\n");
    request($port, "GET /q HTTP/1.1\r\nHost: x\r\nUser-Agent: evil \"quoted\" \\back \xc3\xa9 \t end\r\n\r\n");
    request($port, "BROKEN\r\n\r\n");
    # a bad request after a good one on the same connection: nothing of the
    # first may show up in the second's line
    my $ka = raw_connect($port);
    syswrite($ka, "GET /first-on-conn HTTP/1.1\r\nHost: x\r\n\r\n");
    read_response($ka, 5);
    syswrite($ka, "BROKEN AGAIN\r\n\r\n");
    NarwhalTest::read_until_close($ka, 5);
    close $ka;    # (the worker lingers for our close, 0.5 s at most, before it goes idle)
    my @l = lines_when($log, 6);
    is(scalar @l, 6, 'six requests, six lines');
    like($l[5], qr{^127\.0\.0\.1 - - \[[^]]+\] "-" 400 }, 'a bad request after a good one on one connection logs "-", not the earlier request line');
    like($l[0], qr{^127\.0\.0\.1 - - \[\d\d/[A-Z][a-z]{2}/\d{4}:\d\d:\d\d:\d\d [+-]\d{4}\] "GET /a\?b=1 HTTP/1\.1" 200 6 "http://ref\.example/" "test-agent/1\.0" (\d+) (\d+)$},
         'host, time, request line, status, bytes, referer, agent, duration, pid');
    my ($us, $pid) = $l[0] =~ / (\d+) (\d+)$/;
    ok($us > 0 && $us < 5e6, "the duration is in microseconds ($us)");
    is($pid, $w, 'the pid is the worker\'s');
    like($l[1], qr{"GET /empty HTTP/1\.0" 204 - "-" "-" \d+ \d+$}, 'no body: bytes "-", no referer or agent: "-"');
    like($l[2], qr{"evil \\"quoted\\" \\\\back \\xc3\\xa9 \\x09 end"}, 'quotes, backslashes and other bytes are escaped');
    is(scalar(() = $l[2] =~ /(?<!\\)"/g), 6, '... so the line keeps its six quotes');
    like($l[3], qr{^127\.0\.0\.1 - - \[[^]]+\] "-" 400 - "-" "-" 0 \d+$}, 'a request the server refused: 400, request "-"');
};

# 2. JSON: one object per line, every byte kept, the app's request id.
my $part_json = sub {
    my $log = "$TMP/json.log";
    my $s = server('--max-workers', 1, '--access-log', $log, '--access-log-format', 'json');
    my $port = $s->port;
    request($port, "GET /id HTTP/1.1\r\nHost: x\r\nUser-Agent: a\tb\xffc\"d\\e\r\n\r\n");
    request($port, "GET /x HTTP/1.1\r\nHost: x\r\n\r\n");
    my @l = lines_when($log, 2);
    my @j = map { eval { JSON::PP->new->decode($_) } } @l;
    is(scalar(grep { ref } @j), 2, 'every line is a JSON object');
    is($j[0]{request_id}, 'req-42', 'the X-Request-Id the app set');
    is($j[0]{user_agent}, "a\tb\xffc\"d\\e", 'tabs, high bytes, quotes and backslashes come back as they were sent');
    is($j[0]{status}, 200, 'status');
    is($j[0]{bytes}, 8, 'bytes');
    is($j[0]{method}, 'GET', 'method');
    is($j[0]{target}, '/id', 'target');
    is($j[0]{protocol}, 'HTTP/1.1', 'protocol');
    like($j[0]{time}, qr/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d$/, 'an ISO 8601 time');
    ok(!exists $j[1]{request_id}, 'no request id when the app set none');
    ok(!exists $j[1]{referer}, 'no referer when none was sent');
    like($j[1]{duration_us}, qr/^\d+$/, 'duration_us');
    # valid UTF-8 is written as UTF-8 (it was "caf\u00c3\u00a9": two
    # characters for one), an invalid byte escaped (control characters:
    # t/c/test_accesslog.c; the parser refuses them in a header)
    request($port, "GET /u HTTP/1.1\r\nHost: x\r\nUser-Agent: caf\xc3\xa9 \xe2\x82\xac\r\nReferer: /\xc3(\r\n\r\n");
    my ($u) = grep { m{"/u"} } lines_when($log, 3);
    like($u, qr/"user_agent":"caf\xc3\xa9 \xe2\x82\xac"/, 'valid UTF-8 is in the line as it came');
    like($u, qr/"referer":"\/\\u00c3\("/, 'an invalid byte is escaped');
    my $ju = eval { JSON::PP->new->utf8->decode($u) } || {};
    is($ju->{user_agent}, "caf\x{e9} \x{20ac}", 'a UTF-8 JSON reader gets the characters that were sent');
};

# 3. When lines go out: within a couple of seconds on an idle worker; at
# once when the worker leaves; standard error with "-"; the watchdog's 504
# (after half a second: the master looks every 50 ms here).
my $part_timing = sub {
    my $log = "$TMP/timing.log";
    my $s = server('--max-workers', 1, '--access-log', $log, '--request-timeout', 0.5);
    my $port = $s->port;
    request($port, "GET /one HTTP/1.1\r\nHost: x\r\n\r\n");
    my $t0 = time;
    ok(wait_until(sub { slurp($log) =~ m{/one} }, 5), 'an idle worker writes its buffered line');
    ok(time - $t0 < 2.5, sprintf('... within the flush interval and an idle wait (%.1f s)', time - $t0));
    my $r = request($port, "GET /sleep HTTP/1.1\r\nHost: x\r\n\r\n");
    is($r->{status}, 504, 'the watchdog answers 504');
    ok(wait_until(sub { slurp($log) =~ m{"GET /sleep HTTP/1\.1" 504 } }, 5), '... and the line says 504');
};
my $part_recycle = sub {
    my $log = "$TMP/recycle.log";
    my $s = server('--max-workers', 1, '--max-requests', 1, '--min-worker-lifetime', 0, '--access-log', $log);
    request($s->port, "GET /last HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    ok(wait_until(sub { slurp($log) =~ m{/last} }, 3), 'a recycled worker writes its lines before it goes');
};
my $part_stderr = sub {
    my $s = server('--max-workers', 1, '--access-log', '-');
    request($s->port, "GET /to-stderr HTTP/1.1\r\nHost: x\r\n\r\n");
    ok(wait_until(sub { $s->log_text =~ m{"GET /to-stderr HTTP/1\.1" 200 6 } }, 5), '"-" writes to standard error');
};

# 4. Rotation: USR1 after the file was moved; under --user when root.
my $part_rotation = sub { SKIP: {
    missing('rotation under --user needs root', 7) if $>;
    my $dir = File::Temp::tempdir('narwhal-alog-XXXXXX', TMPDIR => 1, CLEANUP => 1);
    chmod 0755, $dir;
    my $log = "$dir/access.log";
    my $s = server('--max-workers', 2, '--access-log', $log, '--user', 'nobody');
    my $port = $s->port;
    request($port, "GET /before HTTP/1.1\r\nHost: x\r\n\r\n");
    ok(wait_until(sub { slurp($log) =~ m{/before} }, 5), 'a worker running as nobody writes the log');
    rename $log, "$log.1" or die "rename: $!";
    kill USR1 => $s->pid;
    # (the master says so once it has made the file and given it away;
    # the file alone may be there a moment before it is the workers')
    wait_until(sub { $s->log_text =~ /USR1: reopened the logs/ }, 5);
    ok(-e $log, 'USR1: the master makes a new file');
    is((stat $log)[4], scalar getpwnam('nobody'), '... owned by the workers\' user');
    # the workers reopen it between requests, told by the master after it
    # made the file: wait until each has it open, and not the old one
    ok(wait_until(sub {
        my @w = worker_pids($s->pid);
        @w == 2 && !grep { my %to = map { (readlink($_) // '') => 1 } glob "/proc/$_/fd/*";
                          !$to{$log} || $to{"$log.1"} } @w }, 5), '... and the workers open it');
    request($port, "GET /after HTTP/1.1\r\nHost: x\r\n\r\n") for 1 .. 4;
    ok(wait_until(sub { slurp($log) =~ m{/after} }, 5), 'new lines go to the new file');
    unlike(slurp("$log.1"), qr{/after}, 'the old file keeps only the old lines');
    like(slurp("$log.1"), qr{/before}, '... which it keeps');
}};

# 5. A body that makes the connection's buffer grow: the request line and
# headers are read at the end of the request, after the body moved the
# bytes they were parsed from. They used to be read from the freed block
# (a chunked upload logged heap bytes as its request line).
my $part_bodies = sub {
    my $log = "$TMP/bodies.log";
    my $s = server('--max-workers', 1, '--access-log', $log);
    my $body = 'b' x 700_000;
    my @chunks = map { sprintf("%x\r\n%s\r\n", length $_, $_) } unpack('(a65536)*', $body);
    my $r1 = request($s->port, "POST /chunked-up?x=1 HTTP/1.1\r\nHost: x\r\nUser-Agent: agent-c\r\n"
                               . "Referer: http://r.example/\r\nTransfer-Encoding: chunked\r\n\r\n"
                               . join('', @chunks) . "0\r\n\r\n");
    my $r2 = request($s->port, "POST /length-up HTTP/1.1\r\nHost: x\r\nUser-Agent: agent-l\r\n"
                               . "Content-Length: " . length($body) . "\r\n\r\n$body");
    is(($r1 && $r1->{status}) . ' ' . ($r2 && $r2->{status}), '200 200', 'both uploads answered');
    my @l = lines_when($log, 2);
    like($l[0], qr{"POST /chunked-up\?x=1 HTTP/1\.1" 200 6 "http://r\.example/" "agent-c" \d+ \d+$},
         'chunked upload: its own request line, referer and agent');
    like($l[1], qr{"POST /length-up HTTP/1\.1" 200 6 "-" "agent-l" \d+ \d+$},
         'Content-Length upload: its own request line and agent');
};

in_parallel(
    sub { $part_timing->() },
    sub { $part_combined->(); $part_json->() },
    sub { $part_rotation->(); $part_recycle->() },
    sub { $part_stderr->(); $part_bodies->() },
);

done_testing();
