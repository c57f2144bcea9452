use strict;
use warnings;
use Test::More;
use Test2::IPC;    # (parts of this file run in processes of their own)
use lib 't/lib';
use IO::Socket::INET ();
use NarwhalTest qw(spawn_server write_app raw_connect read_until_close wait_until tmpdir
                   manager_fallback free_port worker_pids http_get in_parallel);

# PROXY mistakes said out loud: a connection refused under
# --proxy-protocol (no valid header; a peer outside --proxy-from) is
# counted in narwhal_proxy_rejected_total{reason} and logged with its
# peer, the first at once and the rest summed up per 10 s; and
# --proxy-protocol without --proxy-from warns at start.

my @NM = manager_fallback();
my $MANAGED = NarwhalTest::managed();
my $TMP = tmpdir();

sub slurp { open(my $fh, '<', $_[0]) or return ''; local $/; <$fh> // '' }
sub metric {
    my ($sport, $name) = @_;
    my $r = http_get("http://127.0.0.1:$sport", '/metrics');
    return undef unless $r->{status} == 200;
    return $r->{content} =~ /^\Q$name\E (\S+)$/m ? $1 : undef;
}
my $LOGLINE = qr/\S+Z narwhal\[\d+\] master warn: /;

# the master's log interval for refused PROXY connections (10 s), shortened:
# the four refusals below must fit in it, with room to spare on a loaded box
my $EVERY = 1.5;

my $part_bad_headers = sub { subtest 'bad headers, no --proxy-from' => sub {
    my $log = "$TMP/open.log";
    my $sport = free_port();
    my $s = spawn_server(env => { NARWHAL_TEST_PROXY_LOG_EVERY => $EVERY },
                         args => [ @NM, '--proxy-protocol', '--max-workers', 2, '--error-log', $log,
                                   ($MANAGED ? ('--status-listen', "127.0.0.1:$sport") : ()) ],
                         ready => sub { slurp($log) =~ /listening on/ && worker_pids($_[0]->pid) == 2 });
    ok(wait_until(sub { slurp($log) =~ /without --proxy-from/ }, 5), 'a warning at start');
    like(slurp($log), qr/^${LOGLINE}--proxy-protocol without --proxy-from: any client that can reach 127\.0\.0\.1:\d+ can send its own PROXY header and so choose the REMOTE_ADDR/m,
         'the start warns that any client can set REMOTE_ADDR');
    # A client that does not speak PROXY (a forgotten send-proxy-v2)
    my $c = raw_connect($s->port);
    my $first = $c->sockport;
    syswrite($c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    is(read_until_close($c, 5), '', 'a request without a PROXY header is closed unanswered');
    ok(wait_until(sub { slurp($log) =~ /refused a connection/ }, 5), 'and logged') or diag slurp($log);
    like(slurp($log), qr/^${LOGLINE}refused a connection from 127\.0\.0\.1:$first: no valid PROXY header/m,
         '... one warn line with the peer address and port');
    is(metric($sport, 'narwhal_proxy_rejected_total{reason="bad_header"}'), 1, 'counted: bad_header 1')
        if $MANAGED;
    # more within the interval: counted at once, logged as one sum later
    for (1 .. 4) {
        my $c = raw_connect($s->port);
        syswrite($c, "PROXY TCP4 garbage\r\n");
        read_until_close($c, 5);
    }
    ok(wait_until(sub { (metric($sport, 'narwhal_proxy_rejected_total{reason="bad_header"}') // 0) == 5 }, 5),
       'counted: bad_header 5') if $MANAGED;
    is(metric($sport, 'narwhal_proxy_rejected_total{reason="not_allowed"}'), 0, 'not_allowed 0') if $MANAGED;
    ok(wait_until(sub { slurp($log) =~ /refused 4 more connection\(s\) under --proxy-protocol in the last \Q$EVERY\E s \(the last from 127\.0\.0\.1:\d+: no valid PROXY header/ }, $EVERY + 5),
       'they are summed up in one line when the interval is over') or diag slurp($log);
    # (the whole interval is in the log by now: nothing but the sum came after the first)
    my @lines = slurp($log) =~ /(refused .*)/g;
    is(scalar @lines, 2, 'the next four are not one line each') or diag explain \@lines;
    # the lines' own times (ms): not the test's, which may have been slow to look
    my ($t_first, $t_sum) = map { /^\S+T(\d\d):(\d\d):(\d\d\.\d+)Z .*refused/ ? ($1 * 60 + $2) * 60 + $3 : () }
                        split /\n/, slurp($log);
    $t_sum += 86400 if defined $t_sum && $t_sum < $t_first;    # (midnight between them)
    cmp_ok($t_sum - $t_first, '>=', $EVERY - 0.01, '... not before') or diag slurp($log);
    $s->stop;
} };

my $part_outside = sub { subtest 'a peer outside --proxy-from' => sub {
    my $log = "$TMP/from.log";
    my $sport = free_port();
    my $s = spawn_server(args => [ @NM, '--proxy-protocol', '--proxy-from', '10.0.0.0/8', '--max-workers', 1,
                                   '--error-log', $log, ($MANAGED ? ('--status-listen', "127.0.0.1:$sport") : ()) ],
                         ready => sub { slurp($log) =~ /listening on/ && worker_pids($_[0]->pid) == 1 });
    unlike(slurp($log), qr/without --proxy-from/, 'no warning with --proxy-from');
    my $c = raw_connect($s->port);
    my $port = $c->sockport;
    syswrite($c, "PROXY TCP4 203.0.113.7 10.0.0.1 51234 80\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n");
    is(read_until_close($c, 5), '', 'closed unanswered');
    ok(wait_until(sub { slurp($log) =~ /^${LOGLINE}refused a connection from 127\.0\.0\.1:(\d+): its address is not in --proxy-from/m }, 5),
       'logged with the peer') or diag slurp($log);
    ok(wait_until(sub { (metric($sport, 'narwhal_proxy_rejected_total{reason="not_allowed"}') // -1) == 1 }, 5),
       'counted: not_allowed 1') if $MANAGED;
    $s->stop;
} };

# Both at once: the first waits out the master's log interval.
in_parallel($part_bad_headers, $part_outside);
done_testing();
