use strict;
use warnings;
use Test::More;
use Test2::IPC;    # (parts of this file run in processes of their own)
use lib 't/lib';
use File::Spec ();
use IO::Socket::INET ();
use NarwhalTest qw(free_port spawn_server write_app tmpdir perl_cmd run_cmd narwhal_cmd
                   worker_pids manager_fallback wait_until raw_request missing in_parallel);

# Starman's and Starlet's options (starman(1), "OPTIONS", with what
# Starman::Server reads beside them; Starlet's "COMMAND LINE OPTIONS"),
# each as its users write it, under the narwhal command and under
# plackup -s Narwhal: it means what it means there (the option Narwhal
# takes it as, with that value; the server starts and serves, and where a
# request can see the effect, it is seen), or it is refused in one line
# with a non-zero exit and nothing left listening. Never accepted and
# ignored. docs/OPTIONS.md, "Coming from Starman or Starlet" (the README
# has its summary).

my $PLACKUP = '/usr/bin/plackup';
my @NM = manager_fallback();
my $TMP = tmpdir();
my $APP = write_app("sub { [200, ['Content-Type' => 'text/plain'], [\"pid=\$\$\\n\"]] }\n");
# TLS: Starman's forms mean Narwhal's (t/29-https.t serves them); what
# they lack or what Narwhal's TLS does not take is refused.
system("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout $TMP/k.pem "
       . "-out $TMP/c.pem -days 2 -subj /CN=localhost >/dev/null 2>&1") == 0
    or diag 'openssl could not make a certificate: the TLS rows fail';
my $NEEDS_PAIR = qr/a TLS listener needs --tls-cert and --tls-key/;
my $NO_TLS_LISTENER = qr/--tls-cert and --tls-key are for TLS listeners/;
my $TLS_ONLY = qr/takes a certificate chain and its key/;
my $BAD_PAIR = @NM ? qr/TLS listeners need the connection manager/ : qr/TLS: .*nocert\.pem/;

