#!/usr/bin/perl
# Fault injection: every fault and operation an operator meets, against
# Narwhal and (as the anchor) Starman, with clients that count every
# request's outcome and never retry. Prints one table: scenario, server,
# requests sent, answered, failed, reset. The goal for Narwhal is 0 failed
# and 0 reset in every row except the crash rows, where only the requests
# that hit the crashing URL may fail.
#
#   perl xt/faults.pl [--servers narwhal,starman] [--only NAME,...] [--seconds 6]
#
# Not part of the test suite (about two minutes). Starman comes from
# Debian's starman package; a server that is not installed is skipped.
use strict;
use warnings;
use FindBin qw($RealBin);
use lib "$RealBin/../t/lib";
use File::Temp ();
use Getopt::Long qw(GetOptions);
use IO::Select ();
use IO::Socket::INET ();
use POSIX ();
use Socket qw(IPPROTO_TCP TCP_NODELAY);
use Time::HiRes qw(time sleep);
use NarwhalTest qw(free_port write_app root perl_cmd wait_until worker_pids children_of);
use NarwhalTest::Clients ();

my %opt = (servers => 'narwhal,starman', seconds => 6);
GetOptions(\%opt, 'servers=s', 'only=s', 'seconds=f') or die "usage: see the top of $0\n";
$SIG{PIPE} = 'IGNORE';
my $ROOT = root();
my $TMP = File::Temp::tempdir('narwhal-faults-XXXXXX', TMPDIR => 1, CLEANUP => 1);


# /          a small answer
# /sleep?S   sleeps S seconds (one sleep call: a signal would cut it short)
# /segv      the worker dies of SIGSEGV
# /exit      the app calls exit
my $APP = write_app(<<'APP');
use strict;
use Time::HiRes ();
sub {
    my $env = shift;
    my $p = $env->{PATH_INFO};
    kill SEGV => $$ if $p eq '/segv';
    exit 0 if $p eq '/exit';
    my $slept = 0;
    if ($p eq '/sleep') {
        my $t0 = Time::HiRes::time();
        Time::HiRes::sleep($env->{QUERY_STRING} || 1);
        $slept = Time::HiRes::time() - $t0;
    }
    [200, ['Content-Type' => 'text/plain'], [sprintf "ok %d slept=%.2f\n", $$, $slept]];
}
APP

my %SERVERS = (
    narwhal => sub {
        my ($port, @extra) = @_;
        return (perl_cmd(), "$ROOT/bin/narwhal", '--listen', "127.0.0.1:$port",
                '--max-workers', 4, @extra, $APP);
    },
    starman => sub {
        my ($port, @extra) = @_;
        my ($bin) = grep { -x } map { "$_/starman" } split /:/, $ENV{PATH};
        return unless $bin;
        return ($^X, $bin, '--listen', "127.0.0.1:$port", '--workers', 4, @extra, $APP);
    },
);

# ---------------------------------------------------------------- clients

# (NarwhalTest::Clients: keep-alive GETs that never retry.)
sub start_clients { NarwhalTest::Clients::start_clients($TMP, @_) }
sub collect { NarwhalTest::Clients::collect(@_) }

# ---------------------------------------------------------------- servers

sub start_server {
    my ($name, %how) = @_;
    my $port = free_port();
    my @cmd = $SERVERS{$name}->($port, @{ $how{extra} || [] }) or return;
    if ($how{starter}) {    # under Server::Starter: it holds the port, HUP restarts the server
        my ($ss) = grep { -x } map { "$_/start_server" } split /:/, $ENV{PATH};
        return unless $ss;
        my @args = grep { !/^(?:--listen|127\.0\.0\.1:\d+)$/ } @cmd;
        @cmd = ($^X, $ss, '--port', "127.0.0.1:$port", '--signal-on-hup', 'TERM', '--', @args);
    }
    my $log = "$TMP/$name-$port.log";
    my $pid = fork // die "fork: $!";
    if (!$pid) {
        POSIX::setsid();
        open(STDOUT, '>', $log); open(STDERR, '>&', \*STDOUT);
        exec @cmd or POSIX::_exit(127);
    }
    my $up = wait_until(sub { IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port) }, 20);
    return { pid => $pid, port => $port, log => $log, name => $name, up => !!$up };
}

