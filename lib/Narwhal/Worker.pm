package Narwhal::Worker;
use strict;
use warnings;
use Narwhal ();
use Narwhal::Input ();
use Narwhal::Options ();
use Narwhal::Writer ();
use POSIX ();
use Scalar::Util ();
use Time::HiRes ();

# A worker process: accepts connections itself (accept4, no lock) and serves
# their requests one after the other. The C side (Narwhal::Acceptor::serve,
# xs/serve.c) reads each request into $env, calls the app and writes the
# common response; this file is the loop around it and what a request
# needs of Perl: other response shapes, streaming, cleanup handlers.

use constant WAIT          => Narwhal::for_tests(WORKER_WAIT => 1.0);
                                      # the longest wait before the worker looks at its flags
                                      # (and, idle, writes its buffered access log lines)
use constant STOP_SERVE_MS => Narwhal::for_tests(STOP_SERVE_MS => undef);
                                      # a stopping worker's drain (undef: the C side's
                                      # NW_STOP_SERVE_MS)
use constant RECYCLE_TURN_MS => Narwhal::for_tests(RECYCLE_TURN_MS => undef);
                                      # a recycling turn held this long is free (undef:
                                      # the C side's NW_RECYCLE_TURN_MAX_MS)
use constant EXIT_APP_LOAD => 70;     # the app did not load in this worker
use constant REPLACE_AHEAD => 20;     # a recycled worker asks for its replacement with
                                      # 1/REPLACE_AHEAD of its requests left (under
                                      # REPLACE_AHEAD requests: at the end, as it leaves)

# This process's acceptor (weak: it lives as long as its worker), whose
# access log the END block closes whatever way the worker exits.
my $process_acceptor;

sub new {
    my ($class, %args) = @_;
    my $self = bless { %args }, $class;
    my $o = $self->{options};
    $self->{limit} = _request_limit($o);
    $self->{keepalive} = !$o->{disable_keepalive} && $o->{max_keepalive_reqs} > 1;
    return $self;
}

sub _request_limit {
    my ($o) = @_;
    my $max = $o->{max_reqs_per_child} or return 0;
    my $min = $o->{min_reqs_per_child};
    return $max unless defined $min && $min < $max;
    return $min + int(rand($max - $min + 1));
}

