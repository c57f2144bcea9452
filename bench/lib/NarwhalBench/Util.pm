package NarwhalBench::Util;
# Small helpers shared by bench/run and bench/callgrind.
use strict;
use warnings;
use Exporter 'import';
use IO::Socket::INET;
use POSIX ();
use Time::HiRes qw(time sleep);

our @EXPORT_OK = qw(
    free_port free_ports capture median say_err http_get_ok wait_http
    spawn reap_nowait kill_session machine_info fmt_num which
    raise_nofile build_client
    session_pids session_cpu session_memory unaccepted_conns
    machine_busy own_cpu
);

sub say_err { print STDERR @_, "\n" }

# A TCP port free right now on 127.0.0.1: bind to port 0 and ask the kernel.
sub free_port { return (free_ports(1))[0] }

# $n distinct free ports: all probe sockets are held until every port is
# known, or the kernel could hand out the same port twice.
sub free_ports {
    my ($n) = @_;
    my @socks = map {
        IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => 0, Proto => 'tcp', Listen => 1)
            or die "cannot bind a free port: $!\n"
    } 1 .. $n;
    return map { $_->sockport } @socks;
}

# Output (stdout+stderr) of a command given as a list; '' when it fails to run.
sub capture {
    my @cmd = @_;
    my $pid = open(my $fh, '-|') // return '';
    if (!$pid) {
        open STDERR, '>&', \*STDOUT;
        exec { $cmd[0] } @cmd or POSIX::_exit(127);
    }
    local $/;
    my $out = <$fh> // '';
    close $fh;
    return $out;
}

sub which {
    my ($prog) = @_;
    for my $dir (split /:/, $ENV{PATH} // '') {
        return "$dir/$prog" if -x "$dir/$prog" && !-d _;
    }
    return;
}

sub median {
    my @v = sort { $a <=> $b } grep { defined } @_;
    return undef unless @v;
    my $mid = int(@v / 2);
    return @v % 2 ? $v[$mid] : ($v[$mid - 1] + $v[$mid]) / 2;
}