# [ what, narwhal's argv, plackup's argv (undef: as narwhal's), expect ]
# expect: { option => value, ... } (accepted: what Narwhal takes it as),
# or a regex (refused: the one line says so). Args may hold PORT, TMP.
my @TABLE = (
    # Starman
    [ 'Starman --listen HOST:PORT', [ '--listen', '127.0.0.1:PORT' ], undef, { listen => ['127.0.0.1:PORT'] } ],
    [ 'Starman --listen HOST:PORT:ssl', [ '--listen', '127.0.0.1:PORT:ssl', '--ssl-cert', 'TMP/c.pem',
      '--ssl-key', 'TMP/k.pem' ], undef,
      { listen => ['127.0.0.1:PORT:ssl'], tls_cert => 'TMP/c.pem', tls_key => 'TMP/k.pem' }, 'no_spawn' ],
    [ 'Starman --listen HOST:PORT:ssl, no certificate', [ '--listen', '127.0.0.1:PORT:ssl' ], undef, $NEEDS_PAIR ],
    [ 'Starman --listen HOST:PORT:ssl, a missing certificate', [ '--listen', '127.0.0.1:PORT:ssl',
      '--ssl-cert', 'TMP/nocert.pem', '--ssl-key', 'TMP/nocert.pem' ], undef, $BAD_PAIR ],
    [ 'Starman --listen HOST:PORT:ssl --no-manager', [ '--listen', '127.0.0.1:PORT:ssl', '--ssl-cert', 'TMP/c.pem',
      '--ssl-key', 'TMP/k.pem', '--no-manager' ], [ '--listen', '127.0.0.1:PORT:ssl', '--ssl-cert', 'TMP/c.pem',
      '--ssl-key', 'TMP/k.pem', '--no-manager=1' ], qr/TLS listeners need the connection manager/ ],
    [ 'Starman --host --port', [ '--host', '127.0.0.1', '--port', 'PORT' ], undef, { host => '127.0.0.1', port => 'PORT' } ],
    [ 'Starman --workers', [ '--workers', 2 ], undef, { max_workers => 2 }, 'workers' ],
    [ 'Starman --backlog', [ '--backlog', 64 ], undef, { backlog => 64 } ],
    [ 'Starman --max-requests', [ '--max-requests', 50 ], undef,
      { max_reqs_per_child => 50, min_worker_lifetime => 0 } ],
    [ 'Starman --preload-app', [ '--preload-app' ], [ '--preload-app=1' ], { preload_app => 1 } ],
    [ 'Starman --disable-keepalive', [ '--disable-keepalive' ], undef, { disable_keepalive => 1 }, 'close' ],
    [ 'Starman --keepalive-timeout', [ '--keepalive-timeout', 3 ], undef, { keepalive_timeout => 3 } ],
    [ 'Starman --read-timeout', [ '--read-timeout', 7 ], undef, { read_timeout => 7 } ],
    [ 'Starman --pid', [ '--pid', 'TMP/PORT.pid' ], undef, { pid => 'TMP/PORT.pid' }, 'pid' ],
    [ 'Starman --error-log', [ '--error-log', 'TMP/PORT.log' ], undef, { error_log => 'TMP/PORT.log' }, 'error_log' ],
    [ 'Starman --enable-ssl', [ '--enable-ssl', '--ssl-cert', 'TMP/c.pem', '--ssl-key', 'TMP/k.pem' ], undef,
      { enable_ssl => 1, tls_cert => 'TMP/c.pem', tls_key => 'TMP/k.pem' }, 'no_spawn' ],
    [ 'Starman --enable-ssl, no certificate', [ '--enable-ssl' ], undef, $NEEDS_PAIR ],
    [ 'Starman --ssl-cert, no TLS listener', [ '--ssl-cert', 'TMP/c.pem' ], undef, $NO_TLS_LISTENER ],
    [ 'Starman --ssl-key, no TLS listener', [ '--ssl-key', 'TMP/k.pem' ], undef, $NO_TLS_LISTENER ],
    [ 'Starman --ssl-ca (Net::Server)', [ '--ssl-ca', 'TMP/ca.pem' ], undef, $TLS_ONLY ],
    [ 'Starman --disable-proctitle', [ '--disable-proctitle' ], undef, qr/--disable-proctitle: Narwhal always names/ ],
    [ 'Starman --min-servers (Starman::Server)', [ '--min-servers', 2 ], undef, qr/unknown option.*min-servers/ ],
    [ 'Starman --max-servers (Starman::Server)', [ '--max-servers', 2 ], undef, qr/unknown option.*max-servers/ ],
    [ 'Starman --min-spare-servers', [ '--min-spare-servers', 1 ], undef, qr/unknown option.*min-spare-servers/ ],
    [ 'Starman --max-spare-servers', [ '--max-spare-servers', 1 ], undef, qr/unknown option.*max-spare-servers/ ],
    [ 'Starman --net-server-*', [ '--net-server-log-level', 4 ], undef, qr/not built on Net::Server/ ],
    [ 'Starman -D', [ '-D' ], undef, { daemonize => 1 }, 'no_spawn' ],   # (t/33-daemonize.t runs it)
    # Starlet
    [ 'Starlet --max-workers', [ '--max-workers', 2 ], undef, { max_workers => 2 }, 'workers' ],
    [ 'Starlet --timeout', [ '--timeout', 30 ], undef, { timeout => 30 } ],
    [ 'Starlet --keepalive-timeout', [ '--keepalive-timeout', 2 ], undef, { keepalive_timeout => 2 } ],
    [ 'Starlet --max-keepalive-reqs 1', [ '--max-keepalive-reqs', 1 ], undef, { max_keepalive_reqs => 1 }, 'close' ],
    [ 'Starlet --max-reqs-per-child', [ '--max-reqs-per-child', 100 ], undef,
      { max_reqs_per_child => 100, min_worker_lifetime => 0 } ],
    [ 'Starlet --min-reqs-per-child', [ '--max-reqs-per-child', 100, '--min-reqs-per-child', 50 ], undef,
      { min_reqs_per_child => 50, max_reqs_per_child => 100 } ],
    [ 'Starlet --spawn-interval', [ '--spawn-interval', 1 ], undef, { spawn_interval => 1 } ],
    [ 'Starlet --child-exit', [ '--child-exit', 'sub { 1 }' ], undef, { child_exit => 'CODE' } ],
    [ 'Starlet --err-respawn-interval', [ '--err-respawn-interval', 1 ], undef, qr/unknown option.*err-respawn-interval/ ],
);

sub subst {
    my ($port, @args) = @_;
    return map { my $a = $_; $a =~ s/PORT/$port/g; $a =~ s/TMP/$TMP/g; $a } @args;
}

# What plackup hands the handler for these arguments, as Narwhal takes it.
sub as_plackup_passes {
    my (@argv) = @_;
    require Plack::Runner;
    my $r = Plack::Runner->new;
    $r->parse_options(@argv);
    return eval { Plack::Handler::Narwhal->new(@{ $r->{options} })->{options} } // $@;
}

sub lines { scalar grep { length } split /\n/, $_[0] }