sub stop_server {
    my ($s) = @_;
    kill TERM => -$s->{pid};
    wait_until(sub { waitpid($s->{pid}, POSIX::WNOHANG()) == $s->{pid} }, 10)
        or do { kill KILL => -$s->{pid}; waitpid($s->{pid}, 0) };
}

sub workers_of {
    my ($s) = @_;
    return $s->{name} eq 'narwhal' ? worker_pids($s->{pid}) : children_of($s->{pid});
}

# Narwhal's connection manager (none for the others).
sub manager_of {
    my ($s) = @_;
    return unless $s->{name} eq 'narwhal';
    for my $pid (children_of($s->{pid})) {
        open(my $f, '<', "/proc/$pid/cmdline") or next;
        my $cmd = do { local $/; <$f> } // '';
        return $pid if $cmd =~ /^narwhal manager/;
    }
    return;
}

# $n connections that each make one request, then stay open and quiet.
sub idle_connections {
    my ($port, $n) = @_;
    my @c;
    for (1 .. $n) {
        my $c = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port) or next;
        syswrite($c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
        my $buf = '';
        while (sysread($c, $buf, 4096, length $buf)) { last if $buf =~ /\r\n\r\nok/ }
        push @c, $c;
    }
    return @c;
}

# How many of them the server closed (end-of-stream or an error now).
sub closed_of {
    my @c = @_;
    my $closed = 0;
    for my $c (@c) {
        my $sel = IO::Select->new($c);
        next unless $sel->can_read(0);
        my $n = sysread($c, my $buf, 4096);
        $closed++ unless $n;
    }
    return $closed;
}

# ---------------------------------------------------------------- scenarios

