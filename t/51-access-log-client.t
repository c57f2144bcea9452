use strict;
use warnings;
use Test::More;
use Test2::IPC;    # (parts of this file run in processes of their own)
use lib 't/lib';
use IO::Socket::UNIX ();
use JSON::PP ();
use Time::HiRes qw(time sleep);
use NarwhalTest qw(spawn_server write_app raw_connect read_response wait_until tmpdir
                   manager_fallback run_cmd narwhal_cmd in_parallel);

# --access-log-client forwarded: behind a proxy on a unix socket (the
# nginx recipe of docs/DEPLOY.md) the client field is the address the proxy put
# last in X-Forwarded-For, not "-", so goaccess' COMBINED format takes the
# lines; a peer that is not trusted cannot choose it. The three parts
# below, each with servers or commands of its own, run at once.

my @NM = manager_fallback();
my $TMP = tmpdir();

sub slurp { open(my $fh, '<', $_[0]) or return ''; local $/; <$fh> // '' }
sub lines_when {
    my ($file, $n) = @_;
    my @l;
    wait_until(sub { @l = split /\n/, slurp($file); @l >= $n }, 5);
    return @l;
}
sub unix_get {
    my ($path, $head) = @_;
    my $c = IO::Socket::UNIX->new(Peer => $path) or return;
    syswrite($c, $head);
    return read_response($c, 5);
}
sub tcp_get {
    my ($port, $head) = @_;
    my $c = raw_connect($port);
    syswrite($c, $head);
    return read_response($c, 5);
}

my $XFF = "X-Forwarded-For: 198.51.100.1, 203.0.113.9\r\n";
# The workers' idle wait is 0.2 s here, not 1 s (NARWHAL_TEST_WORKER_WAIT):
# an idle worker writes its buffered lines that much sooner.
my %QUICK = (NARWHAL_TEST_WORKER_WAIT => 0.2);

# A proxy on a unix socket
my $part_unix = sub {
    my $sock = "$TMP/app.sock";
    my $log = "$TMP/access.log";
    my $s = spawn_server(unix => $sock, env => \%QUICK,
                         args => [ @NM, '--max-workers', 1, '--access-log', $log, '--access-log-client', 'forwarded' ]);
    is(unix_get($sock, "GET /a HTTP/1.1\r\nHost: x\r\n$XFF\r\n")->{status}, 200, 'over the unix socket, with X-Forwarded-For');
    is(unix_get($sock, "GET /b HTTP/1.1\r\nHost: x\r\n\r\n")->{status}, 200, '... without it');
    is(unix_get($sock, "GET /c HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: 10.0.0.1, not-an-address\r\n\r\n")->{status}, 200,
       '... with a last entry that is no address');
    is(tcp_get($s->port, "GET /d HTTP/1.1\r\nHost: x\r\n$XFF\r\n")->{status}, 200, 'over TCP from an untrusted peer');
    my @l = lines_when($log, 4);
    like($l[0], qr{^203\.0\.113\.9 - - \[[^\]]+\] "GET /a HTTP/1\.1" 200 }, "a unix-socket peer is trusted: the proxy's last address");
    like($l[1], qr{^- - - .*"GET /b }, 'no header: the peer, as before');
    like($l[2], qr{^- - - .*"GET /c }, 'a last entry that is no address is not taken');
    like($l[3], qr{^127\.0\.0\.1 - - .*"GET /d }, 'an untrusted TCP peer cannot choose the client field');

    SKIP: {
        skip 'goaccess is not installed (apt-get install goaccess)', 3 unless -x '/usr/bin/goaccess';
        # Only the lines with an address: goaccess refuses "-" (that is the point)
        my $good = "$TMP/good.log";
        open(my $fh, '>', $good) or die;
        print $fh "$l[0]\n$l[3]\n";
        close $fh;
        my $r = run_cmd([ 'goaccess', $good, '--log-format=COMBINED', '-o', "$TMP/report.json" ], timeout => 30);
        my $rep = eval { JSON::PP->new->decode(slurp("$TMP/report.json")) } || {};
        is($rep->{general}{valid_requests}, 2, "goaccess --log-format=COMBINED takes Narwhal's lines")
            or diag $r->{err}, explain $rep->{general};
        is($rep->{general}{failed_requests}, 0, '... and refuses none of them');
        # the line that says "-" is what it refuses
        open($fh, '>', $good) or die;
        print $fh "$l[0]\n$l[1]\n";
        close $fh;
        run_cmd([ 'goaccess', $good, '--log-format=COMBINED', '-o', "$TMP/report2.json" ], timeout => 30);
        my $rep2 = eval { JSON::PP->new->decode(slurp("$TMP/report2.json")) } || {};
        is($rep2->{general}{failed_requests}, 1, 'while a line whose client is "-" is refused');
    }
    $s->stop;
};

# --forwarded-from: a TCP proxy trusted by address
my $part_tcp = sub {
    my $log2 = "$TMP/access2.log";
    my $s2 = spawn_server(env => \%QUICK,
                          args => [ @NM, '--max-workers', 1, '--access-log', $log2,
                                    '--access-log-client', 'forwarded', '--forwarded-from', '127.0.0.0/8' ]);
    tcp_get($s2->port, "GET /e HTTP/1.1\r\nHost: x\r\n$XFF\r\n");
    my @l2 = lines_when($log2, 1);
    like($l2[0], qr{^203\.0\.113\.9 - - .*"GET /e }, '--forwarded-from 127.0.0.0/8: the proxy on loopback is trusted');
};

# bad values: one line naming the flag, a non-zero exit
my $part_bad = sub {
    for my $case ([ [ '--access-log-client', 'someone' ], qr/--access-log-client/ ],
                  [ [ '--access-log-client', 'forwarded', '--forwarded-from', '10.0.0.0/99' ], qr/--forwarded-from wants an address or CIDR/ ],
                  [ [ '--forwarded-from', '10.0.0.0/8' ], qr/--forwarded-from needs --access-log-client forwarded/ ]) {
        my $r = run_cmd([ narwhal_cmd(), @{ $case->[0] }, '--listen', '127.0.0.1:1', write_app('sub { [200, [], []] }') ],
                        timeout => 10);
        isnt($r->{code}, 0, "@{ $case->[0] }: a non-zero exit");
        my @err = split /\n/, $r->{err};
        is(scalar @err, 1, '... one line') or diag $r->{err};
        like($err[0], $case->[1], '... naming the flag');
    }
};

in_parallel($part_unix, $part_tcp, $part_bad);
done_testing();
