use strict;
use warnings;
use Test::More;
use Test2::IPC;    # (parts of this file run in processes of their own)
use lib 't/lib';
use File::Path ();
use File::Spec ();
use IO::Socket::INET ();
use NarwhalTest qw(free_port spawn_server write_app tmpdir perl_cmd run_cmd narwhal_cmd
                   manager_fallback wait_until http_get raw_request missing in_parallel);

# plackup -s Narwhal as Starman's users run it: --no-preload-app and
# --preload-app=0 are refused where plackup has loaded the app already
# (and mean it with -L Delayed), a relative unix socket path is served as
# Starman serves it, and the start line is the one other Plack servers
# print ("Starman: Accepting connections at http://*:5000/"), once.

my $PLACKUP = '/usr/bin/plackup';
my @NM = manager_fallback();
my $TMP = tmpdir();
# (the app says in which process it was loaded, and which one serves)
my $APP = write_app("my \$loaded = \$\$;\nsub { [200, ['Content-Type' => 'text/plain'], [\"loaded=\$loaded pid=\$\$\\n\"]] }\n");
my @PL = (perl_cmd(), $PLACKUP, '-s', 'Narwhal', (@NM ? '--manager=0' : ()));

sub lines { scalar grep { length } split /\n/, $_[0] }

NarwhalTest::missing_all('plackup is not installed') unless -x $PLACKUP;

my $part_preload = sub {
    for my $flag ('--preload-app=0', '--no-preload-app=1') {
        my $port = free_port();
        my $r = run_cmd([ @PL, '-E', 'deployment', '--listen', "127.0.0.1:$port", $flag, $APP ], timeout => 10);
        subtest "plackup $flag: refused" => sub {
            ok(!$r->{timed_out}, 'exits on its own') or return;
            isnt($r->{code}, 0, 'non-zero exit');
            is(lines($r->{err}), 1, 'one line') or diag $r->{err};
            like($r->{err}, qr/^narwhal: --no-preload-app: plackup has loaded the app already.*-L Delayed/,
                 'says why and what does it');
            ok(!IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port, Timeout => 2),
               'nothing listens');
        };
    }
    # -L Delayed: each worker loads the app itself
    my $port = free_port();
    my $s = spawn_server(port => $port, command => [ @PL, '-E', 'deployment', '-L', 'Delayed',
        '--listen', "127.0.0.1:$port", '--no-preload-app=1', '--max-workers', 1, $APP ]);
    my $body = http_get($port, '/')->{content} // '';
    like($body, qr/^loaded=(\d+) pid=\1$/m, 'plackup -L Delayed --no-preload-app=1: the worker loaded the app');
    unlike($s->log_text, qr/ignoring|unknown/, '... and nothing was ignored');
    is($s->stop, 0, '... and it stops with status 0');
};

my $part_socket = sub {
    # --listen app.sock: a unix socket in the working directory
    for my $how ('narwhal', 'plackup') {
        my $dir = File::Spec->catdir($TMP, "cwd-$how");
        File::Path::make_path($dir);
        my $sock = File::Spec->catfile($dir, 'app.sock');
        my @cmd = $how eq 'narwhal' ? (narwhal_cmd(), @NM, '--listen', 'app.sock', $APP)
                                    : (@PL, '-E', 'deployment', '--listen', 'app.sock', $APP);
        my $s = eval { spawn_server(unix => $sock, no_listen => 1, command => \@cmd,
                                    child_setup => sub { chdir $dir or die "chdir: $!" }) };
        ok($s, "$how --listen app.sock: starts") or do { diag $@; next };
        like(raw_request($sock, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"), qr{^HTTP/1\.1 200},
             "$how --listen app.sock: serves on ./app.sock");
        is($s->stop, 0, "$how --listen app.sock: stops with status 0");
        ok(!-e $sock, "$how --listen app.sock: the socket file is removed");
    }
};

my $part_start_line = sub {
    # the start line, in deployment (plackup passes no server_ready) and
    # in development (plackup's server_ready prints it)
    for my $env ('deployment', 'development') {
        my $port = free_port();
        my $s = spawn_server(port => $port, command => [ @PL, '-E', $env, '--listen', "127.0.0.1:$port",
                                                         '--max-workers', 1, $APP ]);
        is(http_get($port, '/')->{status}, 200, "plackup -E $env: serves");
        my @said = grep { /Accepting connections/ } split /\n/, $s->log_text;
        is_deeply(\@said, [ "Narwhal: Accepting connections at http://127.0.0.1:$port/" ],
                  "plackup -E $env: one start line, as Plack servers print theirs") or diag $s->log_text;
        $s->stop;
    }
};

in_parallel($part_preload, $part_socket, $part_start_line);
done_testing;
