package NarwhalTest;
use strict;
use warnings;
use Exporter 'import';
use Cwd ();
use File::Spec ();
use File::Temp ();
use IO::Socket::INET ();
use IO::Socket::UNIX ();
use POSIX ();
use Socket ();
use Time::HiRes ();

# Test helpers: free ports from the OS, a spawned server behind a guard,
# raw-socket requests and a small response parser. Every wait is bounded.

our @EXPORT_OK = qw(metrics_of sleepy_app echo_app free_port spawn_server spawn_servers in_parallel
                    in_background stop_servers write_app raw_connect raw_request
                    read_until_close read_response parse_response tmpdir
                    wait_until root perl_cmd run_cmd http_get children_of
                    pid_alive narwhal_cmd worker_pids manager_built
                    manager_fallback extra_args missing missing_all socket_filter_allowed);

use constant SPAWN_TIMEOUT => 15;    # seconds for a server to start listening
use constant STOP_TIMEOUT  => 10;    # seconds after TERM before KILL

# The servers a test spawns run with short versions of the constants a
# test would otherwise outwait (docs/DESIGN.md, "Constants the tests would
# outwait"): every stop serves idle connections 20 ms instead of 200 ms in
# the manager and then in the workers (0.4 s a stop), and the master looks
# at its workers every 50 ms instead of 0.5 s. A test about one of them
# gives env => { NAME => undef }: the real one.
use constant TEST_TIMING => (NARWHAL_TEST_STOP_SERVE_MS => 20, NARWHAL_TEST_MANAGE_TICK => 0.05);

$SIG{PIPE} = 'IGNORE';    # a server closing on us must fail a test, not kill it

my $ROOT = Cwd::abs_path(File::Spec->catdir(__FILE__, '..', '..', '..'))
    or die "cannot find the distribution root\n";
sub root { $ROOT }

sub perl_cmd {
    return ($^X, "-I$ROOT/blib/lib", "-I$ROOT/blib/arch");
}

my $TMP;
sub tmpdir { $TMP ||= File::Temp::tempdir('narwhal-test-XXXXXX', TMPDIR => 1, CLEANUP => 1) }

# A port on 127.0.0.1 that nothing listens on, for a server about to start.
# Taken at random below the kernel's ephemeral range: a port the kernel
# hands out (bind to 0) is in that range, where the suite's clients take
# thousands of local ports a second, and one of them could hold it before
# the server binds it (the server then fails, and a start-up probe would
# reach somebody else's listener).
# Never one this process drew before: a server's --status-listen port and
# the port spawn_server draws for it are both free until the server binds
# them, and were sometimes the same ("--status-listen must not be one of
# the app's listeners"). (A forked part keeps its parent's.)
my $SEEDED_IN = 0;
my %DRAWN;
sub free_port {
    # (forked parts of a test would otherwise draw the same numbers)
    ($SEEDED_IN, undef) = ($$, srand()) if $SEEDED_IN != $$;
    my ($low) = (_slurp_first('/proc/sys/net/ipv4/ip_local_port_range') // '') =~ /^(\d+)/;
    my $top = ($low && $low > 20000 ? $low : 32768) - 1;
    for (1 .. 200) {
        my $port = 10000 + int(rand($top - 10000 + 1));
        next if $DRAWN{$port}++;
        my $s = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => $port,
                                      Listen => 1, ReuseAddr => 1) or next;
        close $s;
        return $port;
    }
    die "no free port between 10000 and $top\n";
}

sub _slurp_first { open(my $fh, '<', $_[0]) or return undef; return scalar <$fh> }

# Write app code to a file; returns the path.
sub write_app {
    my ($code) = @_;
    my $file = File::Temp->new(DIR => tmpdir(), SUFFIX => '.psgi', UNLINK => 0);
    print $file $code;
    close $file;
    return $file->filename;
}