my @SCENARIOS = (
    [ crash_url => 'a URL that crashes its worker (4 clients on /segv, 20 normal clients)', sub {
        my ($s) = @_;
        my @bad = start_clients($s->{port}, 4, '/segv', $opt{seconds});
        my @good = start_clients($s->{port}, 20, '/', $opt{seconds});
        collect(@bad);
        return collect(@good);
    } ],
    [ kill_worker => 'kill -9 of a worker every second (20 keep-alive clients)', sub {
        my ($s) = @_;
        my @c = start_clients($s->{port}, 20, '/', $opt{seconds});
        for (1 .. int $opt{seconds} - 1) {
            sleep 1;
            my @w = workers_of($s);
            kill KILL => $w[rand @w] if @w;
        }
        return collect(@c);
    } ],
    [ kill_worker_30 => 'kill -9 of a worker every second (30 keep-alive clients; target: failed + reset <= the kills)', sub {
        my ($s) = @_;
        my @c = start_clients($s->{port}, 30, '/', $opt{seconds});
        my $kills = 0;
        for (1 .. int $opt{seconds} - 1) {
            sleep 1;
            my @w = workers_of($s);
            $kills += kill KILL => $w[rand @w] if @w;
        }
        my $r = collect(@c);
        $r->{note} = "$kills kills";
        return $r;
    } ],
    [ kill_manager => 'kill -9 of the manager every second (30 keep-alive clients, 200 idle connections; target: 0 failed; the idle ones closed, a documented limit)', sub {
        my ($s) = @_;
        return { seconds => 'no manager' } unless $s->{name} eq 'narwhal';
        my @idle = idle_connections($s->{port}, 200);
        sleep 1;    # (quiet for --keepalive-wait: they are the manager's now)
        my @c = start_clients($s->{port}, 30, '/', $opt{seconds});
        my $kills = 0;
        for (1 .. int $opt{seconds} - 1) {
            sleep 1;
            my $m = manager_of($s);
            $kills += kill KILL => $m if $m;
        }
        my $r = collect(@c);
        $r->{note} = sprintf '%d kills; idle connections closed: %d of %d', $kills, closed_of(@idle),
                             scalar @idle;
        return $r;
    } ],
    [ app_exit => 'the app calls exit (1 client on /exit, 20 normal clients)', sub {
        my ($s) = @_;
        my @bad = start_clients($s->{port}, 1, '/exit', $opt{seconds});
        my @good = start_clients($s->{port}, 20, '/', $opt{seconds});
        collect(@bad);
        return collect(@good);
    } ],
    [ hup => 'HUP every second (20 keep-alive clients)', sub {
        my ($s) = @_;
        my @c = start_clients($s->{port}, 20, '/', $opt{seconds});
        for (1 .. int $opt{seconds} - 1) { sleep 1; kill HUP => $s->{pid} }
        return collect(@c);
    } ],
    [ starter_restart => 'Server::Starter: 5 restarts (HUP to start_server) under 50 keep-alive clients', sub {
        my ($s) = @_;
        my @c = start_clients($s->{port}, 50, '/', 7);
        for (1 .. 5) { sleep 1.2; kill HUP => $s->{pid} }
        return collect(@c);
    }, 0, 'starter' ],
    [ stop_queued => 'TERM with 4 requests in flight and 4 clients queued', sub {
        my ($s) = @_;
        my @busy = start_clients($s->{port}, 4, '/sleep?1', 3, 1);
        sleep 0.3;
        my @queued = start_clients($s->{port}, 4, '/', 3, 1);
        sleep 0.3;
        kill TERM => $s->{pid};
        return collect(@busy, @queued);
    }, 'stops' ],
    [ term_in_app => 'TERM to the master while a request sleeps 2 s in the app: how long it slept', sub {
        my ($s) = @_;
        my $c = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $s->{port}) or return { seconds => 'no connection' };
        syswrite($c, "GET /sleep?2 HTTP/1.1\r\nHost: x\r\n\r\n");
        sleep 0.3;
        kill TERM => $s->{pid};
        my $buf = '';
        while (sysread($c, $buf, 4096, length $buf)) { last if $buf =~ /slept=/ }
        my ($slept) = $buf =~ /slept=([\d.]+)/;
        return { seconds => defined $slept ? "slept $slept" : 'no answer' };
    }, 'stops' ],
    [ graceful_timeout => '--graceful-timeout 1 with a 10 s request in flight: seconds from TERM to exit', sub {
        my ($s) = @_;
        my $c = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $s->{port});
        syswrite($c, "GET /sleep?10 HTTP/1.1\r\nHost: x\r\n\r\n") if $c;
        sleep 0.3;
        my $t0 = time;
        kill TERM => $s->{pid};
        wait_until(sub { waitpid($s->{pid}, POSIX::WNOHANG()) == $s->{pid} }, 40);
        return { seconds => sprintf('%.2f', time - $t0) };
    }, 'stops', 0, [ '--graceful-timeout', 1 ] ],
    [ stop_group_idle => 'Ctrl-C (INT to the process group) of an idle server: seconds to exit', sub {
        my ($s) = @_;
        my $t0 = time;
        kill INT => -$s->{pid};
        wait_until(sub { waitpid($s->{pid}, POSIX::WNOHANG()) == $s->{pid} }, 40);
        return { seconds => sprintf('%.2f', time - $t0) };
    }, 'stops' ],
);

my %only = map { $_ => 1 } split /,/, ($opt{only} // '');
my @rows;
for my $sc (@SCENARIOS) {
    my ($name, $what, $run, $stops, $starter, $extra) = @$sc;
    next if %only && !$only{$name};
    for my $server (split /,/, $opt{servers}) {
        my @extra = $server eq 'narwhal' ? @{ $extra || [] } : ();
        my $s = start_server($server, $starter ? (starter => 1) : (), extra => \@extra)
            or do { push @rows, [$name, $server, 'not installed']; next };
        if (!$s->{up}) { push @rows, [$name, $server, 'did not start']; stop_server($s); next }
        sleep 0.5;
        my $t = $run->($s);
        stop_server($s);
        push @rows, [$name, $server, defined $t->{seconds} ? ($t->{seconds} =~ /^[\d.]+$/ ? "exit after $t->{seconds} s" : $t->{seconds})
                     : join(' | ', @$t{qw(sent answered failed reset)}) . ($t->{note} ? " ($t->{note})" : '')];
        printf STDERR "%-16s %-8s %s\n", @{ $rows[-1] };
    }
}

print "\n| scenario | server | sent \\| answered \\| failed \\| reset |\n|---|---|---|\n";
print "| $_->[0] | $_->[1] | $_->[2] |\n" for @rows;
print "\nScenarios:\n";
printf "  %-16s %s\n", $_->[0], $_->[1] for @SCENARIOS;