sub refused_port {
    my ($port) = @_;
    return !IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port, Timeout => 2);
}

sub check_row {
    my ($row) = @_;
    my ($what, $nargs, $pargs, $expect, $probe) = @$row;
    $pargs //= $nargs;
    my $port = free_port();
    my @n = subst($port, @$nargs);
    my @p = subst($port, @$pargs);
    my $has_listen = grep { /^--(?:listen|host|port)$/ } @n;
    my @nlisten = $has_listen ? () : ('--listen', "127.0.0.1:$port");
    my @plisten = $has_listen ? () : ('--listen', "127.0.0.1:$port");
    my %run = (
        narwhal => [ narwhal_cmd(), @NM, @nlisten, @n, $APP ],
        plackup => [ perl_cmd(), $PLACKUP, '-s', 'Narwhal', '-E', 'deployment',
                     (@NM ? '--manager=0' : ()), @plisten, @p, $APP ],
    );
    if (ref $expect eq 'Regexp') {
        for my $how (qw(narwhal plackup)) {
            my $r = run_cmd($run{$how}, timeout => 10);
            subtest "$what under $how: refused" => sub {
                ok(!$r->{timed_out}, 'exits on its own') or return;
                isnt($r->{code}, 0, 'non-zero exit');
                is(lines($r->{err}), 1, 'one line') or diag $r->{err};
                like($r->{err}, $expect, 'says why');
                like($r->{err}, qr/^narwhal: /, 'as narwhal');
                ok(refused_port($port), 'nothing listens');
            };
        }
        return;
    }
    # accepted: the meaning, from what plackup passes
    my $o = as_plackup_passes('-s', 'Narwhal', @plisten, @p);
    subtest "$what: plackup's arguments mean it" => sub {
        ok(ref $o eq 'HASH', 'Narwhal takes them') or return diag $o;
        for my $k (sort keys %$expect) {
            my $want = $expect->{$k};
            $want = [ subst($port, @$want) ] if ref $want eq 'ARRAY';
            ($want) = subst($port, $want) unless ref $want;
            if ($want eq 'CODE') { is(ref $o->{$k}, 'CODE', "$k is code") }
            elsif (ref $want)    { is_deeply($o->{$k}, $want, "$k") }
            else                 { is($o->{$k}, $want, "$k => $want") }
        }
    };
    return if ($probe // '') eq 'no_spawn';
    for my $how (qw(narwhal plackup)) {
        my $s = eval { spawn_server(port => $port, command => $run{$how}) };
        ok($s, "$what under $how: the server starts") or do { diag $@; next };
        like(raw_request($port, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
             qr{^HTTP/1\.1 200}, "$what under $how: serves");
        if (($probe // '') eq 'workers') {
            ok(wait_until(sub { worker_pids($s->pid) == 2 }, 5), "$what under $how: 2 workers");
        } elsif (($probe // '') eq 'close') {
            my $s2 = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port, Timeout => 5);
            syswrite($s2, "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
            like(NarwhalTest::read_until_close($s2, 5), qr/\r\nConnection: close\r\n/i,
                 "$what under $how: the connection closes after its response");
        } elsif (($probe // '') eq 'pid') {
            my ($file) = subst($port, 'TMP/PORT.pid');
            ok(wait_until(sub { -s $file }, 5), "$what under $how: the pid file is written");
            is(do { open(my $f, '<', $file); my $l = <$f> // ''; chomp $l; $l }, $s->pid,
               "$what under $how: with the master's pid");
        } elsif (($probe // '') eq 'error_log') {
            my ($file) = subst($port, 'TMP/PORT.log');
            ok(wait_until(sub { -s $file && do { open(my $f, '<', $file); local $/; <$f> =~ /listening on/ } }, 5),
               "$what under $how: the log goes to the file");
            unlink $file;
        }
        is($s->stop, 0, "$what under $how: stops with status 0");
    }
}

SKIP: {
    missing('plackup is not installed', 1) unless -x $PLACKUP;
    require Plack::Handler::Narwhal;
    my @rows = @TABLE;
    push @rows, [ 'Starman --group', [ '--user', 'nobody', '--group', 'nogroup' ], undef,
                  { user => 'nobody', group => 'nogroup' } ] if $> == 0 && getpwnam('nobody') && getgrnam('nogroup');
    my @parts = map { my $i = $_; [ @rows[ grep { $_ % 4 == $i } 0 .. $#rows ] ] } 0 .. 3;
    in_parallel(map { my $part = $_; sub { check_row($_) for @$part } } @parts);
}

done_testing;
