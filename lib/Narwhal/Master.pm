package Narwhal::Master;
use strict;
use warnings;
use POSIX ();
use List::Util ();
use Time::HiRes ();
use Socket qw(AF_UNIX SOCK_SEQPACKET SOCK_DGRAM pack_sockaddr_un);
use Fcntl qw(F_GETFL F_SETFL F_DUPFD O_NONBLOCK);
use Narwhal ();
use Narwhal::Listener ();
use Narwhal::Worker ();

# The master: opens the listeners, loads the app (unless delayed), forks the
# workers and keeps their number right. Signal handlers only record what was
# asked; the manage loop acts on it.

use constant MANAGE_TICK       => Narwhal::for_tests(MANAGE_TICK => 0.5);
                                         # seconds between looks at the workers
use constant POOL_TICK         => 0.1;   # ...with an elastic pool (--min-workers)
use constant QUICK_DEATH       => 1.0;   # a worker dying sooner is a failed start
use constant BACKOFF_FIRST     => 0.1;   # respawn delay after the first failed start
use constant BACKOFF_MAX       => 10;    # ...doubling up to this
use constant CRASH_LOG_EVERY   => 10;    # seconds: worker deaths past the first are summed up
use constant PROXY_LOG_EVERY   => Narwhal::for_tests(PROXY_LOG_EVERY => 10);
                                         # seconds: refused PROXY connections past the first too
use constant KILL_REAP_WAIT    => 0.5;   # after KILL at the graceful deadline, wait this long
use constant MANAGER_STOP_WAIT => 1.5;   # on stop, the workers wait this long at most for the manager
use constant MANAGER_TERM_AGAIN => 0.25; # on stop, TERM to the manager again this often (_term_manager_again)
use constant STATUS_BACKLOG    => 64;    # the status listener's listen queue
use constant WATCHDOG_GRACE    => 1.0;   # --request-timeout: seconds between the watchdog's steps
use constant REPLACE_LINGER    => Narwhal::for_tests(REPLACE_LINGER => 10);
                                         # seconds a replaced worker may take to reach its limit
use constant REPLACE_AT_ONCE   => 1;     # replaced workers alive at once (workers beyond
                                         # --max-workers); others asking are replaced as they exit
# Signals that mean the worker crashed (not that someone stopped it).
my %CRASH_SIGNAL = map { (POSIX->can("SIG$_")->() => 1) } qw(SEGV BUS FPE ILL ABRT);
use constant CRASH_WINDOW      => 10;    # --crash-backoff: seconds in which ...
use constant CRASH_COUNT       => 3;     # ... this many deaths of one route start a back-off
use constant CRASH_BACKOFF_MAX => 300;   # seconds a back-off doubles up to
use constant LIFETIME_JITTER   => 0.1;   # --max-worker-lifetime: each worker's is up to 10% longer

# The master's signals are blocked across fork: a TERM sent to a new worker
# (or manager) before it has its own handlers must not run the master's handler (which
# would only set a flag in the child's copy of the master, and the worker
# would never stop). The child resets them to the default, then unblocks.
my @FORK_BLOCKED = qw(TERM INT QUIT HUP TTIN TTOU USR1);

sub new {
    my ($class, %args) = @_;
    return bless {
        %args,
        workers    => {},
        generation => 1,
        failures   => 0,
        next_spawn => 0,
        pending    => {},
    }, $class;
}

sub run {
    my $self = shift;
    return $self->_run unless $self->{options}{daemonize};
    $self->_daemonize;
    my $code = eval { $self->_run };
    return $code if defined $code;
    my $err = $@;
    $self->_daemon_says('error ' . _first_line($err));
    die $err;
}

# --daemonize (-D): the command returns once the server listens. The
# server goes on in a child, in a session of its own, holding nothing of
# the caller's terminal or pipes (an init script's $(...) waits for every
# process that holds its pipe, the connection manager too): stdin, stdout
# and stderr are /dev/null (stderr is --error-log when given) before any
# other process starts. The caller's stderr is kept aside for the start
# line and the one line of a failed start (_announce, _daemon_says); the
# parent waits for either on a pipe and exits 0, or says the failure and
# exits non-zero.
sub _daemonize {
    my $self = shift;
    pipe(my $r, my $w) or die "pipe: $!\n";
    my $pid = fork // die "fork: $!\n";
    if ($pid) {
        close $w;
        my $said = do { local $/; <$r> } // '';
        exit 0 if $said =~ /^ready/;
        waitpid($pid, 0);
        my $status = $?;
        $said =~ s/^error //;
        chomp $said;
        print STDERR "narwhal: " . (length $said ? $said : "the server did not start (wait status $status)")
                   . "\n";
        exit(($status >> 8) || 1);
    }
    close $r;
    POSIX::setsid() // die "setsid: $!\n";
    open(my $caller_err, '>&', \*STDERR) or die "dup stderr: $!\n";
    open(STDIN, '<', '/dev/null') or die "/dev/null: $!\n";
    open(STDOUT, '>', '/dev/null') or die "/dev/null: $!\n";
    open(STDERR, '>', '/dev/null') or die "/dev/null: $!\n";
    $self->{daemon} = { pipe => $w, stderr => $caller_err };
}

# To the command that started a --daemonize server: "ready" or "error
# WHY", once; the caller's stderr is let go with it.
sub _daemon_says {
    my ($self, $what) = @_;
    my $d = delete $self->{daemon} or return;
    syswrite($d->{pipe}, "$what\n");
    close $d->{pipe};
    close $d->{stderr};
}

# With the caller's stderr as STDERR (--daemonize, before it goes): the
# start line reaches the terminal or the init script that started it.
sub _to_caller {
    my ($self, $code) = @_;
    my $d = $self->{daemon} or return $code->();
    open(my $saved, '>&', \*STDERR) or return $code->();
    open(STDERR, '>&', $d->{stderr}) or return $code->();
    STDERR->autoflush(1);
    $code->();
    open(STDERR, '>&', $saved);
    STDERR->autoflush(1);
}

sub _run {
    my $self = shift;
    my $o = $self->{options};
    $self->{pid} = $$;
    # systemd's notification socket is the master's alone: the workers and
    # the app must not tell systemd anything in its name.
    $self->{notify_socket} = delete $ENV{NOTIFY_SOCKET};
    # The handlers first: a stop that arrives while the server starts (the
    # listeners are open, the app loads) is kept for the manage loop, which
    # starts the workers anyway so that what the kernel accepted is served.
    $self->_signals;
    Narwhal::open_error_log($o);
    $self->{ids} = _user_ids($o);
    $self->{cpus} = _cpus();
    $self->{accepting} = _accepting_count($o, $self->{cpus}{count});
    $self->{kernel_tls} = check_tls($o, $self->{ids});   # (before anything listens: a bad pair
                                                         # starts nothing)
    $self->{listeners} ||= [ Narwhal::Listener::open_all($o, $self->_listen_queues) ];
    $self->{status_listener} = _open_status_listener($o, $self->{listeners})
        if defined $o->{status_listen};
    $self->_create_access_log;
    $self->{pool} = $o->{min_workers};     # (undef: a fixed pool of --max-workers)
    $self->_open_scoreboard;
    $self->_start_manager if _wants_manager($o);    # before the app: it must not carry it
    $self->_prepare_app;
    $self->_write_pid;
    $0 = "narwhal master " . join(' ', Narwhal::Listener::addresses(@{ $self->{listeners} }));
    $self->_announce;
    $self->_warn_open_proxy;
    $self->_warn_blind_pool;
    $self->_warn_unmanaged_queues;
    $self->_wake_on_signals;    # (again: the app's loading may have touched %SIG)
    $self->_manage;
    $self->_tell_stopped;
    $self->_cleanup;
    return 0;
}

# --accepting-workers (DESIGN.md, "Accepting workers"): how many workers
# take new clients; 0: every worker. Standby workers need the manager,
# which gives them what the accepting ones cannot take.
sub _accepting_count {
    my ($o, $cpus) = @_;
    return 0 unless _wants_manager($o);
    return $o->{accepting_workers} // $cpus;
}

