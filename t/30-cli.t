use strict;
use warnings;
use Test::More;
use Test2::IPC;    # (parts of this file run in processes of their own)
use lib 't/lib';
use File::Spec ();
use IO::Socket::INET ();
use NarwhalTest qw(free_port spawn_server write_app tmpdir wait_until perl_cmd
                   run_cmd http_get worker_pids pid_alive narwhal_cmd root
                   manager_built manager_fallback children_of missing in_parallel);

# The narwhal command line, plackup -s Narwhal and the handler's API, all
# with real processes. Four parts, each with processes of its own, run at
# once (below): most of their time is a process starting or stopping.

my $ROOT = root();
my @NM = manager_fallback();    # --no-manager until the manager program is built
diag 'narwhal-manager is not built: servers run with --no-manager' if @NM;
my @X = NarwhalTest::extra_args();    # NARWHAL_TEST_ARGS (spawn_server adds them itself)
my $OK_APP = write_app(<<'APP');
sub { [200, ['Content-Type' => 'text/plain'], ["pid=$$ uid=$< gid=" . ($( + 0) . "\n"]] }
APP

sub narwhal { run_cmd([ narwhal_cmd(), @NM, @X, @_ ], timeout => 10) }

sub lines { my @l = grep { length } split /\n/, $_[0]; return scalar @l }

sub refused {
    my ($port) = @_;
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port, Timeout => 2);
    return !$s;
}

# One-line failure: exactly one line on stderr, matching $re, the exit code
# given (or any non-zero), quickly, and nothing listening afterwards.
sub fails_with {
    my ($name, $args, $re, $code) = @_;
    my $port = free_port();
    my $r = narwhal('--listen', "127.0.0.1:$port", @$args);
    subtest $name => sub {
        ok(!$r->{timed_out}, 'exits on its own') or return;
        if (defined $code) { is($r->{code}, $code, "exit code $code") }
        else               { isnt($r->{code}, 0, 'non-zero exit code') }
        is(lines($r->{err}), 1, 'exactly one line on stderr') or diag $r->{err};
        like($r->{err}, $re, 'says what is wrong');
        like($r->{err}, qr/^narwhal: /, 'prefixed with narwhal:');
        cmp_ok($r->{elapsed}, '<', 5, 'fast');
        ok(refused($port), 'no server left listening');
    };
    return $r;
}

my $part_usage = sub {
    # --help / --version
    {
        my $r = narwhal('--help');
        is($r->{code}, 0, '--help exits 0');
        like($r->{out}, qr/--max-workers/, '--help mentions --max-workers');
        like($r->{out}, qr/^Usage: narwhal/m, '--help prints usage on stdout');
        is($r->{err}, '', '--help writes nothing on stderr');
        $r = narwhal('-h');
        is($r->{code}, 0, '-h exits 0');
        like($r->{out}, qr/--max-workers/, '-h prints the usage');
        $r = narwhal('--version');
        is($r->{code}, 0, '--version exits 0');
        like($r->{out}, qr/^Narwhal \d+\.\d+/, '--version prints the version');
    }

    # Bad command lines.
    fails_with('unknown option', [ '--bogus-option', $OK_APP ], qr/unknown option.*bogus-option/i, 2);
    fails_with('unknown option, no app', [ '--frobnicate' ], qr/frobnicate/, 2);
    fails_with('--max-workers=abc', [ '--max-workers=abc', $OK_APP ], qr/--max-workers.*abc/);
    fails_with('--max-workers abc', [ '--max-workers', 'abc', $OK_APP ], qr/--max-workers.*abc/);
    fails_with('--max-workers 0', [ '--max-workers', '0', $OK_APP ], qr/--max-workers/);
    fails_with('--port 99999', [ '--port', '99999', $OK_APP ], qr/port.*99999/);
    fails_with('--listen foo:bar:baz', [ '--listen', 'foo:bar:baz', $OK_APP ], qr/foo:bar:baz/);
    fails_with('--timeout -1', [ '--timeout=-1', $OK_APP ], qr/--timeout/);
    fails_with('option without its value', [ '--max-workers' ], qr/max-workers/, 2);
    fails_with('missing app file', [ File::Spec->catfile(tmpdir(), 'no-such-app.psgi') ],
               qr/no-such-app\.psgi/);
    fails_with('unsupported loader', [ '-L', 'Shotgun', $OK_APP ], qr/Shotgun/);
};