# wait_until(sub { ... }, $timeout = 10, $every = 0.05): the first true value
# of the condition, polled every $every seconds until $timeout.
sub wait_until {
    my ($cond, $timeout, $every) = @_;
    my $end = Time::HiRes::time() + ($timeout // 10);
    while (Time::HiRes::time() < $end) {
        my $v = $cond->();
        return $v if $v;
        Time::HiRes::sleep($every // 0.05);
    }
    return;
}

# in_parallel(sub { ... }, ...): each block in a process of its own, all
# at once, for the parts of a test file that do not depend on each other
# and spend their time waiting (for timeouts, signals, other processes).
# The test file must `use Test2::IPC` before its first test: the blocks'
# results are then the file's. A block that dies, or whose process ends
# with a non-zero status, fails. Returns once all of them are done.
sub in_parallel {
    my @blocks = @_;
    my @waits = map { in_background($_) } @blocks;
    $waits[$_]->("block $_ of in_parallel") for 0 .. $#waits;
}

# in_background(sub { ... }): the block in a process of its own, as in
# in_parallel, while the test file goes on with the parts after it (which
# the block must not depend on: a part with servers of its own that spends
# its time waiting). Returns a sub that waits for it; call that before
# done_testing. A block that dies or ends with a non-zero status fails.
sub in_background {
    my ($block) = @_;
    die "in_background: the test file must use Test2::IPC\n" unless $INC{'Test2/IPC.pm'};
    tmpdir();    # (one temp dir for all, removed by this process)
    my $pid = fork // die "fork: $!";
    if (!$pid) {
        my $ok = eval { $block->(); 1 };
        print STDERR "# a block run in parallel died: $@" unless $ok;
        exit($ok ? 0 : 255);
    }
    return sub {
        my ($name) = @_;
        waitpid($pid, 0);
        Test::More::fail(($name // 'a block run in the background') . " ended with wait status $?") if $?;
    };
}

# spawn_server(app => $file_or_code, args => [...], unix => $path,
#              env => {...} (undef: unset), stderr => $file, command => [...],
#              child_setup => sub { ... })
# Starts bin/narwhal (or `command`) listening on a fresh port (and the unix
# path when given) and returns a guard once it accepts connections.
sub spawn_server {
    my (%a) = @_;
    my ($guard) = spawn_servers(\%a);
    return $guard;
}

# spawn_servers({ spawn_server's arguments }, ...): several servers started
# at once (their start-ups overlap), the guards in the same order once all
# of them accept connections.
sub spawn_servers {
    my @started = map { _start_server(%$_) } @_;
    _wait_started(@$_) for @started;
    return map { $_->[0] } @started;
}

my $SERVERS = 0;
sub _start_server {
    my (%a) = @_;
    my $app = $a{app} // "sub { [200, ['Content-Type' => 'text/plain'], ['ok']] }";
    $app = write_app($app) unless $app =~ /\.psgi$/ && -f $app;
    my $port = $a{port} // free_port();
    my @listen = $a{no_listen} ? () : ('--listen', "127.0.0.1:$port");
    push @listen, '--listen', $a{unix} if $a{unix};
    my @cmd = $a{command}
        ? @{ $a{command} }
        : (perl_cmd(), "$ROOT/bin/narwhal", @listen, extra_args(), @{ $a{args} || [] }, $app);
    # (a log of its own: two servers may draw the same port, see _wait_started)
    my $stderr = $a{stderr} // File::Spec->catfile(tmpdir(), "server-$port-$$-" . ++$SERVERS . ".log");
    my $pid = fork // die "fork: $!";
    if (!$pid) {
        my %env = (TEST_TIMING, %{ $a{env} || {} });
        defined $env{$_} ? ($ENV{$_} = $env{$_}) : delete $ENV{$_} for keys %env;
        open STDOUT, '>>', $stderr;
        open STDERR, '>>', $stderr;
        $a{child_setup}->() if $a{child_setup};    # in the child, just before exec
        exec @cmd or POSIX::_exit(127);
    }
    my $guard = bless { pid => $pid, port => $port, unix => $a{unix}, owner => $$,
                        log => $stderr }, 'NarwhalTest::Guard';
    NarwhalTest::Guard::_track($guard);
    return [ $guard, \%a ];
}

# A server that exits while it starts is not waited for: its log says why.
# Two servers may draw the same port from free_port (the suite starts
# hundreds, several at once): the one that binds second exits, and a
# connect to the port reaches the other. So the port counts as ours once
# our process holds the listener there, and one that lost the race is
# started again on a new port, the guard kept.
sub _wait_started {
    my ($guard, $a, $tries) = @_;
    my ($pid, $port) = ($guard->{pid}, $guard->{port});
    my $exit;
    my $up = wait_until(sub {
        return 1 if waitpid($pid, POSIX::WNOHANG()) == $pid && defined($exit = $?);
        return $a->{ready}->($guard) if $a->{ready};    # when a connect would not prove it
        # (every listener given: the master opens them one after the other)
        return 0 if $a->{unix} && !IO::Socket::UNIX->new(Peer => $a->{unix});
        return 1 if $a->{unix} && $a->{no_listen};
        return 0 unless IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port);
        return $a->{command} || _holds_listener($pid, $port);    # (a command's listener may be
    }, SPAWN_TIMEOUT, 0.01);                                      # another process's)
    if (defined $exit) {
        $guard->{pid} = 0;
        my $log = $guard->log_text;
        my $tried = $tries // 0;
        if (!defined $a->{port} && !$a->{command} && $tried < 3
            && $log =~ /cannot listen on 127\.0\.0\.1:\Q$port\E\b.*Address already in use/) {
            my ($again) = _start_server(%$a);
            @$guard{qw(pid port log)} = @{ $again->[0] }{qw(pid port log)};
            $again->[0]{pid} = 0;
            return _wait_started($guard, $a, $tried + 1);
        }
        die "server exited as it started (wait status $exit): $log";
    }
    die "server did not start: " . $guard->log_text unless $up;
    return $guard;
}

# Whether process $pid holds the socket that listens on 127.0.0.1:$port
# (/proc/net/tcp names the socket's inode, /proc/PID/fd the process's).
sub _holds_listener {
    my ($pid, $port) = @_;
    my $local = sprintf('0100007F:%04X', $port);
    open(my $tcp, '<', '/proc/net/tcp') or return 1;    # (no /proc: the connect has to do)
    my %inode;
    while (my $line = <$tcp>) {
        my @f = split ' ', $line;
        $inode{ $f[9] } = 1 if ($f[1] // '') eq $local && $f[3] eq '0A';    # (LISTEN)
    }
    opendir(my $fds, "/proc/$pid/fd") or return 0;
    return scalar grep { (readlink("/proc/$pid/fd/$_") // '') =~ /^socket:\[(\d+)\]$/ && $inode{$1} }
                  readdir $fds;
}

# stop_servers(@guards): TERM to all of them at once, then each is waited
# for as $guard->stop does; returns their wait statuses.
sub stop_servers {
    my @g = grep { $_ && $_->{pid} && $_->{owner} == $$ } @_;
    kill TERM => $_->{pid} for @g;
    return map { $_->stop('none') } @g;
}

# NARWHAL_TEST_ARGS="--no-manager" runs the suite in another mode.
# An app that reports who served the request (worker pid, client port and
# address, path) and sleeps for /sleep/SECONDS: where a connection went is
# visible in its answers.
# An app that sleeps for /sleep/SECONDS, then answers 200 with the body
# $body (Perl source of an expression; default "ok\n"). Returns its path.
sub sleepy_app {
    my ($body) = @_;
    $body //= '"ok\n"';
    return write_app(<<"APP");
sub {
    my \$env = shift;
    Time::HiRes::sleep(\$1) if \$env->{PATH_INFO} =~ m{^/sleep/([\\d.]+)};
    [200, ['Content-Type' => 'text/plain'], [$body]];
}
APP
}

sub echo_app {
    return <<'APP';
sub {
    my $env = shift;
    select undef, undef, undef, $1 if $env->{PATH_INFO} =~ m{^/sleep/([\d.]+)};
    [200, ['Content-Type' => 'text/plain'],
     ["pid=$$ port=$env->{REMOTE_PORT} addr=$env->{REMOTE_ADDR} path=$env->{PATH_INFO}"]];
}
APP
}

sub extra_args { split ' ', $ENV{NARWHAL_TEST_ARGS} // '' }

# Something this machine lacks (root, nginx, a sanitizer, a program): a
# CPAN user's `make test` skips what needs it, with the reason; dev/test,
# which installs everything, sets NARWHAL_TEST_ALL=1, and there the same
# lack fails, so that CI cannot pass by skipping. missing() in a SKIP
# block in place of skip(); missing_all() in place of plan skip_all.
sub missing {
    my ($why, $count) = @_;
    if ($ENV{NARWHAL_TEST_ALL}) {
        Test::More::fail("$why (NARWHAL_TEST_ALL: this run must have everything)");
        no warnings 'exiting';
        last SKIP;
    }
    Test::More::skip($why, $count);
}

# Whether this kernel lets this process attach a socket filter (what a
# stop uses to refuse new TCP connections; some refuse it to non-root).
sub socket_filter_allowed {
    my $l = IO::Socket::INET->new(Listen => 1, LocalAddr => '127.0.0.1', LocalPort => 0) or return 0;
    my $accept_all = pack('S C C L', 0x06, 0, 0, 0xffffffff);     # BPF_RET|BPF_K, accept all
    return setsockopt($l, Socket::SOL_SOCKET(), 26, pack('S x6 P', 1, $accept_all)) ? 1 : 0;  # SO_ATTACH_FILTER
}

sub missing_all {
    my ($why) = @_;
    Test::More::plan(skip_all => $why) unless $ENV{NARWHAL_TEST_ALL};
    Test::More::plan(tests => 1);
    Test::More::fail("$why (NARWHAL_TEST_ALL: this run must have everything)");
    exit 1;
}

sub raw_connect {
    my ($where) = @_;
    return $where =~ m{/}
        ? IO::Socket::UNIX->new(Peer => $where, Type => Socket::SOCK_STREAM())
        : IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $where, Timeout => 5);
}

# Read until the peer closes or the timeout passes.
sub read_until_close {
    my ($sock, $timeout) = @_;
    my $end = Time::HiRes::time() + ($timeout // 5);
    my $data = '';
    my $rin = '';
    vec($rin, fileno($sock), 1) = 1;
    while ((my $left = $end - Time::HiRes::time()) > 0) {
        my $n = select(my $rout = $rin, undef, undef, $left);
        last if $n <= 0;
        my $got = sysread($sock, my $buf, 65536);
        last unless $got;
        $data .= $buf;
    }
    return $data;
}

# Send bytes on a new connection; read everything until close.
sub raw_request {
    my ($where, $bytes, $timeout) = @_;
    my $s = raw_connect($where) or die "connect $where: $!";
    syswrite($s, $bytes) if length $bytes;
    return read_until_close($s, $timeout);
}

# Read exactly one response from a socket (Content-Length or chunked, or
# until close). Returns a hashref or undef on timeout.
sub read_response {
    my ($sock, $timeout, $is_head) = @_;
    my $end = Time::HiRes::time() + ($timeout // 5);
    my $buf = ${ *$sock }{narwhal_buf} // '';
    my $read = sub {
        my $left = $end - Time::HiRes::time();
        return 0 if $left <= 0;
        my $rin = '';
        vec($rin, fileno($sock), 1) = 1;
        return 0 unless select(my $r = $rin, undef, undef, $left) > 0;
        my $n = sysread($sock, my $chunk, 65536);
        return 0 unless $n;
        $buf .= $chunk;
        return 1;
    };
    my $res;
    while (1) {
        $res = parse_response($buf, $is_head) and last;
        $read->() or do { $res = parse_response($buf, $is_head, 1); last };
    }
    ${ *$sock }{narwhal_buf} = $res ? substr($buf, $res->{consumed}) : $buf;
    return $res;
}

# Parse one response from the front of $buf. Returns undef when incomplete
# (unless $at_eof: then a close-delimited body ends at the end).
sub parse_response {
    my ($buf, $is_head, $at_eof) = @_;
    my $end = index($buf, "\r\n\r\n");
    return undef if $end < 0;
    my $head = substr($buf, 0, $end);
    my ($status_line, @lines) = split /\r\n/, $head;
    my ($proto, $status, $reason) = $status_line =~ m{^(HTTP/1\.\d) (\d{3})(?: (.*))?$}
        or return undef;
    my (%h, @order);
    for (@lines) {
        my ($k, $v) = /^([^:]+):\s*(.*)$/ or next;
        push @order, [ $k, $v ];
        $h{ lc $k } = exists $h{ lc $k } ? "$h{lc $k}, $v" : $v;
    }
    my $res = { protocol => $proto, status => $status, reason => $reason, headers => \%h,
                header_list => \@order, head => $head };
    my $pos = $end + 4;
    if ($is_head || $status =~ /^(?:1\d\d|204|304)$/) {
        $res->{body} = '';
    } elsif (defined $h{'content-length'}) {
        return undef if length($buf) - $pos < $h{'content-length'};
        $res->{body} = substr($buf, $pos, $h{'content-length'});
        $pos += $h{'content-length'};
    } elsif (($h{'transfer-encoding'} // '') =~ /chunked/i) {
        my $body = '';
        while (1) {
            my $le = index($buf, "\r\n", $pos);
            return undef if $le < 0;
            my $size = hex substr($buf, $pos, $le - $pos);
            return undef if length($buf) < $le + 2 + $size + 2;
            $body .= substr($buf, $le + 2, $size);
            $pos = $le + 2 + $size + 2;
            last if $size == 0;
        }
        $res->{body} = $body;
    } else {
        return undef unless $at_eof;
        $res->{body} = substr($buf, $pos);
        $pos = length $buf;
    }
    $res->{consumed} = $pos;
    return $res;
}

# The narwhal command line: perl with blib, then bin/narwhal.
sub narwhal_cmd { return (perl_cmd(), "$ROOT/bin/narwhal") }

# run_cmd([@cmd], timeout => 10, env => {...}, stdin => $bytes)
# Runs a command to its end (KILLed after the timeout) and returns
# { out, err, code, signal, elapsed, timed_out }.
sub run_cmd {
    my ($cmd, %a) = @_;
    my $dir = tmpdir();
    my ($out_fh, $out) = File::Temp::tempfile(DIR => $dir);
    my ($err_fh, $err) = File::Temp::tempfile(DIR => $dir);
    my $in = '/dev/null';
    if (defined $a{stdin}) {
        (my $in_fh, $in) = File::Temp::tempfile(DIR => $dir);
        binmode $in_fh;
        print $in_fh $a{stdin};
        close $in_fh or die "$in: $!";
    }
    my $start = Time::HiRes::time();
    my $pid = fork // die "fork: $!";
    if (!$pid) {
        $ENV{$_} = $a{env}{$_} for keys %{ $a{env} || {} };
        open STDIN, '<', $in;
        open STDOUT, '>&', $out_fh;
        open STDERR, '>&', $err_fh;
        exec @$cmd or POSIX::_exit(127);
    }
    my $timeout = $a{timeout} // 10;
    my $status;
    my $done = wait_until(sub {
        my $r = waitpid($pid, POSIX::WNOHANG());
        $status = $? if $r == $pid;
        return $r == $pid || $r < 0;
    }, $timeout);
    my $timed_out = !$done;
    if ($timed_out) {
        kill KILL => $pid;
        waitpid($pid, 0);
        $status = $?;
    }
    unlink $in if defined $a{stdin};
    my $slurp = sub { open(my $fh, '<', $_[0]) or return ''; local $/; my $d = <$fh> // ''; unlink $_[0]; $d };
    return { out => $slurp->($out), err => $slurp->($err),
             code => ($status // -1) >> 8, signal => ($status // 0) & 127,
             elapsed => Time::HiRes::time() - $start, timed_out => $timed_out };
}

# A GET with HTTP::Tiny (a new client unless one is given); returns its
# response hash (status 599 on connection errors).
# The status listener's /metrics on 127.0.0.1:$port, as { "name{labels}" => value }.
sub metrics_of {
    my ($port) = @_;
    my $text = http_get("http://127.0.0.1:$port", '/metrics')->{content} // '';
    return { map { /^(\S+) (\S+)$/ ? ($1 => $2) : () } grep { !/^#/ } split /\n/, $text };
}

sub http_get {
    my ($where, $path, $http) = @_;
    require HTTP::Tiny;
    $http ||= HTTP::Tiny->new(timeout => 5, keep_alive => 0);
    my $url = $where =~ /^http/ ? $where : "http://127.0.0.1:$where";
    return $http->get($url . ($path // '/'));
}

# Direct children of a process (from /proc).
sub children_of {
    my ($pid) = @_;
    my %kids;
    for my $f (glob "/proc/$pid/task/*/children") {
        open(my $fh, '<', $f) or next;
        $kids{$_} = 1 for split ' ', (<$fh> // '');
    }
    my @kids = sort { $a <=> $b } keys %kids;
    return wantarray ? @kids : scalar @kids;
}

# The worker processes among a master's children (not the manager).
sub worker_pids {
    my ($master) = @_;
    my @w = grep {
        my $fh;
        open($fh, '<', "/proc/$_/cmdline") && (<$fh> // '') =~ /^narwhal worker/;
    } children_of($master);
    return wantarray ? @w : scalar @w;
}

# The connection manager program is built (make) next to the XS module.
sub manager_built { -x "$ROOT/blib/arch/auto/Narwhal/narwhal-manager" }

# Arguments that let a server start when the manager is not built yet.
sub manager_fallback { manager_built() ? () : ('--no-manager') }

# Whether the servers of this run have a connection manager: it is built,
# and NARWHAL_TEST_ARGS does not switch it off (--no-manager).
sub managed { manager_built() && !grep { $_ eq '--no-manager' } extra_args() }

# True while a process exists and is not a zombie.
sub pid_alive {
    my ($pid) = @_;
    return 0 unless $pid && kill 0 => $pid;
    open(my $fh, '<', "/proc/$pid/stat") or return 0;
    my $stat = <$fh> // '';
    return $stat =~ /\)\s+Z\s/ ? 0 : 1;
}

package NarwhalTest::Guard;
use POSIX ();
use Scalar::Util ();
use Time::HiRes ();

sub pid  { $_[0]{pid} }
sub port { $_[0]{port} }
sub log_file { $_[0]{log} }
sub log_text {
    my $self = shift;
    open(my $fh, '<', $self->{log}) or return '';
    local $/;
    return <$fh> // '';
}

# Every guard of this process that may still run a server, and the
# servers whose guards went away (DESTROY): at the end of the test file,
# all of them are stopped at once (END below).
my (%LIVE, @DYING);
sub _track { my $g = shift; $LIVE{"$g"} = $g; Scalar::Util::weaken($LIVE{"$g"}) }
sub _reap_dying { @DYING = grep { waitpid($_, POSIX::WNOHANG()) == 0 } @DYING }
END {
    local ($?, $!, $@);
    my @g = grep { defined && $_->{pid} && $_->{owner} == $$ } values %LIVE;
    kill TERM => map { $_->{pid} } @g;
    push @DYING, map { my $pid = $_->{pid}; $_->{pid} = 0; $pid } @g;
    my $end = Time::HiRes::time() + NarwhalTest::STOP_TIMEOUT();
    while (_reap_dying() && Time::HiRes::time() < $end) { Time::HiRes::sleep(0.01) }
    kill KILL => @DYING if @DYING;
    waitpid($_, 0) for @DYING;
}

# TERM (or $sig; 'none' when it was sent already), wait, KILL, reap. Only
# the process that spawned the server does it.
sub stop {
    my ($self, $sig) = @_;
    my $pid = $self->{pid} or return;
    return unless $self->{owner} == $$;
    kill($sig // 'TERM', $pid) unless ($sig // '') eq 'none';
    my $end = Time::HiRes::time() + NarwhalTest::STOP_TIMEOUT();
    while (Time::HiRes::time() < $end) {
        if (waitpid($pid, POSIX::WNOHANG()) == $pid) {
            $self->{status} = $?;
            $self->{pid} = 0;
            return $self->{status};
        }
        Time::HiRes::sleep(0.01);
    }
    kill KILL => $pid;
    waitpid($pid, 0);
    $self->{status} = $?;
    $self->{pid} = 0;
    return $self->{status};
}

# Wait (without signalling) up to $timeout seconds for the process to exit;
# returns its wait status, or undef if it is still running.
sub wait_exit {
    my ($self, $timeout) = @_;
    my $pid = $self->{pid} or return $self->{status};
    return undef unless $self->{owner} == $$;
    my $end = Time::HiRes::time() + ($timeout // 5);
    while (1) {
        if (waitpid($pid, POSIX::WNOHANG()) == $pid) {
            $self->{status} = $?;
            $self->{pid} = 0;
            return $self->{status};
        }
        return undef if Time::HiRes::time() >= $end;
        Time::HiRes::sleep(0.02);
    }
}

# A guard that goes away stops its server without waiting for it: the
# server gets its TERM now and is reaped later (by the next guard that
# goes, or at the end of the file), so that a test does not wait for the
# stop of a server it no longer looks at. A test that looks at the stop
# calls stop.
sub DESTROY {
    my $self = shift;
    local ($?, $!, $@);
    return unless $self->{pid} && $self->{owner} == $$;
    kill TERM => $self->{pid};
    push @DYING, $self->{pid};
    $self->{pid} = 0;
    _reap_dying();
}

1;