sub run {
    my $self = shift;
    $self->_signals;
    $self->_load_app unless $self->{app};
    my $acceptor = $self->{acceptor} = Narwhal::Acceptor->new(
        # (a TLS listener is the manager's: fd -1 keeps its index, for the
        # connections the manager relays; docs/DESIGN.md, "HTTPS")
        [ map { { %$_, ($_->{tls} ? (fd => -1) : ()), env => $self->_env_template($_) } }
              @{ $self->{listeners} } ],
        Narwhal::Options::c_config($self->{options}),
        $self->{serve_queue} // -1, $self->{handoff_queue} // -1,
        \&_io_handle,
    );
    # The stop and retire signals never interrupt the app (a sleep, a
    # blocking call): they wait until the worker is between requests.
    $acceptor->defer_signals(map { POSIX->can("SIG$_")->() } qw(TERM INT QUIT USR1 USR2));
    $acceptor->life_signal($_) for @{ delete $self->{stops_before_acceptor} || [] };
    $acceptor->note_stop_sender(map { POSIX->can("SIG$_")->() } qw(TERM INT QUIT));
    # A crash in the app costs only its own request: the parked
    # connections go to the other workers (or the manager) first.
    $acceptor->hand_off_on_crash;
    # Leaving, its parked connections go to the other workers (and theirs
    # come here): DESIGN.md, "Retirement".
    $acceptor->adopt_queue(@{ $self->{adopt_queue} }) if $self->{adopt_queue};
    # --accepting-workers: a standby worker leaves new clients to the
    # accepting ones and serves what the manager gives it (DESIGN.md,
    # "Accepting workers").
    $acceptor->standby if $self->{standby};
    $acceptor->proxy_from($_) for @{ $self->{options}{proxy_from} || [] };
    my $board = $self->{scoreboard};
    $board = undef unless $board && defined $self->{score_slot};
    if ($board) {
        $board->attach($self->{score_slot});
        $acceptor->count_in_scoreboard($board, $self->{score_slot});  # (its requests, adoptions)
    }
    my $access_log = defined $self->{options}{access_log};
    $acceptor->access_log_open($self->{options}{access_log},
                               $self->{options}{access_log_format} eq 'json') if $access_log;
    $acceptor->access_log_forwarded(@{ $self->{options}{forwarded_from} || [] })
        if $access_log && $self->{options}{access_log_client} eq 'forwarded';
    $process_acceptor = $acceptor;
    Scalar::Util::weaken($process_acceptor);
    # --request-timeout: the master's XCPU; a C handler in front of the
    # Perl one takes a second XCPU when the app is stuck outside Perl.
    Narwhal::Acceptor::arm_watchdog($acceptor, POSIX::SIGXCPU())
        if $self->{options}{request_timeout};
    my $keepalive = $self->{keepalive};
    my $managed = $self->{managed} = $acceptor->has_manager && $keepalive;
    my $limit = $self->{limit};
    my $ahead = int($limit / REPLACE_AHEAD);
    # (with the manager only: a worker without one that is retired closes
    # its idle connections, where one at its count says Connection: close)
    my $replace_at = $board && $self->{wake_master} && $managed && $ahead ? $limit - $ahead : 0;
    # (the master's pid as the master knew it: one that died while this
    # worker was setting up must still be noticed)
    my $master = $self->{master_pid} // getppid();
    # The current connection ($self->{conn}, which psgix.informational and
    # the watchdog read) is this hash slot's own scalar, which the C side
    # writes through a reference. Whether the worker leaves, why, and what
    # it served are the C worker's own (Narwhal::Acceptor::life): its stop
    # signals are read there, and what Perl decides goes there by stop.
    $self->{conn} = undef;
    Narwhal::Acceptor::serve_setup($acceptor, $self, $self->{app}, \$self->{conn}, {
        limit => $limit, replace_at => $replace_at, keepalive => $keepalive ? 1 : 0,
        managed => $managed ? 1 : 0, quantum => $self->{options}{worker_quantum},
        rss_limit_mb => $self->{options}{max_worker_rss} || 0, idle_wait => WAIT,
        min_lifetime => $self->{options}{min_worker_lifetime} || 0,
        recycle_turn_ms => RECYCLE_TURN_MS,
        wake_master_fd => $self->{wake_master} ? fileno($self->{wake_master}) : -1 });
    # serve (xs/serve.c, "One request in C" in docs/DESIGN.md) serves
    # requests one after the other: the current connection's next one,
    # taking the next connection first when there is none, letting each
    # connection go (parked, handed to the manager, closed) as it must. It
    # calls this object back for what is not common (respond,
    # _after_request, _reopen_logs), and returns when no
    # connection came within WAIT or the worker must leave. What is left
    # here is what happens then: idle time, and leaving.
    my $draining;
    while (1) {
        my $r = Narwhal::Acceptor::serve($acceptor);
        if ($r == Narwhal::Acceptor::SERVE_IDLE) {    # no connection came within WAIT
            $acceptor->access_log_tick if $access_log;    # what is buffered goes out
            Narwhal::Acceptor::deliver_signals($acceptor);
            $self->_leave_if_orphaned($master);
            next;
        }
        # SERVE_LEAVING: stopping, or at the request limit. When the server
        # stops, first serve (with Connection: close) what has arrived:
        # clients in the listen queue, connections in the serve queue,
        # parked ones with a request. Nothing the kernel accepted is reset.
        last unless $acceptor->life->{closing};
        $draining++ or $self->_drain($acceptor);
        $self->{conn} = Narwhal::Acceptor::next_conn($acceptor, 0)
            or $self->_server_stops_too($acceptor)      # (then another drain)
            or last;
    }
    # Parked connections: a recycled or retired worker gives them to the
    # manager; when the server stops they are closed.
    # (always a reason: a worker that exits 0 with none said left from
    # elsewhere, an app's exit, and the master logs it)
    my $life = $acceptor->life;
    $board->leaving($self->{score_slot}, $life->{exit_reason} || Narwhal::Scoreboard::EXIT_STOPPED())
        if $board;
    $acceptor->release_parked($life->{closing} ? Narwhal::Acceptor::STOP : Narwhal::Acceptor::RETIRE);
    $acceptor->access_log_close if $access_log;
    $self->_exit(0);
}

