use strict;
use warnings;
use Test::More;
use Test2::IPC;    # (parts of this file run in processes of their own)
use lib 't/lib';
use File::Spec ();
use IO::Socket::INET ();
use POSIX ();
use Time::HiRes ();
use NarwhalTest qw(free_port write_app tmpdir perl_cmd narwhal_cmd manager_fallback wait_until
                   http_get pid_alive missing in_parallel children_of);

# --daemonize (-D), under narwhal and plackup -s Narwhal, as an init
# script meets it: the command returns 0 once the server listens, its
# stdout and stderr pipes closed (a $(...) around it returns; no process
# of the server holds them), the server in a session of its own with
# stdin, stdout and stderr on /dev/null, --pid naming it; a server that
# cannot start makes the command say why in one line and fail.

my $PLACKUP = '/usr/bin/plackup';
my @NM = manager_fallback();
my $TMP = tmpdir();
my $APP = write_app("sub { [200, ['Content-Type' => 'text/plain'], [\"pid=\$\$\\n\"]] }\n");

# Runs @cmd with stdout and stderr on one pipe, as $(cmd 2>&1) does, and
# reads the pipe to its end: returns once every process holding the pipe
# has let it go (or after $timeout). { out, code, elapsed, eof }.
sub run_piped {
    my ($cmd, $timeout) = @_;
    pipe(my $r, my $w) or die "pipe: $!";
    my $start = Time::HiRes::time();
    my $pid = fork // die "fork: $!";
    if (!$pid) {
        close $r;
        open STDIN, '<', '/dev/null';
        open STDOUT, '>&', $w;
        open STDERR, '>&', $w;
        exec @$cmd or POSIX::_exit(127);
    }
    close $w;
    my ($out, $eof) = ('', 0);
    my $rin = '';
    vec($rin, fileno $r, 1) = 1;
    while ((my $left = $start + $timeout - Time::HiRes::time()) > 0) {
        last unless select(my $rout = $rin, undef, undef, $left) > 0;
        my $n = sysread($r, my $buf, 4096);
        if (!$n) { $eof = 1; last }
        $out .= $buf;
    }
    my $elapsed = Time::HiRes::time() - $start;
    my $code;
    if (wait_until(sub { waitpid($pid, POSIX::WNOHANG()) == $pid }, 5)) { $code = $? >> 8 }
    else { kill KILL => $pid; waitpid($pid, 0) }
    return { out => $out, code => $code, elapsed => $elapsed, eof => $eof };
}

sub slurp { open(my $f, '<', $_[0]) or return ''; local $/; return <$f> // '' }

sub session_of { (split ' ', (slurp("/proc/$_[0]/stat") =~ /\)\s+(.*)/)[0] // '')[3] }

sub daemon_case {
    my ($how, $cmd_of) = @_;
    my $port = free_port();
    my $pidfile = File::Spec->catfile($TMP, "$how-$port.pid");
    my $r = run_piped($cmd_of->($port, '--pid', $pidfile), 20);
    my $pid = do { my $t = slurp($pidfile); chomp $t; $t };
    subtest "$how -D" => sub {
        ok($r->{eof}, 'the command and every process of the server let its output pipe go')
            or diag "after $r->{elapsed} s: $r->{out}";
        is($r->{code}, 0, 'the command exits 0');
        cmp_ok($r->{elapsed}, '<', 10, 'at once');
        like($pid, qr/^\d+$/, 'the pid file names the server') or return;
        ok(pid_alive($pid), 'which runs on');
        is(http_get($port, '/')->{status}, 200, 'and serves');
        isnt(session_of($pid), session_of($$), 'in a session of its own');
        is(session_of($pid), $pid, '(its leader)');
        for my $fd (0, 1, 2) {
            is(readlink("/proc/$pid/fd/$fd"), '/dev/null', "its fd $fd is /dev/null");
        }
        for my $child (children_of($pid)) {
            is(readlink("/proc/$child/fd/2"), '/dev/null', "child $child: fd 2 is /dev/null");
        }
        like($r->{out}, qr/\Q127.0.0.1:$port\E/, 'the command said where it listens')
            or diag $r->{out};
        ok(kill(TERM => $pid), 'TERM');
        ok(wait_until(sub { !pid_alive($pid) }, 10), 'it stops');
        ok(!-e $pidfile, 'and removes its pid file');
    };

    # a start that fails: one line from the command, non-zero, nothing left
    my $holder = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => 0, Listen => 5, ReuseAddr => 1)
        or die "listen: $!";
    my $busy = $holder->sockport;
    my $f = run_piped($cmd_of->($busy), 20);
    subtest "$how -D on a port in use" => sub {
        ok($f->{eof}, 'the command returns');
        isnt($f->{code}, 0, 'non-zero');
        my @lines = grep { length } split /\n/, $f->{out};
        is(scalar @lines, 1, 'one line') or diag $f->{out};
        like($f->{out}, qr/\Q$busy\E/, 'naming the port');
    };
}

in_parallel(
    sub {
        daemon_case('narwhal', sub {
            my ($port, @more) = @_;
            return [ narwhal_cmd(), @NM, '-D', '--listen', "127.0.0.1:$port", @more, $APP ];
        });
    },
    sub {
        SKIP: {
            missing('plackup is not installed', 2) unless -x $PLACKUP;
            daemon_case('plackup', sub {
                my ($port, @more) = @_;
                return [ perl_cmd(), $PLACKUP, '-s', 'Narwhal', '-E', 'deployment', '-D',
                         (@NM ? '--manager=0' : ()), '--listen', "127.0.0.1:$port", @more, $APP ];
            });
        }
    },
);

done_testing;