my $part_failures = sub {
    # An app that does not compile: one line naming the app, preloaded or not,
    # and the master does not keep respawning workers.
    {
        my $bad = write_app("sub { [200, [], ['x']] \n");
        my ($name) = $bad =~ m{([^/]+)$};
        for my $mode ([], ['--no-preload-app'], ['-L', 'Delayed']) {
            my $r = fails_with("app that does not compile (@$mode)", [ @$mode, $bad ],
                               qr/\Q$name\E/);
            like($r->{err}, qr/cannot load the app/, "says the app does not load (@$mode)");
            cmp_ok($r->{elapsed}, '<', 3, "exits within 3 s, no respawn loop (@$mode)");
        }
        my $notcode = write_app("1;\n");
        ($name) = $notcode =~ m{([^/]+)$};
        for my $mode ([], ['--no-preload-app']) {
            fails_with("app that returns no code ref (@$mode)", [ @$mode, $notcode ], qr/\Q$name\E/);
        }
        my $dies = write_app("die qq{app-init-failed\\n};\n");
        fails_with('app that dies while loading', [ $dies ], qr/app-init-failed/);
    }

    # Port already in use.
    {
        my $holder = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => 0,
                                           Listen => 5, ReuseAddr => 1) or die "listen: $!";
        my $port = $holder->sockport;
        my $r = run_cmd([ narwhal_cmd(), @NM, @X, '--listen', "127.0.0.1:$port", $OK_APP ], timeout => 10);
        ok(!$r->{timed_out}, 'port in use: exits');
        isnt($r->{code}, 0, 'port in use: non-zero exit');
        is(lines($r->{err}), 1, 'port in use: one line') or diag $r->{err};
        like($r->{err}, qr/\Q$port\E.*(?:in use|Address)/i, 'port in use: names the port and the reason');
        $r = run_cmd([ narwhal_cmd(), @NM, @X, '--host', '127.0.0.1', '--port', $port, $OK_APP ], timeout => 10);
        isnt($r->{code}, 0, 'port in use (--host/--port): non-zero exit');
        is(lines($r->{err}), 1, 'port in use (--host/--port): one line') or diag $r->{err};
    }

};