# The CPUs the defaults count (DESIGN.md, "CPU quotas"): the affinity
# mask's, or the cgroup's CPU quota rounded up when that is fewer. A quota
# file that cannot be parsed is said, and the affinity count used.
sub _cpus {
    my ($quota, $bad) = Narwhal::Master::cpu_quota();
    Narwhal::log_line(warn => "cannot parse the CPU quota in $bad: counting the CPUs this "
                              . "process may run on instead") if defined $bad;
    return { count => Narwhal::Master::cpu_count($quota // 0), quota => $quota };
}

# "2 CPUs", "1 CPU (cgroup quota 0.50)": what the defaults counted.
sub _cpus_said {
    my $c = shift;
    my $q = defined $c->{quota} ? sprintf(' (cgroup CPU quota %.2f)', $c->{quota}) : '';
    return "$c->{count} CPU" . ($c->{count} == 1 ? '' : 's') . $q;
}

# Sockets per TCP address (DESIGN.md, "Listen queues"): one for each
# accepting worker, at most LISTEN_QUEUES_DEFAULT_MAX, unless said. One
# without the manager: a wake-up a worker takes and leaves (two queues
# reported, one served) has nobody to pass it on, and its client waits
# for that worker's request while another worker is idle.
sub _listen_queues {
    my $self = shift;
    my $o = $self->{options};
    return $o->{listen_queues} if defined $o->{listen_queues};
    return 1 unless _wants_manager($o);
    # (--accepting-workers defaults to the CPUs, which may be more than
    # the pool: a queue no worker stands for only loses the arrival order)
    my $accepting = $self->{accepting} || $o->{max_workers};
    $accepting = $o->{max_workers} if $accepting > $o->{max_workers};
    my $max = Narwhal::Limits::LISTEN_QUEUES_DEFAULT_MAX();
    return $accepting < $max ? $accepting : $max;
}

sub _wants_manager {
    my ($o) = @_;
    return $o->{manager} && ((!$o->{disable_keepalive} && $o->{max_keepalive_reqs} > 1)
                             || defined $o->{status_listen} || $o->{max_queue_wait}
                             || Narwhal::Listener::wants_tls($o));
}

# The TLS certificate pair loads, as the manager will load it: the
# manager program run with --tls-check, as the user it runs as (the
# master and the workers never link OpenSSL). Dies with its one line;
# returns what the kernel offers for TLS (nw_ktls.h), in a few words.
# (Plack::Handler::Narwhal calls it too, before plackup goes on.)
sub check_tls {
    my ($o, $ids) = @_;
    return unless Narwhal::Listener::wants_tls($o);
    $ids //= _user_ids($o);
    my $bin = Narwhal::manager_path()
        or die "cannot find the narwhal-manager program (run make): it does TLS\n";
    my $pid = open(my $out, '-|') // die "fork: $!\n";
    if (!$pid) {
        open(STDERR, '>&', \*STDOUT);
        eval { _drop_privileges($ids); 1 } or do { print "cannot check: $@"; POSIX::_exit(1) };
        no warnings q(exec);
        exec { $bin } 'narwhal manager', '--tls-check', '--tls-cert', $o->{tls_cert},
                      '--tls-key', $o->{tls_key};
        print "cannot run $bin: $!\n";
        POSIX::_exit(127);
    }
    my $said = do { local $/; <$out> } // '';
    close $out;
    $said =~ s/\n.*//s;
    return $said if $? == 0;    # (what the kernel offers: the start line says it)
    die "TLS: " . ($said || "the certificate check failed ($?)") . "\n";
}

# The status pages' listener (--status-listen): opened here, after the
# app's, and answered by the manager (DESIGN.md, "The operator layer").
# Never one the app's clients could reach: the same address as an app
# listener, or one within its 0.0.0.0 or [::], however spelled (--port
# too). The kernel does not refuse it, as both have SO_REUSEPORT (the app's
# with --listen-queues or --reuse-port): the status listener would join the
# app's group, or take the clients of the address it names.
sub _open_status_listener {
    my ($o, $listeners) = @_;
    my $spec = Narwhal::Listener::parse_spec($o->{status_listen});
    my $same = sub {
        my ($l) = @_;
        return 1 if grep { Narwhal::Listener::describe($_) eq Narwhal::Listener::describe($l) }
                    map { Narwhal::Listener::parse_spec($_) } @{ $o->{listen} || [] };
        return grep { Narwhal::Listener::overlaps($l, $_) } @$listeners;
    };
    die "--status-listen must not be one of the app's listeners\n" if $same->($spec);
    # SO_REUSEPORT: during a hand-over (Server::Starter, --reuse-port) the
    # new instance opens the same status address while the old one serves.
    # A unix socket gets --socket-mode and --socket-group, as the app's do:
    # without them it was left to the umask (0755: only root could connect,
    # so no scraper running as another user could read it).
    my $l = Narwhal::Listener::open_one($spec, { backlog => STATUS_BACKLOG, reuse_port => 1,
                                                 socket_mode => $o->{socket_mode},
                                                 socket_group => $o->{socket_group} });
    if ($same->($l)) {     # (a name, "localhost", is known by its address once bound)
        close $l->{handle};
        die "--status-listen must not be one of the app's listeners\n";
    }
    return $l;
}

# The connection manager is a C program, exec'd so that it holds nothing of
# Perl or the app. Three socketpairs, made once and held by the master for
# its whole life (so frames in flight outlive a manager): control, the
# handoff queue and the serve queue (the workers share the other end of
# both), which the manager gets as the descriptors src/shared/nw_frame.h names
# (Narwhal::Limits::MANAGER_*_FD). A fourth, the adopt queue, is the
# workers' alone (both ends): a leaving worker's parked connections go
# through it to the others (DESIGN.md, "Retirement"). docs/PROTOCOL.md.
sub _make_manager_sockets {
    my $self = shift;
    my %s;
    for my $pair ([qw(control_master control_manager)], [qw(handoff_worker handoff_manager)],
                  [qw(serve_manager serve_worker)], [qw(adopt_out adopt_in)]) {
        socketpair($s{ $pair->[0] }, $s{ $pair->[1] }, AF_UNIX, SOCK_SEQPACKET, 0)
            or die "socketpair: $!\n";
    }
    for my $end (qw(handoff_worker serve_worker adopt_out adopt_in)) {
        my $fl = fcntl($s{$end}, F_GETFL, 0) or die "fcntl: $!\n";
        fcntl($s{$end}, F_SETFL, $fl | O_NONBLOCK) or die "fcntl: $!\n";
    }
    $self->{sockets} = \%s;
}

sub _start_manager {
    my $self = shift;
    my $o = $self->{options};
    my $bin = Narwhal::manager_path()
        or die "cannot find the narwhal-manager program (run make), or use --no-manager\n";
    $self->_make_manager_sockets unless $self->{sockets};
    my $s = $self->{sockets};
    my @args = Narwhal::Options::manager_argv($o);
    # As for a worker (see _spawn): the master's handlers must not catch a
    # stop meant for the manager before it runs its own program.
    my $block = POSIX::SigSet->new(map { POSIX->can("SIG$_")->() } @FORK_BLOCKED);
    my $saved = POSIX::SigSet->new;
    POSIX::sigprocmask(POSIX::SIG_BLOCK(), $block, $saved);
    my $pid = fork;
    if ($pid // 1) {
        POSIX::sigprocmask(POSIX::SIG_SETMASK(), $saved);
        die "fork: $!\n" unless defined $pid;
    } else {
        $SIG{$_} = 'DEFAULT' for @FORK_BLOCKED;
        $SIG{USR1} = 'IGNORE';    # (until the program blocks it: a rotation now must not kill it)
        $SIG{HUP} = 'IGNORE';     # (so too a reload)
        POSIX::sigprocmask(POSIX::SIG_SETMASK(), $saved);
        Narwhal::log_role('manager');
        eval { push @args, $self->_place_manager_descriptors; 1 } or do {
            Narwhal::log_line(error => "cannot start: $@");
            POSIX::_exit(1);
        };
        # It reads request heads from the network: never as root. The
        # program is opened before the privileges go; when the user cannot
        # reach it by its path (a checkout under /root), it is run through
        # that descriptor. The path comes first: an exec through /proc
        # needs /proc, and a tool that follows execs (valgrind) cannot.
        open(my $program, '<', $bin) or do {
            Narwhal::log_line(error => "cannot open $bin: $!");
            POSIX::_exit(127);
        };
        eval { _drop_privileges($self->{ids}); 1 } or do {
            Narwhal::log_line(error => "cannot start: $@");
            POSIX::_exit(1);
        };
        {
            no warnings 'exec';
            exec { $bin } 'narwhal manager', @args;
            exec { '/proc/self/fd/' . fileno($program) } 'narwhal manager', @args if $!{EACCES};
        }
        Narwhal::log_line(error => "cannot run $bin: $!");
        POSIX::_exit(127);
    }
    $self->{manager} = { pid => $pid, started => Time::HiRes::time() };
}

# What the manager gets, by role: [the master's handle or fd, its number
# there] (docs/PROTOCOL.md, "Sockets").
sub _manager_descriptors {
    my $self = shift;
    my $s = $self->{sockets};
    my %to = (
        control    => [ $s->{control_manager}, Narwhal::Limits::MANAGER_CONTROL_FD() ],
        handoff    => [ $s->{handoff_manager}, Narwhal::Limits::MANAGER_HANDOFF_QUEUE_FD() ],
        serve      => [ $s->{serve_manager}, Narwhal::Limits::MANAGER_SERVE_QUEUE_FD() ],
        scoreboard => [ $self->{scoreboard}->fd, Narwhal::Limits::MANAGER_SCOREBOARD_FD() ],
        reader     => [ $s->{serve_worker}, Narwhal::Limits::MANAGER_SERVE_READER_FD() ],
    );
    $to{status} = [ $self->{status_listener}{fd}, Narwhal::Limits::MANAGER_STATUS_FD() ]
        if $self->{status_listener};
    my $n = 0;
    $to{"listener$n"} = [ $_->{fd}, Narwhal::Limits::MANAGER_LISTENERS_FD() + $n++ ]
        for grep { $n < Narwhal::Limits::MAX_LISTENERS() } @{ $self->{listeners} };
    return %to;
}

# In the manager's child: every descriptor onto its number (each moved out
# of the way first); returns the arguments that name them.
sub _place_manager_descriptors {
    my $self = shift;
    my %to = $self->_manager_descriptors;
    my $above = (sort { $b <=> $a } map { $_->[1] } values %to)[0] + 1;
    my %high = map { $_ => _dup_above($to{$_}[0], $above) } keys %to;
    POSIX::close($_->{fd}) for @{ $self->{listeners} };
    POSIX::dup2($high{$_}, $to{$_}[1]) // die "dup2: $!\n" for keys %to;
    POSIX::close($_) for values %high;
    return $self->_manager_descriptor_args(\%to);
}

sub _manager_descriptor_args {
    my ($self, $to) = @_;
    my @listeners = map { $to->{"listener$_"}[1] }
                    sort { $a <=> $b } map { /^listener(\d+)$/ ? $1 : () } keys %$to;
    my @tls = grep { $self->{listeners}[$_]{tls} } 0 .. $#listeners;
    return ('--scoreboard-fd', $to->{scoreboard}[1], '--serve-reader-fd', $to->{reader}[1],
            ($to->{status} ? ('--status-fd', $to->{status}[1]) : ()),
            (@listeners ? ('--listener-fds', join ',', @listeners) : ()),
            (@tls ? ('--tls-listeners', join(',', @tls), '--tls-threads',
                     List::Util::min($self->{cpus}{count}, Narwhal::Limits::TLS_MAX_THREADS())) : ()));
}

# A copy of a handle or fd numbered $min or more.
sub _dup_above {
    my ($h, $min) = @_;
    if (!ref $h) {
        open(my $fh, '+<&=', $h) or die "fd $h: $!\n";
        $h = $fh;
    }
    my $fd = fcntl($h, F_DUPFD, $min) or die "F_DUPFD: $!\n";
    return $fd + 0;
}

sub _manager_gone {
    my ($self, $status) = @_;
    my $m = delete $self->{manager};
    return if $self->{stop_deadline} || $self->{pending}{stop};
    my $how = $status & 127 ? "was killed by signal " . ($status & 127)
                            : "exited with status " . ($status >> 8);
    Narwhal::log_line(error => "connection manager $m->{pid} $how; starting a new one");
    $self->{scoreboard}->count_manager_restart;
    my $quick = Time::HiRes::time() - $m->{started} < QUICK_DEATH;
    $self->{manager_failures} = $quick ? ($self->{manager_failures} || 0) + 1 : 0;
    $self->{manager_restart_at} = Time::HiRes::time()
        + ($quick ? _backoff($self->{manager_failures} - 1) : 0);
}

sub _backoff {
    my ($n) = @_;
    my $delay = BACKOFF_FIRST * 2 ** $n;
    return $delay > BACKOFF_MAX ? BACKOFF_MAX : $delay;
}

sub _tend_manager {
    my $self = shift;
    if (my $m = $self->{manager}) {
        my $st = Narwhal::Channel::recv_stats(fileno $self->{sockets}{control_master});
        $self->{manager_stats} = $st if $st;
        return;
    }
    my $at = $self->{manager_restart_at} or return;
    return if $self->{stop_deadline} || Time::HiRes::time() < $at;
    delete $self->{manager_restart_at};
    eval { $self->_start_manager; 1 } or Narwhal::log_line(error => $@);
    $self->{manager_restart_at} = Time::HiRes::time() + BACKOFF_MAX unless $self->{manager};
}

sub _log_stats {
    my ($self, $said) = @_;
    my $st = $self->{manager_stats} or return Narwhal::log_line(info => "$said: no manager counts yet");
    Narwhal::log_line(info => "$said: manager " . join(' ', map { "$_=$st->{$_}" } sort keys %$st));
}

sub _user_ids {
    my ($o) = @_;
    my %ids;
    if (defined $o->{group}) {
        my $gid = $o->{group} =~ /^\d+$/ ? $o->{group} : getgrnam($o->{group});
        die "no such group '$o->{group}'\n" unless defined $gid;
        $ids{gid} = $gid;
    }
    if (defined $o->{user}) {
        my ($uid, $gid) = $o->{user} =~ /^\d+$/ ? ($o->{user}, undef)
                        : (getpwnam($o->{user}))[2, 3];
        die "no such user '$o->{user}'\n" unless defined $uid;
        $ids{uid} = $uid;
        $ids{gid} //= $gid if defined $gid;
    }
    return \%ids;
}

# Preloaded: load now, in the master. Delayed: make sure it loads (in a
# child, so the master stays small), then let each worker load its own.
sub _prepare_app {
    my $self = shift;
    return if $self->{app};
    if ($self->{options}{preload_app}) {
        my $app = eval { $self->{load_app}->() };
        die "cannot load the app: " . _first_line($@ || "it did not return a code reference") . "\n"
            unless ref $app;
        $self->{app} = $app;
        return;
    }
    # The child reports why the app does not load through a pipe, so that
    # the failure is still one line on stderr (from the master's die).
    pipe(my $r, my $w) or die "pipe: $!\n";
    my $pid = fork // die "fork: $!\n";
    if (!$pid) {
        close $r;
        my $ok = eval { ref $self->{load_app}->() };
        print $w _first_line($@ || 'it did not return a code reference') unless $ok;
        close $w;
        POSIX::_exit($ok ? 0 : 1);
    }
    close $w;
    my $why = do { local $/; <$r> } // '';
    close $r;
    waitpid($pid, 0);
    die "cannot load the app: " . (length $why ? $why : "its check exited with status " . ($? >> 8)) . "\n"
        if $?;
}

sub _first_line {
    my ($msg) = @_;
    $msg =~ s/\n.*//s;
    return $msg;
}

sub _write_pid {
    my $self = shift;
    my $file = $self->{options}{pid} or return;
    open(my $fh, '>', $file) or die "cannot write pid file $file: $!\n";
    print $fh "$$\n";
    close $fh;
}

sub _signals {
    my $self = shift;
    my $p = $self->{pending};
    # (and who sent it, as the C handler in front saw it: for the log)
    my $from = sub { $p->{from}{ $_[0] } = signal_sender(POSIX->can("SIG$_[0]")->()) };
    $SIG{$_} = do { my $s = $_; sub { $p->{stop} = $s; $from->($s) } } for qw(TERM INT QUIT);
    $SIG{HUP}  = sub { $p->{hup}++;  $from->('HUP') };
    $SIG{TTIN} = sub { $p->{ttin}++; $from->('TTIN') };
    $SIG{TTOU} = sub { $p->{ttou}++; $from->('TTOU') };
    $SIG{USR1} = sub { $p->{usr1}++; $from->('USR1') };
    $SIG{USR2} = sub { $p->{usr2}++; $from->('USR2') };
    $SIG{CHLD} = sub { };    # only to wake the manage loop
    $SIG{PIPE} = 'IGNORE';
    # Each of these also writes a byte to the wake pipe, from C, the moment
    # it arrives: the manage loop's sleep watches the pipe, so a signal that
    # comes after the loop's last look and before its sleep (a worker dying
    # while the master forks another) ends the sleep at once, instead of
    # waiting for Perl to run its handler after the sleep.
    pipe(my $wake_r, my $wake_w) or die "pipe: $!\n";
    for my $end ($wake_r, $wake_w) {
        my $fl = fcntl($end, F_GETFL, 0) or die "fcntl: $!\n";
        fcntl($end, F_SETFL, $fl | O_NONBLOCK) or die "fcntl: $!\n";
    }
    @$self{qw(wake_r wake_w)} = ($wake_r, $wake_w);
    $self->_wake_on_signals;
}

# The C handlers that write to the wake pipe. Perl's %SIG code replaces
# them (an app loaded in the master may assign or localise $SIG{CHLD}), so
# this runs again once the app is loaded; a handler still in place stays.
sub _wake_on_signals {
    my $self = shift;
    Narwhal::Master::wake_on_signals(fileno $self->{wake_w},
        map { POSIX->can("SIG$_")->() } qw(CHLD TERM INT QUIT HUP TTIN TTOU USR1 USR2))
        or die "narwhal: cannot install the master's signal handlers: $!\n";
}

# Sleep until $seconds pass or a signal comes (the wake pipe), then empty
# the pipe.
sub _sleep {
    my ($self, $seconds) = @_;
    my $r = $self->{wake_r};
    my $rin = '';
    vec($rin, fileno $r, 1) = 1;
    select($rin, undef, undef, $seconds);
    1 while sysread($r, my $drop, 512);
}

sub _announce {
    my $self = shift;
    my $first = $self->{listeners}[0];
    my @where = Narwhal::Listener::addresses(@{ $self->{listeners} });
    my $o = $self->{options};
    my $pool = defined $o->{min_workers} ? " (an elastic pool of $o->{min_workers} to $o->{max_workers})"
                                         : '';
    my $n = $self->{accepting};
    my $accepting = $n && $n < $o->{max_workers} ? ", $n accepting new clients (the rest stand by)" : '';
    my @tls = Narwhal::Listener::addresses(grep { $_->{tls} } @{ $self->{listeners} });
    my $tls = @tls ? "; TLS: relayed on @tls ($self->{kernel_tls})" : '';
    my $line = "listening on @where with " . $self->_wanted . " workers$pool$accepting"
             . " on " . _cpus_said($self->{cpus}) . " (generation $self->{generation})$tls";
    Narwhal::log_line(info => $line);
    $self->_to_caller(sub { Narwhal::log_line(info => $line) })
        if $self->{daemon} && !defined $o->{error_log} && !$self->{server_ready};
    if (my $ready = $self->{server_ready}) {
        # (a unix socket as Starman gives it: proto unix, the path as the port)
        my %where = defined $first->{path}
            ? (host => 'localhost', port => $first->{path}, proto => 'unix')
            : (host => $first->{host}, port => $first->{port}, proto => 'http');
        $self->_to_caller(sub { $ready->({ %where, server_software => 'Narwhal' }) });
    }
    $self->_daemon_says('ready');
}

# systemd (Type=notify): a datagram to $NOTIFY_SOCKET ("@name": the
# abstract namespace) of "KEY=value" lines. Never fatal: a server that
# cannot tell systemd goes on serving.
sub _notify {
    my ($self, @kv) = @_;
    my $path = $self->{notify_socket} or return;
    $path =~ s/^@/\0/;
    if (!$self->{notify_handle}) {
        socket(my $h, AF_UNIX, SOCK_DGRAM, 0) or return;
        $self->{notify_handle} = $h;
    }
    my $msg = '';
    while (my ($k, $v) = splice(@kv, 0, 2)) {
        $v =~ s/\n/ /g;
        $msg .= "$k=$v\n";
    }
    send($self->{notify_handle}, $msg, 0, pack_sockaddr_un($path))
        or $self->{notify_failed}++
        or Narwhal::log_line(warn => "cannot notify systemd at $self->{notify_socket}: $!");
}

# READY=1 once every worker of the current generation serves (its slot
# says idle or busy): at start, and after a HUP once the new generation
# has taken over (or was given up). A start whose workers never load
# (a crash loop) is never ready, and systemd's start timeout says so.
sub _tend_ready {
    my $self = shift;
    return if $self->{reload};
    my @current = $self->_staying;
    my $ready = grep { $self->_ready($_) } @current;
    my $state = $ready >= $self->_wanted ? 'ready' : 'starting';
    return if ($self->{notified} // '') eq $state || $state ne 'ready';
    $self->{notified} = $state;
    $self->{scoreboard}->set_ready;    # (/health: 200 from now on)
    $self->_notify(READY => 1, STATUS => "$ready worker(s) serving on "
                   . join(' ', Narwhal::Listener::addresses(@{ $self->{listeners} }))
                   . ($self->{manager} ? ', with the connection manager' : ''));
}

# --proxy-protocol trusts whoever sends the header: without --proxy-from,
# any client that reaches a TCP listener sets its own REMOTE_ADDR.
sub _warn_open_proxy {
    my $self = shift;
    my $o = $self->{options};
    return unless $o->{proxy_protocol} && !@{ $o->{proxy_from} || [] };
    my @tcp = Narwhal::Listener::addresses(grep { !defined $_->{path} } @{ $self->{listeners} });
    return unless @tcp;
    Narwhal::log_line(warn => "--proxy-protocol without --proxy-from: any client that can reach @tcp "
        . "can send its own PROXY header and so choose the REMOTE_ADDR the app sees; give the "
        . "balancer's addresses with --proxy-from, or make sure nothing else can connect");
}

# --min-workers grows the pool on waiting it can see: receive times and
# accept-queue lengths (TCP), or the manager. With neither, it would stay
# at its minimum: said at start.
sub _warn_blind_pool {
    my $self = shift;
    return unless defined $self->{pool} && !$self->{manager}
                  && !grep { $_->{is_tcp} } @{ $self->{listeners} };
    Narwhal::log_line(warn => "--min-workers with --no-manager on unix sockets only: no waiting "
        . "request can be seen, so the pool stays at $self->{pool} workers");
}

# --listen-queues asked for without the manager (see _listen_queues).
sub _warn_unmanaged_queues {
    my $self = shift;
    return if $self->{manager} || !grep { $_->{sibling} } @{ $self->{listeners} };
    Narwhal::log_line(warn => "--listen-queues $self->{options}{listen_queues} without the connection "
        . "manager: a client on one queue may wait for a busy worker that epoll told of it while "
        . "another worker is idle (nothing passes it on); 1 is the default here");
}

# Connections the workers refused under --proxy-protocol (a bad header, a
# peer outside --proxy-from; counted in the scoreboard): the first of
# PROXY_LOG_EVERY seconds is one line with its peer, the rest are summed
# up once the interval is over, never dropped silently.
my %PROXY_WHY = (bad_header  => 'no valid PROXY header (a client or a health check that does not '
                                . 'speak the PROXY protocol, or a balancer without send-proxy)',
                 not_allowed => 'its address is not in --proxy-from');
sub _log_proxy_refusals {
    my ($self, $now_anyway) = @_;
    my $board = $self->{scoreboard};
    my $t = $board->totals;
    my $n = $t->{proxy_bad_header} + $t->{proxy_not_allowed};
    my $p = $self->{proxy_log} ||= { seen => 0, until => 0, more => 0 };
    my $now = Time::HiRes::time();
    if ($n > $p->{seen}) {
        my $new = $n - $p->{seen};
        $p->{seen} = $n;
        my ($peer, $why) = @{ $board->proxy_last || [ 'unknown', 'bad_header' ] };
        if ($now >= $p->{until} && !$p->{more}) {
            Narwhal::log_line(warn => "refused a connection from $peer: $PROXY_WHY{$why}"
                                      . ($new > 1 ? ' (and ' . ($new - 1) . ' more)' : ''));
            $p->{until} = $now + PROXY_LOG_EVERY;
            return;
        }
        $p->{more} += $new;
        $p->{last} = "from $peer: $PROXY_WHY{$why}";
    }
    return unless $p->{more} && ($now_anyway || $now >= $p->{until});
    Narwhal::log_line(warn => "refused $p->{more} more connection(s) under --proxy-protocol in the "
                              . "last " . PROXY_LOG_EVERY . " s (the last $p->{last})");
    $p->{more} = 0;
    $p->{until} = $now + PROXY_LOG_EVERY;
}

# Signals first: a stop that arrived with the death of a child (the whole
# process group got Ctrl-C, or systemd's TERM) is a stop, not a crash to
# recover from.
sub _manage {
    my $self = shift;
    while (1) {
        $self->_handle_signals;
        $self->_tend_drain;
        $self->_reap;
        $self->_tend_manager;
        $self->_flush_crash_log;
        $self->_tend_crash_routes;
        $self->_log_proxy_refusals if $self->{options}{proxy_protocol};
        $self->_tend_reload;
        $self->_tend_ready if ($self->{notify_socket} || ($self->{notified} // '') ne 'ready')
                              && !$self->{stop_deadline} && !$self->{drain_until};
        if ($self->{stop_deadline}) {
            $self->_term_manager_again;
            $self->_stop_workers
                if !$self->{workers_stopped} && (!$self->{manager} || Time::HiRes::time() >= $self->{stop_workers_at});
            last unless %{ $self->{workers} } || $self->{manager};
            if (Time::HiRes::time() >= $self->{stop_deadline}) {
                $self->_kill_all('KILL');
                $self->_reap_within(KILL_REAP_WAIT);
                last;
            }
        } else {
            $self->_tend_replacements;
            $self->_tend_pool unless $self->{reload};
            $self->_spawn_missing;
        }
        $self->_watch_requests if $self->{options}{request_timeout};
        $self->_sleep($self->_sleep_for);
    }
}

sub _sleep_for {
    my $self = shift;
    my $now = Time::HiRes::time();
    my $wait = defined $self->{pool} ? POOL_TICK : MANAGE_TICK;
    for my $at ($self->{next_spawn}, $self->{stop_deadline} // 0, $self->{stop_workers_at} // 0,
                $self->{drain_until} // 0, $self->{stop_deadline} ? $self->{manager_term_again} // 0 : 0) {
        $wait = $at - $now if $at > $now && $at - $now < $wait;
    }
    return $wait;
}

# Reap what the KILL left, for at most $seconds.
sub _reap_within {
    my ($self, $seconds) = @_;
    my $until = Time::HiRes::time() + $seconds;
    while ((%{ $self->{workers} } || $self->{manager}) && Time::HiRes::time() < $until) {
        $self->_reap;
        select(undef, undef, undef, 0.01);
    }
}

# Every signal that changes the server leaves a line that names it and
# its sender (docs/SIGNALS.md, "The log").
sub _handle_signals {
    my $self = shift;
    my $p = $self->{pending};
    if (my $sig = delete $p->{stop}) {
        my $said = "$sig " . $self->_sender($sig);
        if ($self->{options}{drain_delay} && !$self->{drain_until} && !$self->{stop_deadline}) {
            $self->_begin_drain($said);
        } elsif (!$self->{stop_deadline}) {
            # a second stop signal does not wait for the drain
            $said .= ', during the drain' if delete $self->{drain_until};
            $self->_begin_stop($sig, $said);
        } else {
            Narwhal::log_line(info => "$said: stopping already");
        }
    }
    return if $self->{stop_deadline};
    $self->_restart_workers("HUP " . $self->_sender('HUP')) if delete $p->{hup};
    if (my $n = delete $p->{ttin}) {
        $self->{options}{max_workers} += $n;
        Narwhal::log_line(info => "TTIN " . $self->_sender('TTIN') . ": --max-workers "
                                  . ($self->{options}{max_workers} - $n) . " -> $self->{options}{max_workers}");
    }
    if (my $n = delete $p->{ttou}) {
        my $was = $self->{options}{max_workers};
        $self->_shrink($n);
        Narwhal::log_line(info => "TTOU " . $self->_sender('TTOU') . ": --max-workers $was -> "
                                  . $self->{options}{max_workers}
                                  . ($was == $self->{options}{max_workers} ? ' (never fewer than 1)' : ''));
    }
    $self->_publish_pool;
    $self->_log_stats("USR2 " . $self->_sender('USR2')) if delete $p->{usr2};
    $self->_reopen_logs("USR1 " . $self->_sender('USR1')) if delete $p->{usr1};
}

# "from pid 1234 (bash)", or the kernel when no process sent it (a
# terminal's Ctrl-C, a hang-up).
sub _sender {
    my ($self, $sig) = @_;
    my $pid = delete $self->{pending}{from}{$sig};
    return 'from the kernel (a terminal, say: no process sent it)' unless $pid;
    my $comm = '';
    if (open(my $fh, '<', "/proc/$pid/comm")) {
        $comm = <$fh> // '';
        chomp $comm;
    }
    return "from pid $pid" . (length $comm ? " ($comm)" : '');
}

# USR1 (logrotate): the master reopens the error log, as the user it runs
# as, and gives the new file to the workers' user, so that workers and the
# manager, which dropped privileges, can reopen it too (they could not
# create it in a root-owned directory), then tells them to: the workers
# reopen both logs, the manager its stderr.
sub _reopen_logs {
    my ($self, $said) = @_;
    my $o = $self->{options};
    if (defined $o->{error_log}) {
        if (!Narwhal::reopen_error_log($o)) {
            Narwhal::log_line(error => "$said: cannot reopen the error log $o->{error_log}: $!");
            return;
        }
        $self->_give_to_workers($o->{error_log});
    }
    eval { $self->_create_access_log; 1 } or Narwhal::log_line(error => $@);
    my @pids = keys %{ $self->{workers} };
    push @pids, $self->{manager}{pid} if $self->{manager} && defined $o->{error_log};
    kill USR1 => @pids;
    Narwhal::log_line(info => "$said: reopened the logs; told " . scalar(keys %{ $self->{workers} })
                              . ' worker(s)' . ($self->{manager} && defined $o->{error_log} ? ' and the manager' : ''));
}

# The workers write the access log as their user: the master makes the
# file (at start and on USR1, when the old one was moved away) and gives
# it to them; each worker opens it itself.
sub _create_access_log {
    my $self = shift;
    my $path = $self->{options}{access_log};
    return if !defined $path || $path eq '-';
    open(my $fh, '>>', $path) or die "cannot open the access log $path: $!\n";
    close $fh;
    $self->_give_to_workers($path);
}

sub _give_to_workers {
    my ($self, $path) = @_;
    my $ids = $self->{ids} || {};
    return unless defined $ids->{uid} || defined $ids->{gid};
    chown($ids->{uid} // -1, $ids->{gid} // -1, $path)
        or Narwhal::log_line(error => "cannot give $path to the workers' user: $!");
}

# --drain-delay: /health says 503 at once, so that load balancers take the
# instance out of their pools, while everything goes on serving; the
# graceful stop begins when the delay is over (or at a second stop signal).
sub _begin_drain {
    my ($self, $said) = @_;
    my $delay = $self->{options}{drain_delay};
    $self->_notify(STOPPING => 1, STATUS => "draining for $delay s, then stopping");
    $self->{drain_until} = Time::HiRes::time() + $delay;
    $self->{scoreboard}->set_stopping(1);
    Narwhal::log_line(info => "$said: draining for $delay s (/health answers 503), then stopping; "
                            . "a second signal stops now");
}

sub _tend_drain {
    my $self = shift;
    my $until = $self->{drain_until} or return;
    return if Time::HiRes::time() < $until;
    delete $self->{drain_until};
    $self->_begin_stop('TERM', 'the drain is over');
}

# A graceful stop. The manager goes first: it hands the requests that have
# arrived on the connections it holds to the workers, which are still
# serving, and closes the rest; then the workers stop (_stop_workers).
sub _begin_stop {
    my ($self, $sig, $said) = @_;
    # A stop during start-up: the workers start all the same (they get the
    # stop as soon as they can take it), or the clients already in the
    # listen queue would be reset when the listeners close.
    $self->_spawn_missing unless $self->{started_all};
    my $now = Time::HiRes::time();
    $self->{stop_deadline} = $now + $self->{options}{graceful_timeout};
    $self->{stop_began} = $now;
    Narwhal::log_line(info => "$said: stopping gracefully: " . scalar(keys %{ $self->{workers} })
                              . " worker(s) finish what has arrived (KILL after --graceful-timeout "
                              . "$self->{options}{graceful_timeout} s)");
    $self->_notify(STOPPING => 1, STATUS => 'stopping: answering what has arrived');
    $self->{scoreboard}->set_stopping(1);
    # No handshake completes from now on (SYNs are dropped, then refused
    # once the listeners close), and the workers drain the queues: a
    # client that reconnects after its Connection: close is refused,
    # never reset after sending its request.
    for my $l (grep { $_->{handle} } @{ $self->{listeners} }) {
        Narwhal::Listener::refuse_new($l)
            or Narwhal::log_line(error => "cannot stop new connections on " . Narwhal::Listener::describe($l) . ": $!");
        close $l->{handle};
    }
    if ($self->{manager}) {
        $self->_term_manager_again;
        $self->{stop_workers_at} = $now + MANAGER_STOP_WAIT;
    } else {
        $self->_stop_workers;
    }
}

# The stop's TERM to the manager, sent again until it exits: a signal
# already pending is not queued twice, so the master's TERM can merge with
# the one the whole group got (Ctrl-C, systemd), which the manager takes
# for another sender's and waits on (docs/SIGNALS.md).
sub _term_manager_again {
    my $self = shift;
    my $manager = $self->{manager} or return;
    my $now = Time::HiRes::time();
    return if $now < ($self->{manager_term_again} // 0);
    kill TERM => $manager->{pid};
    $self->{manager_term_again} = $now + MANAGER_TERM_AGAIN;
}

sub _stop_workers {
    my $self = shift;
    delete $self->{stop_workers_at};
    $self->{workers_stopped} = 1;
    kill TERM => keys %{ $self->{workers} };
}

# A generation retired by HUP whose last worker has left: one line.
sub _tell_generation_end {
    my ($self, $gen) = @_;
    return unless $self->{retiring} && $self->{retiring}{$gen};
    return if grep { $_->{generation} == $gen } values %{ $self->{workers} };
    delete $self->{retiring}{$gen};
    Narwhal::log_line(info => "generation $gen finished: its last worker has left");
}

# The stop is over: one line, and the summaries that were counting lines
# (worker deaths, refused PROXY connections) written now, not lost.
sub _tell_stopped {
    my $self = shift;
    return unless $self->{stop_began};
    $self->_flush_crash_log(1);
    $self->_log_proxy_refusals(1) if $self->{options}{proxy_protocol};
    my $killed = $self->{killed_at_deadline} // 0;
    my $left = scalar keys %{ $self->{workers} };
    Narwhal::log_line(info => sprintf("stopped in %.1f s: generation %d finished%s", Time::HiRes::time() - $self->{stop_began},
                                      $self->{generation},
                                      $killed || $left ? ", $killed worker(s) killed at --graceful-timeout"
                                                         . ($left ? " ($left not yet reaped)" : '')
                                                       : ', every worker left on its own'));
}

sub _kill_all {
    my ($self, $sig) = @_;
    if ($sig eq 'KILL') {
        $_->{killed_at_deadline} = 1 for values %{ $self->{workers} };
        Narwhal::log_line(warn => "connection manager $self->{manager}{pid} killed (KILL) at "
                                  . "--graceful-timeout $self->{options}{graceful_timeout} s")
            if $self->{manager};
    }
    kill $sig => keys %{ $self->{workers} }, ($self->{manager} ? $self->{manager}{pid} : ());
}

# HUP: a new generation of workers; the old one is retired only once a new
# worker is ready (it has loaded the app: its scoreboard slot says idle).
# If the new code cannot start, the new generation is given up and the old
# one goes on serving: a reload of broken code is not an outage.
sub _restart_workers {
    my ($self, $said) = @_;
    $self->{notified} = 'reloading';
    $self->_notify(RELOADING => 1, STATUS => 'reloading: starting a new generation of workers',
                   MONOTONIC_USEC => int(Time::HiRes::clock_gettime(Time::HiRes::CLOCK_MONOTONIC()) * 1e6));
    # (the manager reads the TLS certificate pair again: renewed files
    # serve the connections made from now on)
    kill HUP => $self->{manager}{pid} if $self->{manager} && Narwhal::Listener::wants_tls($self->{options});
    my @old = grep { !$self->{workers}{$_}{leaving} } keys %{ $self->{workers} };
    $self->{generation}++;
    $self->{failures} = 0;
    $self->{next_spawn} = 0;
    $self->{reload} = { generation => $self->{generation}, old => \@old };
    Narwhal::log_line(info => "$said: starting generation $self->{generation} (" . $self->_wanted
                              . " workers); the " . scalar(@old) . " worker(s) running go on until "
                              . "one of them is ready");
    $self->_spawn_missing;
}

sub _tend_reload {
    my $self = shift;
    my $r = $self->{reload} or return;
    my $ready = grep { $_->{generation} == $r->{generation} && $self->_ready($_) }
                values %{ $self->{workers} };
    return unless $ready;
    delete $self->{reload};
    my @old = grep { $self->{workers}{$_} } @{ $r->{old} };
    my %gens = map { $self->{workers}{$_}{generation} => 1 } @old;
    $self->{retiring}{$_} = 1 for keys %gens;
    Narwhal::log_line(info => "generation $r->{generation} serves; retiring "
                              . (%gens ? 'generation ' . join(', ', sort { $a <=> $b } keys %gens) . ' (' : '(')
                              . scalar(@old) . " worker(s))");
    $self->_retire(@old);
}

# A worker is ready once it has loaded the app: its slot says idle or busy.
sub _ready {
    my ($self, $w) = @_;
    return defined $w->{slot} && $self->{scoreboard}->slot($w->{slot})->{state} =~ /^(?:idle|busy)$/;
}

# A worker of a new generation died before it could serve: the new code
# does not start. Back to the old generation, which never stopped.
sub _abandon_reload {
    my ($self, $pid, $how) = @_;
    my $r = delete $self->{reload};
    Narwhal::log_line(error => "the new workers cannot start (worker $pid $how): generation "
                             . "$r->{generation} given up; the workers already running go on");
    my @new = grep { $self->{workers}{$_}{generation} == $r->{generation} } keys %{ $self->{workers} };
    $self->{workers}{$_}{leaving} = 1 for @new;
    kill TERM => @new if @new;
    $self->{generation} = $r->{generation} - 1;
    $self->{failures} = 0;
}

# Workers that leave while the server goes on get USR2: they finish what
# they are serving and give their idle connections to the manager.
sub _retire {
    my ($self, @pids) = @_;
    $_->{leaving} = 1 for grep { $_ } @{ $self->{workers} }{@pids};
    kill(($self->{manager} ? 'USR2' : 'TERM') => @pids) if @pids;
}

# TTOU: --max-workers goes down by $n (never below 1; an elastic pool's
# bounds follow), and the newest workers beyond what is wanted now leave.
sub _shrink {
    my ($self, $n) = @_;
    $self->_tend_replacements;  # (one that asked for its successor is not to be chosen)
    my $o = $self->{options};
    $n = $o->{max_workers} - 1 if $n > $o->{max_workers} - 1;
    return if $n <= 0;
    $o->{max_workers} -= $n;
    if (defined $self->{pool}) {
        $o->{min_workers} = $o->{max_workers} if $o->{min_workers} > $o->{max_workers};
        $self->{pool} = $o->{max_workers} if $self->{pool} > $o->{max_workers};
    }
    my $w = $self->{workers};   # (standby workers first, then the newest)
    my @current = sort { ($w->{$b}{standby} // 0) <=> ($w->{$a}{standby} // 0)
                         || $w->{$b}{started} <=> $w->{$a}{started} } $self->_staying_pids;
    my $excess = @current - $self->_wanted;
    $self->_retire(@current[0 .. $excess - 1]) if $excess > 0;
}

# The workers kept running now: --max-workers, or the elastic pool's size.
sub _wanted {
    my $self = shift;
    return $self->{pool} // $self->{options}{max_workers};
}

sub _publish_pool {
    my $self = shift;
    my $o = $self->{options};
    $self->{scoreboard}->set_workers_wanted($self->_wanted);
    $self->{scoreboard}->set_pool($o->{min_workers} // $o->{max_workers}, $o->{max_workers});
}

# The elastic pool (--min-workers; docs/DESIGN.md, "The elastic pool"): one
# worker more when, since the last look, requests waited longer than
# POOL_GROW_WAIT_MS for a worker (POOL_GROW_BLOCKING_WAIT_MS while requests
# block, POOL_GROW_STANDBY_WAIT_MS while some stand by; at least one, and
# POOL_GROW_SHARE percent of those that began)
# and no standby worker is idle, or every worker is stuck on a request;
# one less when a worker has been idle for --worker-idle-timeout.
sub _tend_pool {
    my $self = shift;
    my $o = $self->{options};
    return unless defined $self->{pool};
    my $board = $self->{scoreboard};
    my $blocks = $self->_requests_block;
    my $over_ms = $blocks               ? Narwhal::Limits::POOL_GROW_BLOCKING_WAIT_MS()
                : $self->_standby_count ? Narwhal::Limits::POOL_GROW_STANDBY_WAIT_MS()
                :                         Narwhal::Limits::POOL_GROW_WAIT_MS();
    my ($all, $over) = $board->waits($over_ms);
    # (a new threshold: counts from here on)
    my ($all0, $over0, $ms0) = @{ $self->{pool_waits} || [] };
    ($all0, $over0) = ($all, $over) unless defined $ms0 && $ms0 == $over_ms;
    $self->{pool_waits} = [ $all, $over, $over_ms ];
    my $now = Time::HiRes::time();
    my ($began, $waited) = ($all - $all0, $over - $over0);
    if ($self->{pool} < $o->{max_workers} && $now >= ($self->{next_grow} // 0)
        && $self->_ready_count >= $self->{pool}) {   # (the last ones added serve already)
        # (a standby worker idle: the waits were the manager's look, 20 to
        # 30 ms before it hands new clients to them, not a pool too small;
        # while requests block, any worker idle: the pool has more than its
        # clients keep busy, and a 1 ms wait was a moment's bad luck)
        if ($waited > 0 && $waited * 100 >= $began * Narwhal::Limits::POOL_GROW_SHARE()
            && !($blocks ? $self->_idle_count : $self->_standby_idle)) {
            # as many more as the share that waited: all of them, twice the pool
            my $by = int($self->{pool} * $waited / ($began || 1) + 0.5) || 1;
            return $self->_resize_pool($by, 0, sprintf('%d of %d requests waited over %d ms',
                                                      $waited, $began, $over_ms));
        }
        if ($self->_clients_wait_unseen) {
            return $self->_resize_pool(1, 1, sprintf('every worker has been on its request for '
                                                     . '%d ms and new clients wait',
                                                     Narwhal::Limits::POOL_STUCK_MS()));
        }
    }
    return if $self->{pool} <= $o->{min_workers} || $now < ($self->{next_shrink} // 0);
    # (never while requests wait: a worker idle then only had none handed
    # to it yet, and the others' clients would wait longer without it)
    return if $waited > 0;
    my ($idlest, $idle_ms) = (undef, $o->{worker_idle_timeout} * 1000);
    my @staying = grep { defined $self->{workers}{$_}{slot} } $self->_staying_pids;
    # (standby workers go first: an accepting one only when none is left)
    my $standby_left = grep { $self->{workers}{$_}{standby} } @staying;
    for my $pid (@staying) {
        my $w = $self->{workers}{$pid};
        next if $standby_left && !$w->{standby};
        my $ms = $board->slot($w->{slot})->{idle_ms};
        ($idlest, $idle_ms) = ($pid, $ms) if $ms >= $idle_ms;
    }
    return unless defined $idlest;
    $self->_resize_pool(-1, 2, sprintf('worker %d was idle for %.1f s', $idlest, $idle_ms / 1000));
    $self->_retire($idlest);
}

# Whether the requests of a worker of the current generation block (its
# slot says so: DESIGN.md, "Requests that block"): another worker then
# costs the CPUs nothing.
sub _requests_block {
    my $self = shift;
    my $board = $self->{scoreboard};
    return scalar grep { defined $_->{slot} && $board->slot($_->{slot})->{blocking} } $self->_staying;
}

# Standby workers (--accepting-workers) of the current generation that
# stand by now (one whose requests block accepts: its slot says so); those
# of them idle.
sub _standby {
    my $self = shift;
    my $board = $self->{scoreboard};
    return grep { $_->{standby} && defined $_->{slot} && $board->slot($_->{slot})->{standby} }
                $self->_staying;
}
sub _standby_count { my @standby = $_[0]->_standby; return scalar @standby }
sub _idle_count {
    my $self = shift;
    my $board = $self->{scoreboard};
    return scalar grep { defined $_->{slot} && $board->slot($_->{slot})->{state} eq 'idle' }
                       $self->_staying;
}
sub _standby_idle {
    my $self = shift;
    my $board = $self->{scoreboard};
    return scalar grep { $board->slot($_->{slot})->{state} eq 'idle' } $self->_standby;
}

# Every worker is stuck on a request, and new clients wait for one: in a
# listen queue (TCP), or taken by the manager since the last look. (Stuck
# alone is one slow client: another worker would sit idle.)
sub _clients_wait_unseen {
    my $self = shift;
    my $accepted = ($self->{manager_stats} || {})->{accepted} // 0;
    my $taken = $accepted > ($self->{pool_accepted} // $accepted);
    $self->{pool_accepted} = $accepted;
    return 0 unless $self->{scoreboard}->pool_stuck(Narwhal::Limits::POOL_STUCK_MS());
    return 1 if $taken;
    return scalar grep { $_->{is_tcp} && Narwhal::Listener::accept_queue($_->{fd}) > 0 }
                       @{ $self->{listeners} };
}

sub _resize_pool {
    my ($self, $by, $reason, $why) = @_;
    my $from = $self->{pool};
    my $max = $self->{options}{max_workers};
    $by = $max - $from if $from + $by > $max;
    $self->{pool} += $by;
    my $next = Time::HiRes::time() + ($self->{options}{spawn_interval} || POOL_TICK);
    $self->{$by > 0 ? 'next_grow' : 'next_shrink'} = $next;     # one at a time
    $self->{scoreboard}->count_pool_change($reason);
    $self->_publish_pool;
    Narwhal::log_line(info => "pool: $from -> $self->{pool} workers: $why");
}

# Workers of the current generation, staying, that serve (loaded: idle or
# busy in the scoreboard): the elastic pool grows again only once the
# workers it added are ready, or a slow-loading app (--no-preload-app)
# would see requests wait while they load and double the pool again and
# again up to --max-workers.
sub _ready_count {
    my $self = shift;
    return scalar grep { $self->_ready($_) } $self->_staying;
}

sub _current_count { my @staying = $_[0]->_staying_pids; return scalar @staying }

# The workers of the current generation that stay (not leaving, not being
# replaced): their pids, or the workers themselves.
sub _staying_pids {
    my $self = shift;
    my $w = $self->{workers};
    return grep { $w->{$_}{generation} == $self->{generation} && !$w->{$_}{leaving}
                  && !$w->{$_}{replaced} } keys %$w;
}
sub _staying { my $self = shift; my @w = @{ $self->{workers} }{ $self->_staying_pids }; return @w }

# A worker near its --max-reqs-per-child says so in its slot (and wakes
# this loop): it is replaced now, before it leaves, so that its successor
# is ready to adopt its connections ("Retirement" in docs/DESIGN.md), at
# most REPLACE_AT_ONCE at a time. One that has not left REPLACE_LINGER
# later (fewer requests than its last twentieth in that time) is retired,
# but only while the pool is whole without it: a replacement that cannot
# start (new code on disk that is broken) leaves it serving.
sub _tend_replacements {
    my $self = shift;
    my $now = Time::HiRes::time();
    my ($board, @lingering, @asking) = $self->{scoreboard};
    my $replaced = 0;
    for my $pid (keys %{ $self->{workers} }) {
        my $w = $self->{workers}{$pid};
        next if $w->{leaving} || !defined $w->{slot};
        if ($w->{replaced}) {
            $replaced++;
            push @lingering, $pid if $now - $w->{replaced} >= REPLACE_LINGER;
        } elsif ($w->{generation} == $self->{generation}
                 && $board->slot($w->{slot})->{exit_reason} eq 'max-requests') {
            push @asking, $w;
        } elsif ($w->{generation} == $self->{generation} && $self->_past_lifetime($w, $now)) {
            $w->{lifetime} = 1;
            $w->{pid} = $pid;
            push @asking, $w;
        }
    }
    my $room = REPLACE_AT_ONCE - $replaced;
    for my $w ($room > 0 ? splice(@asking, 0, $room) : ()) {
        $w->{replaced} = $now;
        next unless $w->{lifetime};
        # It will not leave on its own: retired as soon as its successor
        # is ready (as a recycled worker that lingers is), not 10 s later.
        $w->{replaced} = $now - REPLACE_LINGER;
        push @lingering, $w->{pid};
        Narwhal::log_line(info => sprintf("worker %d is %.0f s old, over --max-worker-lifetime %s; "
                                          . "replacing it", $w->{pid}, $now - $w->{started},
                                          $self->{options}{max_worker_lifetime}));
    }
    return unless @lingering;
    $self->_retire(@lingering) if $self->_ready_count >= $self->_wanted;
}

# --max-worker-lifetime: a worker older than the limit (plus up to 10%,
# drawn once per worker, so that workers started together do not all
# leave together) is replaced as one at its --max-reqs-per-child is.
sub _past_lifetime {
    my ($self, $w, $now) = @_;
    my $limit = $self->{options}{max_worker_lifetime} or return 0;
    $w->{expires} //= $w->{started} + $limit * (1 + rand(LIFETIME_JITTER));
    return $now >= $w->{expires};
}

sub _spawn_missing {
    my $self = shift;
    my $want = $self->_wanted;
    while ($self->_current_count < $want) {
        my $now = Time::HiRes::time();
        return if $now < $self->{next_spawn};
        $self->_spawn;
        my $interval = $self->{options}{spawn_interval};
        $self->{next_spawn} = $now + $interval if $interval && $self->{started_all};
    }
    $self->{started_all} = 1;
}

# The scoreboard (src/shared/nw_scoreboard.c): a slot per worker in shared
# memory, where a worker notes each request it begins and ends. The master
# reads a dead worker's slot to know whether it had served anything and
# what it was serving.
sub _open_scoreboard {
    my $self = shift;
    $self->{scoreboard} = Narwhal::Scoreboard->new(Narwhal::Limits::SCOREBOARD_SLOTS());
    $self->_publish_pool;
    $self->{free_slots} = [ 0 .. Narwhal::Limits::SCOREBOARD_SLOTS() - 1 ];
}

# A new worker accepts while fewer than --accepting-workers of the current
# generation that are staying do: so the replacement of an accepting
# worker accepts, and the workers added beyond them stand by.
sub _next_is_standby {
    my $self = shift;
    my $n = $self->{accepting} or return 0;
    my $accepting = grep { !$_->{standby} } $self->_staying;
    return $accepting >= $n ? 1 : 0;
}

sub _spawn {
    my $self = shift;
    my $slot = shift @{ $self->{free_slots} || [] };
    my $standby = $self->_next_is_standby;
    $self->{scoreboard}->claim($slot, 0, $self->{generation}, $standby) if defined $slot;
    my $block = POSIX::SigSet->new(map { POSIX->can("SIG$_")->() } @FORK_BLOCKED);
    my $saved = POSIX::SigSet->new;
    POSIX::sigprocmask(POSIX::SIG_BLOCK(), $block, $saved);
    my $pid = fork;
    if (!defined $pid) {
        unshift @{ $self->{free_slots} }, $slot if defined $slot;
        POSIX::sigprocmask(POSIX::SIG_SETMASK(), $saved);
        Narwhal::log_line(error => "fork failed: $!");
        $self->{next_spawn} = Time::HiRes::time() + 1;
        return;
    }
    if ($pid) {
        $self->{workers}{$pid} = { generation => $self->{generation}, standby => $standby,
                                   started => Time::HiRes::time(), slot => $slot };
        POSIX::sigprocmask(POSIX::SIG_SETMASK(), $saved);
        return;
    }
    $self->_become_worker($saved, $slot, $standby);
}

sub _become_worker {
    my ($self, $saved_mask, $slot, $standby) = @_;
    $0 = "narwhal worker";
    Narwhal::log_role('worker');
    # A stop or retire sent before the worker has its own handlers (while
    # it loads the app, say) is kept for it, not lost and not fatal.
    my @early;
    $SIG{$_} = 'DEFAULT' for @FORK_BLOCKED, 'CHLD';
    $SIG{$_} = do { my $sig = $_; sub { push @early, $sig } } for qw(TERM INT QUIT USR2 USR1);
    POSIX::sigprocmask(POSIX::SIG_SETMASK(), $saved_mask) if $saved_mask;
    my $s = $self->{sockets} || {};
    close $s->{$_} for grep { $s->{$_} } qw(control_master control_manager handoff_manager
                                             serve_manager);
    close $self->{status_listener}{handle} if $self->{status_listener};    # the manager's alone
    close $self->{wake_r} if $self->{wake_r};   # the master's (see _signals); a worker
                                                # writes to wake_w when it wants a replacement
    eval {
        _drop_privileges($self->{ids});
        Narwhal::Worker->new(
            options      => $self->{options},
            listeners    => $self->{listeners},
            app          => $self->{app},
            load_app     => $self->{load_app},
            early_signals => \@early,
            master_pid    => $self->{pid},
            wake_master   => $self->{wake_w},
            scoreboard    => $self->{scoreboard},
            score_slot    => $slot,
            standby       => $standby,
            serve_queue   => $s->{serve_worker} ? fileno($s->{serve_worker}) : -1,
            handoff_queue => $s->{handoff_worker} ? fileno($s->{handoff_worker}) : -1,
            adopt_queue   => $s->{adopt_in} ? [ fileno($s->{adopt_in}), fileno($s->{adopt_out}) ] : undef,
        )->run;
        1;
    } or Narwhal::log_line(error => $@);
    POSIX::_exit(1);
}

sub _drop_privileges {
    my ($ids) = @_;
    if (defined $ids->{gid}) {
        POSIX::setgid($ids->{gid}) or die "setgid($ids->{gid}): $!\n";
        $) = "$ids->{gid} $ids->{gid}";
    }
    if (defined $ids->{uid}) {
        POSIX::setuid($ids->{uid}) or die "setuid($ids->{uid}): $!\n";
    }
}

sub _reap {
    my $self = shift;
    while ((my $pid = waitpid(-1, POSIX::WNOHANG())) > 0) {
        my $status = $?;
        if ($self->{manager} && $pid == $self->{manager}{pid}) {
            $self->_manager_gone($status);
            next;
        }
        my $w = delete $self->{workers}{$pid} or next;
        $self->_worker_gone($pid, $w, $status);
    }
}

# A worker that had begun a request is replaced at once, whatever killed
# it: a URL that crashes its worker must not empty the pool. Only a
# worker that dies before it serves anything (an app that does not load, a
# broken set-up) counts as a failed start, and those back off.
sub _worker_gone {
    my ($self, $pid, $w, $status) = @_;
    my $score = defined $w->{slot} ? $self->{scoreboard}->slot($w->{slot}) : {};
    if (defined $w->{slot}) {
        $self->{scoreboard}->release($w->{slot});
        # the lowest free slot goes to the next worker: the metrics label
        # workers by slot, and this keeps them to about --max-workers series
        @{ $self->{free_slots} } = sort { $a <=> $b } @{ $self->{free_slots} }, $w->{slot};
    }
    if ($self->{reload} && $w->{generation} == $self->{reload}{generation} && $status != 0
        && !($score->{started} // 0) && ($score->{state} // '') ne 'idle') {
        return $self->_abandon_reload($pid, $status & 127 ? "was killed by signal " . ($status & 127)
                                                          : "exited with status " . ($status >> 8));
    }
    $self->_tell_generation_end($w->{generation});
    if ($w->{killed_at_deadline} && ($status & 127) == 9) {
        my $what = ($score->{state} // '') eq 'busy'
            ? sprintf(' while serving %s (for %.1f s)', $score->{request}, ($score->{running_ms} // 0) / 1000)
            : ($score->{started} // 0) ? ' between requests' : ' before serving a request';
        Narwhal::log_line(warn => "worker $pid killed (KILL) at --graceful-timeout "
                                  . "$self->{options}{graceful_timeout} s$what");
        $self->{killed_at_deadline}++;
        return;
    }
    my $died = ($status != 0 || _exited_on_its_own($status, $score)) && !$w->{leaving} && !$w->{watchdog};
    $self->_log_death($pid, $status, $score) if $died;
    $self->_charge_route($score->{request})
        if $died && ($score->{state} // '') eq 'busy' && !$self->{stop_deadline}
        && (!($status & 127) || $CRASH_SIGNAL{ $status & 127 });
    $self->_count_restart($w, $status, $score) unless $self->{stop_deadline};
    return if $self->{stop_deadline} || $w->{generation} != $self->{generation};
    my $served = ($score->{started} // 0) > 0;
    if ($status != 0 && !$served && Time::HiRes::time() - $w->{started} < QUICK_DEATH) {
        $self->{next_spawn} = Time::HiRes::time() + _backoff($self->{failures}++);
    } else {
        $self->{failures} = 0;
    }
}

# --crash-backoff: a worker died serving $request (a crash signal or an
# exit; not KILL or TERM, which come from outside). The route ("METHOD
# path") is watched from its first death: workers count the requests to
# it that begin. It is answered 503 for a back-off when it has killed
# CRASH_COUNT workers in CRASH_WINDOW seconds and at least half the
# requests to it since it was watched (a busy route that kills a few is
# not a crash loop), or kills one again within twice its last back-off
# after it ended; the back-off starts at --crash-backoff and doubles (up to
# CRASH_BACKOFF_MAX) while it goes on. One line each time.
sub _charge_route {
    my ($self, $request) = @_;
    my $first = $self->{options}{crash_backoff} or return;
    (my $route = $request // '') =~ s/\?.*//s;
    return unless length $route;
    my $sb = $self->{scoreboard};
    my $now = Time::HiRes::time();
    my $r = $self->{crash_routes}{$route} ||= do {
        my $entry = $sb->watch_route($route);
        return if $entry < 0;       # every entry is taken: it runs on
        { entry => $entry, times => [], deaths => 0, base => -1, backoff => 0, until => 0 };
    };
    return if $now < $r->{until};   # a request that began before its back-off did
    $r->{times} = [ (grep { $_ > $now - CRASH_WINDOW } @{ $r->{times} }), $now ];
    $r->{deaths}++;
    my $requests = $sb->route_started($r->{entry}) - $r->{base};
    $requests = $r->{deaths} if $requests < $r->{deaths};    # (begun before it was watched)
    my $again = $r->{backoff} && $now < $r->{until} + 2 * $r->{backoff};
    return unless ($again || @{ $r->{times} } >= CRASH_COUNT) && 2 * $r->{deaths} >= $requests;
    $r->{backoff} = $again ? _min($r->{backoff} * 2, CRASH_BACKOFF_MAX) : $first;
    $r->{until} = $now + $r->{backoff};
    $sb->block_route($r->{entry}, $r->{backoff} * 1000);
    Narwhal::log_line(warn => sprintf("%s killed %s: answered 503 for %s s, then tried again", $route,
        $again ? 'a worker again after its back-off'
               : sprintf('%d workers in %d s (%d of its %d requests)', scalar @{ $r->{times} },
                         CRASH_WINDOW, $r->{deaths}, $requests),
        $r->{backoff}));
    ($r->{times}, $r->{deaths}, $r->{base}) = ([], 0, $sb->route_started($r->{entry}));
}

sub _min { $_[0] < $_[1] ? $_[0] : $_[1] }

# Routes that stopped killing workers are no longer watched.
sub _tend_crash_routes {
    my $self = shift;
    my $routes = $self->{crash_routes} or return;
    my $now = Time::HiRes::time();
    for my $route (keys %$routes) {
        my $r = $routes->{$route};
        next if $now <= $r->{until} + 2 * $r->{backoff} || grep { $_ > $now - CRASH_WINDOW } @{ $r->{times} };
        $self->{scoreboard}->unwatch_route($r->{entry});
        delete $routes->{$route};
    }
}

# A worker that exited 0 without its way out having said why: something
# in the process called exit (the app, most likely, in a request).
sub _exited_on_its_own {
    my ($status, $score) = @_;
    return $status == 0 && ($score->{exit_reason} // '') eq '' && ($score->{pid} // 0);
}

# Why a worker that left is replaced (narwhal_worker_restarts_total). A
# worker retired by TTOU is not replaced, nor one of a reload given up.
sub _count_restart {
    my ($self, $w, $status, $score) = @_;
    my $sb = 'Narwhal::Scoreboard';
    my $reason = $score->{exit_reason} // '';
    my $code = $w->{lifetime} && !($status & 127)        ? $sb->RESTART_LIFETIME
             : $w->{watchdog} || $reason eq 'watchdog' ? $sb->RESTART_WATCHDOG
             : $reason eq 'memory'                      ? $sb->RESTART_MEMORY
             : $reason eq 'max-requests' && !$status    ? $sb->RESTART_MAX_REQUESTS   # (said early:
                                                              # a replaced worker may crash yet)
             : $w->{leaving} || $reason eq 'retired'    ? ($w->{generation} != $self->{generation}
                                                            ? $sb->RESTART_SIGNAL : return)
             : ($status & 127) && !$CRASH_SIGNAL{ $status & 127 } ? $sb->RESTART_SIGNAL
             : $status != 0                             ? $sb->RESTART_CRASH
             : _exited_on_its_own($status, $score)      ? $sb->RESTART_EXIT
             :                                            $sb->RESTART_SIGNAL;
    return if $w->{generation} != $self->{generation} && $code != $sb->RESTART_SIGNAL;
    $self->{scoreboard}->count_restart($code);
}

# --request-timeout: a request running longer gets its worker XCPU (its
# Perl handler logs a backtrace, answers 504 and exits); still there a
# second later, XCPU again (a C handler does the same without Perl: the app
# is in C code); still there, KILL. DESIGN.md, "The operator layer".
sub _watch_requests {
    my $self = shift;
    my $limit_ms = $self->{options}{request_timeout} * 1000;
    my $now = Time::HiRes::time();
    for my $pid (keys %{ $self->{workers} }) {
        my $w = $self->{workers}{$pid};
        next unless defined $w->{slot};
        my $score = $self->{scoreboard}->slot($w->{slot});
        my $d = $w->{watchdog};
        if ($d && $d->{started} == $score->{started} && $score->{state} ne 'idle') {
            next if $now < $d->{at} + WATCHDOG_GRACE || $d->{step} >= 3;
            $d->{step}++;
            $d->{at} = $now;
            kill(($d->{step} == 2 ? 'XCPU' : 'KILL') => $pid);
            next;
        }
        next unless $score->{state} eq 'busy' && $score->{running_ms} >= $limit_ms;
        Narwhal::log_line(error => sprintf("worker %d: %s has run for %.1f s, over --request-timeout %s; "
                                           . "ending it", $pid, $score->{request}, $score->{running_ms} / 1000,
                                           $self->{options}{request_timeout}));
        $w->{watchdog} = { started => $score->{started}, at => $now, step => 1 };
        kill XCPU => $pid;
    }
}

# One line for the first death in CRASH_LOG_EVERY seconds, with the request
# the worker was running; the rest are counted and summed up once the
# interval is over (_flush_crash_log), never dropped silently.
sub _log_death {
    my ($self, $pid, $status, $score) = @_;
    my $how = $status & 127 ? "was killed by signal " . ($status & 127)
            : $status          ? "exited with status " . ($status >> 8)
            :                    'exited with status 0 on its own (did the app call exit?)';
    my $what = ($score->{state} // '') eq 'busy' ? " while serving $score->{request}"
             : ($score->{started} // 0) ? ' between requests' : ' before serving a request';
    if (!($score->{started} // 0)) {    # a failed start: the backoff paces these
        Narwhal::log_line(error => "worker $pid $how$what");
        return;
    }
    my $c = $self->{crashes} ||= { until => 0, more => 0 };
    my $now = Time::HiRes::time();
    if ($now >= $c->{until}) {
        $self->_flush_crash_log(1);
        Narwhal::log_line(error => "worker $pid $how$what");
        $c->{until} = $now + CRASH_LOG_EVERY;
    } else {
        $c->{more}++;
        $c->{last} = "$how$what";
    }
}

sub _flush_crash_log {
    my ($self, $now_anyway) = @_;
    my $c = $self->{crashes} or return;
    return unless $c->{more} && ($now_anyway || Time::HiRes::time() >= $c->{until});
    Narwhal::log_line(error => "$c->{more} more worker(s) died in the last " . CRASH_LOG_EVERY
                             . " s (the last $c->{last})");
    $c->{more} = 0;
}

sub _cleanup {
    my $self = shift;
    my $file = $self->{options}{pid};
    if ($file && open(my $fh, '<', $file)) {
        my $pid = <$fh>;
        close $fh;
        unlink $file if defined $pid && $pid =~ /^$$\b/;
    }
    for my $l (@{ $self->{listeners} }) {
        Narwhal::Listener::remove_owned_path($l) unless $ENV{SERVER_STARTER_PORT};
    }
}

1;
__END__

=head1 NAME

Narwhal::Master - the master process of Narwhal

=head1 DESCRIPTION

Internal. Opens the listeners, loads the app (unless C<--no-preload-app>),
forks C<--max-workers> workers and keeps them alive, backing off when they
die at once. See L<Narwhal/SIGNALS> and F<docs/SIGNALS.md>.

=cut