# The worker stops: what is queued is served, for the drain's window.
sub _drain {
    my ($self, $acceptor) = @_;
    my $sender = Narwhal::Acceptor::stop_sender();
    $self->{stopped_from_outside} = $sender >= 0 && $sender != ($self->{master_pid} // getppid());
    Narwhal::Acceptor::drain($acceptor, defined STOP_SERVE_MS ? STOP_SERVE_MS : ());
}

# A stop that was not the master's: Ctrl-C and systemd signal the whole
# process group, and an operator may TERM one worker. The listeners are
# every worker's and the master's, so this worker does not touch them: the
# master, signalled too, begins its stop at once and refuses new handshakes
# from then on. Once the drain's window is over, this worker waits up to
# NW_GROUP_STOP_WAIT_MS (src/shared/nw_limits.h) for that (the board says it) and then drains once more,
# for the clients whose handshake completed before the master's refusal,
# which no one else may accept. A worker stopped alone finds no stop and
# leaves; the master replaces it. (Each worker used to refuse new
# handshakes itself: after a TERM to one worker, the whole server took no
# new client.) Returns 1 when it drains again.
sub _server_stops_too {
    my ($self, $acceptor) = @_;
    my $board = $self->{scoreboard};
    return 0 if !$self->{stopped_from_outside} || $self->{saw_server_stop} || !$board;
    my $until = Time::HiRes::time() + Narwhal::Limits::GROUP_STOP_WAIT_MS() / 1000;
    Time::HiRes::sleep(0.005) until $board->stopping || Time::HiRes::time() >= $until;
    return 0 unless $board->stopping;
    $self->{saw_server_stop} = 1;
    Narwhal::Acceptor::drain($acceptor, defined STOP_SERVE_MS ? STOP_SERVE_MS : ());
    return 1;
}

# Whatever way the worker exits (an app calling exit included): the park
# watcher thread (src/worker/nw_worker.c), which reads the parked connections'
# objects, stops before Perl's global destruction frees them, and the
# parked connections go to the manager rather than die with the worker.
END {
    Narwhal::Acceptor::leave_process() if defined &Narwhal::Acceptor::leave_process;
    # (summed-up log lines still counting, a stop must not lose them)
    Narwhal::Log::flush_limited() if defined &Narwhal::Log::flush_limited;
    $process_acceptor->access_log_close if $process_acceptor;
}

# --request-timeout: the master's XCPU, run by Perl at the next safe point
# inside the app (the statement after a sleep, the next turn of a busy
# loop). Where the app is goes to the log; the client gets 504 unless its
# response began; the parked connections go to the manager; the worker
# exits at once, without unwinding the app.
sub _request_timed_out {
    my $self = shift;
    my $score = $self->{scoreboard} && defined $self->{score_slot}
        ? $self->{scoreboard}->slot($self->{score_slot}) : {};
    # A signal sent for a request that ended meanwhile (the master looked
    # just before) must not end the next one, nor count as a first signal.
    if (%$score && !($score->{state} eq 'busy'
                     && $score->{running_ms} >= $self->{options}{request_timeout} * 1000 - 100)) {
        Narwhal::Acceptor::watchdog_rearm();
        return;
    }
    Narwhal::log_line(error => join "\n",
        "request timeout (--request-timeout $self->{options}{request_timeout}): "
        . ($score->{request} || 'a request') . ' was stopped', _app_backtrace());
    my $answered = Narwhal::Acceptor::watchdog_end($self->{acceptor}, $self->{conn});
    Narwhal::log_line(error => ($answered ? 'answered 504' : 'its response had begun: closed')
                             . "; the worker is replaced");
    Narwhal::Acceptor::leave_process();
    POSIX::_exit(Narwhal::Scoreboard::WORKER_EXIT_WATCHDOG());
}

# From a signal handler: where the app was, innermost first, down to the
# worker's call of the app (the server's own frames say nothing).
sub _app_backtrace {
    my @lines;
    for (my $i = 2; my @c = caller($i); $i++) {    # 0, 1: this sub and the handler
        last if $c[1] =~ m{Narwhal/Worker\.pm\z} && @lines;
        push @lines, @lines ? "  $c[3] called at $c[1] line $c[2]" : "  at $c[1] line $c[2]";
    }
    return @lines;
}

# Nothing to serve for a while: a worker whose master is gone leaves.
sub _leave_if_orphaned {
    my ($self, $master) = @_;
    $self->{acceptor}->stop(1) if getppid() != $master;
}

# USR1 (the master's, after log rotation): both logs are reopened. (Read
# by the C worker from its signalfd once signals are deferred.)
sub _reopen_logs {
    my $self = shift;
    Narwhal::reopen_error_log($self->{options})
        or Narwhal::log_line(error => "cannot reopen the error log: $!");
    !$self->{acceptor} || $self->{acceptor}->access_log_reopen
        or Narwhal::log_line(error => "cannot reopen the access log: $!");
}

sub _signals {
    my $self = shift;
    # The handlers run between requests only (see defer_signals in run).
    # The listeners stay open until what is queued on them is served.
    # Once the signals are deferred, the C worker reads these from its
    # signalfd itself (nw_worker_life_signal); the handlers catch what
    # comes before, for the acceptor's life once it exists.
    my $stop = sub {
        my $signo = POSIX->can("SIG$_[0]")->();
        if (my $acceptor = $self->{acceptor}) {
            $acceptor->life_signal($signo);
        } else {
            push @{ $self->{stops_before_acceptor} }, $signo;
        }
    };
    # TERM, INT, QUIT: the server stops, idle connections are closed.
    # USR2 (from the master on HUP and TTOU, and to a replaced worker that
    # has not reached its count 10 s later): this worker retires while the
    # server goes on, so its idle connections go to the other workers (or
    # the manager).
    $SIG{$_} = $stop for qw(TERM INT QUIT USR2);
    $SIG{$_} = 'IGNORE' for qw(HUP TTIN TTOU PIPE);
    # USR1 (the master's, after log rotation): both logs are reopened.
    $SIG{USR1} = sub { $self->_reopen_logs };
    # what arrived before these handlers (see Master's _become_worker); a
    # rotation then (the access log is not open yet) reopens the error log
    my @early = @{ $self->{early_signals} || [] };
    $stop->($_) for grep { $_ ne 'USR1' } @early;
    Narwhal::reopen_error_log($self->{options}) if grep { $_ eq 'USR1' } @early;
    $SIG{CHLD} = 'DEFAULT';
    $SIG{XCPU} = sub { $self->_request_timed_out } if $self->{options}{request_timeout};
}

sub _load_app {
    my $self = shift;
    my $app = eval { $self->{load_app}->() };
    unless (ref $app eq 'CODE' || Scalar::Util::blessed($app)) {
        my $err = $@ || "the app did not return a code reference\n";
        Narwhal::log_line(error => "cannot load the app: $err");
        POSIX::_exit(EXIT_APP_LOAD);
    }
    $self->{app} = $app;
}

sub _exit {
    my ($self, $code) = @_;
    my $hook = $self->{options}{child_exit};
    eval { $hook->($self, $code) } if $hook;
    exit $code;
}

sub _env_template {
    my ($self, $listener) = @_;
    return {
        SCRIPT_NAME            => '',
        'psgi.version'         => [ 1, 1 ],
        'psgi.url_scheme'      => 'http',
        'psgi.errors'          => *STDERR,
        'psgi.input'           => Narwhal::Input->new(''),
        'psgi.multithread'     => !!0,
        'psgi.multiprocess'    => !!1,
        'psgi.run_once'        => !!0,
        'psgi.nonblocking'     => !!0,
        'psgi.streaming'       => !!1,
        'psgix.input.buffered' => !!1,
        'psgix.harakiri'       => !!1,
        'psgix.cleanup'        => !!1,
        'psgix.informational'  => sub { $self->{conn} && $self->{conn}->informational(@_) },
        %{ Narwhal::Listener::env_template($listener) },    # (https on a TLS listener)
    };
}

# psgix.io, made on first use (xs/env.c calls it): a dup of the client socket.
sub _io_handle {
    my ($conn) = @_;
    open(my $io, '+<&', $conn->fd) or return undef;
    return $io;
}

# Called by serve (xs/serve.c) for a body spilled to a temp file.
# Called by serve when C cannot tell that there is nothing to do after the
# response. Inside an eval: the app may have locked $env, tied its values
# or deleted the handlers, and none of that may stop the worker. No
# reference to the handlers' array may outlive this, or the $env clean
# could not empty it for reuse.
sub _after_request {
    my ($self, $env) = @_;
    eval {
        $self->_after_response($env)
            if (do { my $h = $env->{'psgix.cleanup.handlers'}; ref $h eq 'ARRAY' && @$h })
               || exists $env->{'psgix.harakiri.commit'};
        1;
    } or _log_error($env, "after the response: $@");
    return;
}

sub _after_response {
    my ($self, $env) = @_;
    my $handlers = eval { $env->{'psgix.cleanup.handlers'} };
    my @handlers = ref $handlers eq 'ARRAY' ? @$handlers : ();    # a copy: a handler may empty the array
    for my $handler (@handlers) {
        eval { $handler->($env); 1 } or _log_error($env, "cleanup handler died: $@");
    }
    if (eval { exists $env->{'psgix.harakiri.commit'} && $env->{'psgix.harakiri.commit'} }) {
        $self->{acceptor}->stop(0, Narwhal::Scoreboard::EXIT_MAX_REQUESTS());    # the app's own limit
    }
}

# Write what the app returned (anything but the common case, which the
# request loop writes itself), or a 500 when it died ($err) or returned
# nonsense. Returns true when the connection may serve another request.
sub respond {
    my ($self, $conn, $env, $res, $may_keep, $err) = @_;
    if (!defined $res) {
        _log_error($env, $err || "the app returned undef\n");
        return _internal_error($conn);
    }
    if (ref $res eq 'ARRAY') {
        my $kept = eval { $self->_write_response($conn, $res, $may_keep) };
        return $kept if defined $kept;
        _log_error($env, $@);
        return _internal_error($conn) unless $conn->response_started;
        $conn->abandon;    # cut short: it must not look complete
        return 0;
    }
    if (ref $res eq 'CODE') {
        return $self->_stream($conn, $env, $res, $may_keep);
    }
    _log_error($env, "the app returned a " . (ref $res || 'plain scalar') . ", not a PSGI response\n");
    return _internal_error($conn);
}

sub _write_response {
    my ($self, $conn, $res, $may_keep) = @_;
    my ($status, $headers, $body) = @$res;
    die "invalid PSGI response: want [status, headers, body]\n"
        unless @$res == 3 && defined $status && $status =~ /^\d{3}$/;
    if (ref $body eq 'ARRAY') {
        my $kept = $conn->write_response($status, $headers, $body, $may_keep);
        die "invalid PSGI response headers\n" if $kept < 0;
        return $kept;
    }
    die "invalid PSGI response body\n" unless defined $body && ref $body;
    return _write_handle($conn, $status, $headers, $body, $may_keep);
}

sub _write_handle {
    my ($conn, $status, $headers, $body, $may_keep) = @_;
    # (C decides what sendfile may send: the same test as the common case's)
    my ($fd, $offset, $len) = Narwhal::Conn::sendfile_source($body);
    if (defined $fd) {
        _start($conn, $status, $headers, $len, $may_keep);
        $conn->send_file($fd, $offset, $len);
    } else {
        _start($conn, $status, $headers, -1, $may_keep);
        local $/ = \65536;
        while (defined(my $chunk = $body->getline)) {
            last unless $conn->write_body($chunk);
        }
    }
    $body->close;
    return $conn->end_body;
}

sub _start {
    my ($conn, $status, $headers, $len, $may_keep) = @_;
    $conn->start_response($status, $headers, $len, $may_keep) >= 0
        or die "invalid PSGI response headers\n";
}

# psgi.streaming: the app gets a responder; with [status, headers] it gets a
# writer back.
sub _stream {
    my ($self, $conn, $env, $delayed, $may_keep) = @_;
    my ($responded, $kept) = (0, 0);
    my $writer;
    my $responder = sub {
        my ($res) = @_;
        die "the responder was called twice\n" if $responded++;
        if (@$res == 3) {
            $kept = $self->_write_response($conn, $res, $may_keep);
            return;
        }
        die "invalid PSGI response: want [status, headers]\n"
            unless @$res == 2 && defined $res->[0] && $res->[0] =~ /^\d{3}$/;
        _start($conn, $res->[0], $res->[1], -1, $may_keep);
        $writer = Narwhal::Writer->new($conn, sub { $kept = $_[0] });
        return $writer;
    };
    my $ok = eval { $delayed->($responder); 1 };
    if (!$ok) {
        _log_error($env, $@);
        return _internal_error($conn) unless $responded;
        # The response started and will not be finished: it must look cut
        # short (no last chunk, fewer bytes than Content-Length), never
        # complete. The writer, wherever the app left it, writes nothing more.
        $conn->abandon;
        $writer->[0] = undef if $writer;
        return 0;
    }
    # The app kept the socket (psgix.io) or never answered: close it.
    return 0 unless $responded;
    $writer->close if $writer && $writer->[0];
    return $kept;
}

sub _internal_error {
    my ($conn) = @_;
    return 0 if $conn->response_started;
    $conn->write_response(500, [ 'Content-Type' => 'text/plain' ],
                          [ "Internal Server Error\n" ], 0);
    return 0;
}

sub _log_error {
    my ($env, $err) = @_;
    $err = "unknown error\n" unless defined $err && length $err;
    $err .= "\n" unless $err =~ /\n\z/;
    my $where = eval { ($env->{REQUEST_METHOD} || '?') . ' ' . ($env->{REQUEST_URI} || '?') } // '? ?';
    Narwhal::log_line(error => "$where: $err");
}

1;
__END__

=head1 NAME

Narwhal::Worker - the request loop of a Narwhal worker process

=head1 DESCRIPTION

Internal. Each worker accepts connections on every listener with
C<accept4>; C<Narwhal::Acceptor::serve> (C) reads each request, runs the
PSGI app and writes an array response in one C<writev>; this module writes
the others: file handles with C<sendfile>, other bodies through
C<getline>, streamed responses through L<Narwhal::Writer>. See
F<docs/DESIGN.md>, "One request in C".

=cut