# One plain HTTP/1.0 GET; true when the answer's status is 2xx.
sub http_get_ok {
    my ($port, $path, $timeout) = @_;
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port,
                                  Proto => 'tcp', Timeout => $timeout // 1) or return 0;
    $s->autoflush(1);
    print $s "GET $path HTTP/1.0\r\nHost: 127.0.0.1:$port\r\n\r\n";
    my $line = '';
    my $deadline = time + ($timeout // 1);
    my $rin = '';
    vec($rin, fileno($s), 1) = 1;
    while (time < $deadline && $line !~ /\n/) {
        my $rout = $rin;
        last unless select($rout, undef, undef, $deadline - time) > 0;
        my $n = sysread($s, my $buf, 4096);
        last unless $n;
        $line .= $buf;
    }
    close $s;
    return $line =~ m{^HTTP/1\.\d 2\d\d} ? 1 : 0;
}

# Poll until the server answers 2xx, its process dies, or $bound seconds pass.
# Returns '' on success, otherwise the reason.
sub wait_http {
    my ($pid, $port, $path, $bound) = @_;
    my $deadline = time + $bound;
    while (time < $deadline) {
        return "exited early" unless reap_nowait($pid);
        return '' if http_get_ok($port, $path, 1);
        sleep 0.1;
    }
    return "no 2xx answer within ${bound}s";
}

# Start a command in its own session (so the whole tree can be signalled),
# stdout+stderr to $log. Returns the pid (= session id = process group id).
sub spawn {
    my ($cmd, $log, $env) = @_;
    my $pid = fork // die "fork: $!\n";
    return $pid if $pid;
    POSIX::setsid();
    open STDIN, '<', '/dev/null';
    open STDOUT, '>>', $log or POSIX::_exit(126);
    open STDERR, '>&', \*STDOUT;
    $ENV{$_} = $env->{$_} for keys %{ $env || {} };
    exec { $cmd->[0] } @$cmd or print STDERR "exec $cmd->[0]: $!\n";
    POSIX::_exit(127);
}

# True while $pid is still running (reaps it if it has exited).
sub reap_nowait {
    my ($pid) = @_;
    my $r = waitpid($pid, POSIX::WNOHANG());
    return $r == 0;
}

# TERM the process group, wait up to $grace seconds, then KILL it.
sub kill_session {
    my ($pid, $grace) = @_;
    return unless $pid;
    kill 'TERM', -$pid;
    my $deadline = time + ($grace // 5);
    while (time < $deadline) {
        reap_nowait($pid);
        return unless session_pids($pid);
        sleep 0.05;
    }
    kill 'KILL', -$pid;
    waitpid($pid, 0);
}

# Live (not zombie) processes of session $sid, from /proc.
sub session_pids {
    my ($sid) = @_;
    my @pids;
    opendir my $dh, '/proc' or return;
    for my $p (grep { /^\d+$/ } readdir $dh) {
        my $stat = _read("/proc/$p/stat") or next;
        my @f = split ' ', substr($stat, rindex($stat, ')') + 2);
        # fields after "(comm) ": state ppid pgrp session ...
        push @pids, $p if $f[3] == $sid && $f[0] ne 'Z';
    }
    return @pids;
}

# CPU time (seconds, user+system) used so far by the processes of a session,
# including exited workers their parent has reaped (cutime, cstime).
sub session_cpu {
    my ($sid) = @_;
    my $ticks = 0;
    for my $p (session_pids($sid)) {
        my $stat = _read("/proc/$p/stat") or next;
        my @f = split ' ', substr($stat, rindex($stat, ')') + 2);
        $ticks += $f[11] + $f[12] + $f[13] + $f[14];   # utime stime cutime cstime
    }
    return $ticks / POSIX::sysconf(POSIX::_SC_CLK_TCK());
}

# CPU seconds the whole machine has spent running processes (user, nice,
# system; not interrupts, not steal) since boot.
sub machine_busy {
    my ($line) = _read('/proc/stat') =~ /^cpu\s+(.*)$/m;
    my ($user, $nice, $system) = split ' ', $line // '';
    return (($user // 0) + ($nice // 0) + ($system // 0)) / POSIX::sysconf(POSIX::_SC_CLK_TCK());
}

# CPU seconds used by this process and its reaped children (the load client).
sub own_cpu {
    my ($real, $user, $sys, $cuser, $csys) = POSIX::times();
    my $tck = POSIX::sysconf(POSIX::_SC_CLK_TCK());
    return (($user + $sys) / $tck, ($cuser + $csys) / $tck);
}

# Memory of a session: sum of RSS and of PSS (proportional set size: shared
# pages divided among the processes sharing them), in MiB, and process count.
sub session_memory {
    my ($sid) = @_;
    my ($rss, $pss, $n) = (0, 0, 0);
    for my $p (session_pids($sid)) {
        my ($r) = _read("/proc/$p/status") =~ /^VmRSS:\s*(\d+)/m;
        my ($s) = _read("/proc/$p/smaps_rollup") =~ /^Pss:\s*(\d+)/m;
        $rss += $r // 0;
        $pss += $s // 0;
        $n++;
    }
    return { rss_mb => $rss / 1024, pss_mb => $pss / 1024, procs => $n };
}

sub fmt_num {
    my ($n, $dec) = @_;
    return 'n/a' unless defined $n;
    my $s = sprintf("%.*f", $dec // 0, $n);
    1 while $s =~ s/^(-?\d+)(\d{3})/$1,$2/;
    return $s;
}

sub _read { my ($f) = @_; open my $fh, '<', $f or return ''; local $/; my $s = <$fh>; return $s // '' }

sub machine_info {
    my %m;
    ($m{nproc}) = capture('nproc') =~ /(\d+)/;
    ($m{cpu}) = _read('/proc/cpuinfo') =~ /^model name\s*:\s*(.+)$/m;
    $m{kernel} = join ' ', (POSIX::uname())[0, 2, 4];
    my ($kb) = _read('/proc/meminfo') =~ /^MemTotal:\s*(\d+)/m;
    $m{memory} = sprintf("%.1f GiB", ($kb // 0) / 1048576);
    ($m{os}) = _read('/etc/os-release') =~ /^PRETTY_NAME="?([^"\n]+)/m;
    $m{perl} = sprintf("%vd", $^V);
    ($m{governor}) = _read('/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor') =~ /(\S+)/;
    $m{somaxconn} = (_read('/proc/sys/net/core/somaxconn') =~ /(\d+)/)[0];
    return \%m;
}

# Let this process (and every child) open enough files for 10,000 connections.
sub raise_nofile {
    my ($want) = @_;
    my ($cur, $hard) = split ' ', capture('sh', '-c', 'ulimit -n; ulimit -Hn');
    return $cur if $cur !~ /^\d+$/ || $cur >= $want;
    # as root the hard limit can go up too, unless the container forbids it
    if (which('prlimit')) {
        capture('prlimit', "--pid=$$", "--nofile=$want:$want");
        capture('prlimit', "--pid=$$", "--nofile=$hard:$hard")
            if $hard =~ /^\d+$/ && capture('sh', '-c', 'ulimit -n') < $want;
    }
    $cur = capture('sh', '-c', 'ulimit -n');
    chomp $cur;
    return $cur;
}

# Build bench/src/kaclient.c into $build_dir when missing or out of date.
sub build_client {
    my ($src_dir, $build_dir) = @_;
    mkdir $build_dir unless -d $build_dir;
    my $bin = "$build_dir/kaclient";
    my $src = "$src_dir/kaclient.c";
    return $bin if -x $bin && (stat $bin)[9] >= (stat $src)[9];
    my $cc = $ENV{CC} || 'cc';
    system($cc, '-O2', '-Wall', '-o', $bin, $src, '-lm') == 0
        or die "building $src failed\n";
    return $bin;
}


# Connections to 127.0.0.1:$port that the server has not accept()ed: those
# established by the kernel but still in the accept queue (server side, no
# socket inode yet: ino:0), and those whose handshake is not even complete
# because the queue is full (client side in SYN-SENT, server side in
# SYN-RECV). Asked of the kernel with `ss` (netlink, filtered in the kernel;
# /proc/net/tcp is far too slow with tens of thousands of TIME_WAIT entries).
# Keys are socket cookies, never reused, so a reused client port is a new key.
sub unaccepted_conns {
    my ($port) = @_;
    my %q;
    my $queued = capture('ss', '-Htne', 'state', 'established', "( sport = :$port )");
    my $half   = capture('ss', '-Htne', 'state', 'syn-sent', 'state', 'syn-recv',
                         "( sport = :$port or dport = :$port )");
    for my $line (split(/\n/, $queued)) {
        $q{$1} = 1 if $line =~ /\bino:0\b/ && $line =~ /\bsk:(\w+)/;
    }
    for my $line (split(/\n/, $half)) {
        $q{$1} = 1 if $line =~ /\bsk:(\w+)/;
    }
    return \%q;
}

1;