my $part_options = sub {
    # --opt=value and --opt value both work, and the values take effect.
    {
        # --opt=value and --opt value: [ form, workers, their name, args given the port ]
        for my $case ([ '--opt=value', 1, '--max-workers=1: one worker',
                        sub { ("--listen=127.0.0.1:$_[0]", '--max-workers=1', '--max-reqs-per-child=100',
                               '--graceful-timeout=5') } ],
                      [ '--opt value', 3, '--max-workers 3: three workers',
                        sub { ('--listen', "127.0.0.1:$_[0]", '--max-workers', '3',
                               '--max-reqs-per-child', '100') } ]) {
            my ($form, $n, $name, $args) = @$case;
            my $port = free_port();
            my $s = spawn_server(app => $OK_APP, port => $port, no_listen => 1,
                                 args => [ @NM, $args->($port) ]);
            is(http_get($port, '/')->{status}, 200, "$form: 200");
            ok(wait_until(sub { worker_pids($s->pid) == $n }, 5), $name)
                or diag 'children: ' . join(' ', worker_pids($s->pid));
            is($s->stop, 0, "$form server stops with status 0");
        }

        # Short aliases: -o HOST -p PORT, --workers.
        my $port = free_port();
        my $s = spawn_server(app => $OK_APP, port => $port, no_listen => 1,
                          args => [ @NM, '-o', '127.0.0.1', '-p', $port, '--workers', '2' ]);
        is(http_get($port, '/')->{status}, 200, '-o/-p: 200');
        ok(wait_until(sub { worker_pids($s->pid) == 2 }, 5), '--workers 2: two workers');
        $s->stop;
    }

    # plackup -s Narwhal
    SKIP: {
        my $plackup = '/usr/bin/plackup';
        missing('plackup is not installed', 7) unless -x $plackup;
        my $port = free_port();
        my $s = spawn_server(port => $port, command => [
            perl_cmd(), $plackup, '-s', 'Narwhal', '--host', '127.0.0.1', '--port', $port,
            '--max-workers', '2', (@NM ? '--manager=0' : ()), $OK_APP ]);
        my $res = http_get($port, '/');
        is($res->{status}, 200, 'plackup -s Narwhal serves');
        like($res->{content}, qr/^pid=\d+/, 'plackup -s Narwhal: the app answered');
        ok(wait_until(sub { worker_pids($s->pid) == 2 }, 5), 'plackup --max-workers 2: two workers')
            or diag 'children: ' . join(' ', worker_pids($s->pid));
        is($s->stop, 0, 'plackup server stops with status 0');

        # what plackup passes reaches the handler and is checked there, never
        # dropped (t/32-foreign-options.t has them all): --enable-ssl with no
        # certificate is refused; --no-manager=1 reaches the handler
        my $r = run_cmd([ perl_cmd(), $plackup, '-s', 'Narwhal', '--host', '127.0.0.1', '--port', free_port(),
                          '--enable-ssl', $OK_APP ], timeout => 10);
        isnt($r->{code}, 0, "plackup's --enable-ssl without a certificate: refused");
        like($r->{err}, qr/^narwhal: a TLS listener needs --tls-cert and --tls-key/, '... saying why, in one line');
        is(lines($r->{err}), 1, '... one line') or diag $r->{err};
        $port = free_port();
        $s = spawn_server(port => $port, command => [
            perl_cmd(), $plackup, '-s', 'Narwhal', '--host', '127.0.0.1', '--port', $port,
            '--max-workers', '1', '--no-manager=1', $OK_APP ]);
        is(http_get($port, '/')->{status}, 200, 'plackup --no-manager=1: serves');
        my %kinds = map { open(my $f, '<', "/proc/$_/cmdline"); ((<$f> // '') =~ /^(narwhal \w+)/)[0] // '?' => 1 }
                    children_of($s->pid);
        ok(!$kinds{'narwhal manager'}, 'plackup --no-manager=1: no manager runs');
        $s->stop;
    }

};

my $part_handler = sub {
    # Plack::Handler::Narwhal->new(...)->run($app) calls server_ready.
    {
        my $port = free_port();
        my $ready = File::Spec->catfile(tmpdir(), "ready-$port");
        my $script = <<"PERL";
use strict;
use Plack::Handler::Narwhal;
my \$app = sub { [200, ['Content-Type' => 'text/plain'], ['from handler']] };
Plack::Handler::Narwhal->new(
    port => $port, host => '127.0.0.1', max_workers => 1, manager => @{[ @NM ? 0 : 1 ]},
    server_ready => sub {
        my (\$a) = \@_;
        open(my \$fh, '>', '$ready') or die \$!;
        print \$fh join(' ', map { "\$_=\$a->{\$_}" } sort keys %\$a), "\\n";
        close \$fh;
    },
)->run(\$app);
PERL
        my $s = spawn_server(port => $port, command => [ perl_cmd(), '-e', $script ]);
        my $res = http_get($port, '/');
        is($res->{status}, 200, 'handler->run: 200');
        is($res->{content}, 'from handler', 'handler->run: the app given to run');
        ok(wait_until(sub { -s $ready }, 5), 'server_ready was called');
        my $got = do { open(my $fh, '<', $ready); local $/; <$fh> // '' };
        like($got, qr/\bport=$port\b/, 'server_ready gets the port');
        like($got, qr/\bhost=127\.0\.0\.1\b/, 'server_ready gets the host');
        is($s->stop, 0, 'handler server stops with status 0');
    }

    # --pid FILE
    {
        my $port = free_port();
        my $pidfile = File::Spec->catfile(tmpdir(), "narwhal-$port.pid");
        my $s = spawn_server(app => $OK_APP, port => $port,
                             args => [ @NM, '--max-workers', '1', '--pid', $pidfile ]);
        ok(wait_until(sub { -s $pidfile }, 5), '--pid writes the file');
        my $pid = do { open(my $fh, '<', $pidfile); local $/; <$fh> // '' };
        chomp $pid;
        is($pid, $s->pid, 'the pid file holds the master pid');
        is($s->stop, 0, 'stops with status 0');
        ok(!-e $pidfile, 'the pid file is removed on stop');
    }

    # --error-log FILE
    {
        my $port = free_port();
        my $log = File::Spec->catfile(tmpdir(), "error-$port.log");
        my $app = write_app(<<'APP');
sub {
    my $env = shift;
    die "kaboom-from-the-app\n" if $env->{PATH_INFO} eq '/die';
    $env->{'psgi.errors'}->print("note-via-psgi-errors\n") if $env->{PATH_INFO} eq '/warn';
    [200, ['Content-Type' => 'text/plain'], ['fine']];
}
APP
        my $s = spawn_server(app => $app, port => $port,
                             args => [ @NM, '--max-workers', '1', '--error-log', $log ]);
        my $res = http_get($port, '/die');
        is($res->{status}, 500, 'an app that dies: the client gets 500');
        is(http_get($port, '/warn')->{status}, 200, 'psgi.errors request: 200');
        my $text = sub { open(my $fh, '<', $log) or return ''; local $/; <$fh> // '' };
        ok(wait_until(sub { $text->() =~ /kaboom-from-the-app/ }, 5),
           '--error-log receives the app error') or diag "log: " . $text->();
        ok(wait_until(sub { $text->() =~ /note-via-psgi-errors/ }, 5),
           '--error-log receives psgi.errors');
        my ($line) = grep { /kaboom/ } split /\n/, $text->();
        like($line // '', qr{/die}, 'the error line names the request');
        unlike($s->log_text, qr/kaboom/, 'the error does not go to the original stderr');
        $s->stop;
    }

    # --user / --group (workers drop privileges)
    SKIP: {
        missing('not running as root', 4) if $> != 0;
        my ($uid) = (getpwnam('nobody'))[2];
        my $gid = getgrnam('nogroup');
        missing('no user nobody / group nogroup', 4) unless defined $uid && defined $gid;
        my $port = free_port();
        my $s = spawn_server(app => $OK_APP, port => $port,
                             args => [ @NM, '--max-workers', '1', '--user', 'nobody', '--group', 'nogroup' ]);
        my $res = http_get($port, '/');
        is($res->{status}, 200, '--user nobody: 200');
        like($res->{content}, qr/\buid=$uid\b/, "the worker runs as nobody (uid $uid)");
        like($res->{content}, qr/\bgid=$gid\b/, "the worker runs as nogroup (gid $gid)");
        my ($wpid) = $res->{content} =~ /pid=(\d+)/;
        my $groups = do { open(my $fh, '<', "/proc/$wpid/status"); local $/; my $t = <$fh> // ''; ($t =~ /^Groups:\s*(.*)$/m)[0] };
        unlike(" " . ($groups // '') . " ", qr/\s0\s/, 'the worker keeps no root supplementary group');
        $s->stop;

        my $r = run_cmd([ narwhal_cmd(), @NM, @X, '--listen', '127.0.0.1:' . free_port(), '--user',
                          'no-such-user-xyz', $OK_APP ], timeout => 10);
        isnt($r->{code}, 0, 'unknown --user: non-zero exit');
        is(lines($r->{err}), 1, 'unknown --user: one line') or diag $r->{err};
    }
};

in_parallel($part_usage, $part_failures, $part_options, $part_handler);
done_testing;
