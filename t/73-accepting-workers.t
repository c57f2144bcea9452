use strict;
use warnings;
use Test::More;
use Test2::IPC;    # (parts of this file run in processes of their own)
use lib 't/lib';
use IO::Select ();
use JSON::PP ();
use Time::HiRes qw(time sleep);
use Narwhal ();
use NarwhalTest qw(spawn_server wait_until free_port http_get worker_pids raw_connect
                   in_parallel run_cmd narwhal_cmd);

# --accepting-workers (docs/DESIGN.md, "Accepting workers"): the first N
# workers take new clients; the others, standby, serve what the manager
# gives them once every accepting worker has been on its request for
# 20 ms. A CPU-bound app stays on the accepting workers; a blocking app
# gets the whole pool; replacements, TTOU, TTIN and HUP keep the count.

plan skip_all => 'standby workers need the connection manager' if !NarwhalTest::managed();

# /sleep/SECONDS sleeps; every answer names the worker that gave it.
my $APP = NarwhalTest::sleepy_app('"pid $$\n"');

our $sport;
sub metrics { NarwhalTest::metrics_of($sport) }
sub status {
    my $r = http_get($sport, '/status.json');
    return $r->{success} ? eval { JSON::PP::decode_json($r->{content}) } : undef;
}
sub serving { grep { $_->{state} =~ /^(?:idle|busy)$/ } @{ (status() || {})->{workers} || [] } }
sub accepting { scalar grep { $_->{accepts} } serving() }

sub start {
    my (@args) = @_;
    my $s = spawn_server(app => $APP, args => [ '--status-listen', "127.0.0.1:$sport", @args ]);
    return $s;
}

# Send GET $path on each new connection at once (Connection: close); the
# seconds each answer took and the pid it named.
sub ask_at_once {
    my ($port, $path, $n, $timeout) = @_;
    my @c = map { raw_connect($port) } 1 .. $n;
    my $t0 = time;
    syswrite($_, "GET $path HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n") for @c;
    my (%buf, %done);
    my $sel = IO::Select->new(@c);
    while ($sel->count && time < $t0 + $timeout) {
        for my $h ($sel->can_read(0.1)) {
            my ($i) = grep { $c[$_] == $h } 0 .. $#c;
            next if sysread($h, $buf{$i}, 4096, length($buf{$i} // ''));
            $sel->remove($h);
            $done{$i} = time - $t0;
        }
    }
    return map { [ $done{$_}, ($buf{$_} // '') =~ /^pid (\d+)$/m ? $1 : undef ] } 0 .. $#c;
}

# 1. The default: as many accepting workers as CPUs, never more than the
# pool; 0: every worker; the log line says so.
my $part_default = sub {
    local $sport = free_port();
    my $cpus = Narwhal::Master::cpu_count();
    my $s = start('--max-workers', 4);
    ok(wait_until(sub { serving() == 4 }, 10), 'four workers serve');
    my $want = $cpus < 4 ? $cpus : 0;   # (0: every worker, as with 4 CPUs or more)
    is(accepting(), $want || 4, "the default: the CPUs ($cpus), at most the pool");
    is(metrics()->{narwhal_workers_accepting}, $want || 4, '... narwhal_workers_accepting says so');
    like($s->log_text, qr/with 4 workers, $want accepting new clients \(the rest stand by\)/, '... and the start line')
        if $want;
    $s->stop;
    local $sport = free_port();
    $s = start('--max-workers', 3, '--accepting-workers', 0);
    ok(wait_until(sub { serving() == 3 }, 10), '--accepting-workers 0: three workers serve');
    is(accepting(), 3, '... and all three accept');
    unlike($s->log_text, qr/accepting new clients/, '... the start line does not split them');
};

# 2. A CPU-bound app (answers at once) stays on the accepting workers: four
# clients, kept alive and new, served by two of four workers.
my $part_cpu_bound = sub {
    local $sport = free_port();
    my $s = start('--max-workers', 4, '--accepting-workers', 2);
    ok(wait_until(sub { serving() == 4 }, 10), 'four workers, two accepting');
    my @kids;
    for my $k (1 .. 4) {
        my $pid = fork // die "fork: $!";
        if (!$pid) {
            require HTTP::Tiny;
            my $ok = 0;
            my $http = HTTP::Tiny->new(timeout => 10, keep_alive => $k % 2);
            for (1 .. 300) { $ok++ if $http->get('http://127.0.0.1:' . $s->port . '/')->{status} == 200 }
            POSIX::_exit($ok == 300 ? 0 : 1);
        }
        push @kids, $pid;
    }
    my $failed = grep { waitpid($_, 0); $? != 0 } @kids;
    is($failed, 0, 'every one of 1,200 requests answered');
    my @w = serving();
    my $by_accepting = 0;
    $by_accepting += $_->{served} for grep { $_->{accepts} } @w;
    my $all = 0;
    $all += $_->{served} for @w;
    cmp_ok($by_accepting, '>=', 0.8 * $all,
           "the accepting workers served most of them ($by_accepting of $all; all four accepting: about half)");
};

# 3. A blocking app gets the whole pool: one accepting worker of four.
# (a) Four clients of a 0.6 s request at once, each on a new connection,
# are served by four workers side by side, not one after another (2.4 s).
# (b) With the accepting worker already inside a long request (its
# listener wake-up long done with, so only the manager can see new
# clients), three new clients are taken by the manager for the standby
# workers 20 to 30 ms after they come.
my $part_blocking = sub {
    local $sport = free_port();
    my $s = start('--max-workers', 4, '--accepting-workers', 1);
    ok(wait_until(sub { serving() == 4 }, 10), 'four workers, one accepting');
    is(accepting(), 1, 'one accepts');
    my @r = ask_at_once($s->port, '/sleep/0.6', 4, 5);
    is(scalar(grep { defined $_->[0] } @r), 4, 'four clients of a blocking app: four answers');
    my %pids = map { ($_->[1] // '?') => 1 } @r;
    is(scalar(keys %pids), 4, '... from four workers');
    my ($slowest) = sort { $b <=> $a } map { $_->[0] // 99 } @r;
    cmp_ok($slowest, '<', 1.1, sprintf('... the last within 1.1 s (%.2f s): the standby ones woke', $slowest));

    my $taken = metrics()->{narwhal_manager_accepted_total};
    my $long = raw_connect($s->port);
    syswrite($long, "GET /sleep/1.5 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    ok(wait_until(sub { grep { $_->{accepts} && $_->{state} eq 'busy' && $_->{running_seconds} > 0.1 }
                        serving() }, 5), 'the accepting worker is inside a long request');
    @r = ask_at_once($s->port, '/sleep/0.3', 3, 5);
    is(scalar(grep { defined $_->[0] } @r), 3, 'three new clients meanwhile: three answers');
    %pids = map { ($_->[1] // '?') => 1 } @r;
    is(scalar(keys %pids), 3, '... from the three standby workers');
    ($slowest) = sort { $b <=> $a } map { $_->[0] // 99 } @r;
    cmp_ok($slowest, '<', 0.9, sprintf('... the last within 0.9 s (%.2f s), not after the long one', $slowest));
    cmp_ok(metrics()->{narwhal_manager_accepted_total} - $taken, '>=', 3,
           '... the manager took them, as the accepting worker was stuck');
};

# 4. The count is kept: a killed accepting worker's replacement accepts,
# TTOU retires standby workers first, TTIN adds a standby one, and a HUP's
# new workers have their own two.
my $part_kept = sub {
    local $sport = free_port();
    my $s = start('--max-workers', 4, '--accepting-workers', 2);
    ok(wait_until(sub { serving() == 4 }, 10), 'four workers, two accepting');
    my ($victim) = map { $_->{pid} } grep { $_->{accepts} } serving();
    kill KILL => $victim;
    ok(wait_until(sub { my @w = serving(); @w == 4 && !grep { $_->{pid} == $victim } @w }, 10),
       'a killed accepting worker is replaced');
    is(accepting(), 2, '... by one that accepts');
    kill TTOU => $s->pid;
    ok(wait_until(sub { worker_pids($s->pid) == 3 && serving() == 3 }, 10), 'TTOU: three workers');
    is(accepting(), 2, '... two of them still accepting (a standby one left)');
    kill TTOU => $s->pid;
    ok(wait_until(sub { worker_pids($s->pid) == 2 && serving() == 2 }, 10), 'TTOU again: two');
    is(accepting(), 2, '... both accepting');
    kill TTIN => $s->pid;
    ok(wait_until(sub { serving() == 3 }, 10), 'TTIN: three');
    is(accepting(), 2, '... the new one stands by');
    my %old = map { ($_->{pid} => 1) } serving();
    kill HUP => $s->pid;
    ok(wait_until(sub { my @w = serving(); @w == 3 && !grep { $old{ $_->{pid} } } @w }, 15),
       'HUP: three new workers');
    is(accepting(), 2, '... two of them accepting');
    is(http_get($s->port, '/')->{status}, 200, '... and they answer');
};

# 5. Without the manager every worker accepts (nothing would wake a
# standby one); a bad count is a one-line error.
my $part_no_manager = sub {
    my $s = spawn_server(app => $APP, args => [ '--max-workers', 3, '--accepting-workers', 1,
                                                '--no-manager' ]);
    ok(wait_until(sub { worker_pids($s->pid) == 3 }, 10), '--no-manager: three workers');
    my @r = ask_at_once($s->port, '/sleep/0.5', 3, 5);
    my %pids = map { ($_->[1] // '?') => 1 } @r;
    is(scalar(keys %pids), 3, '... three clients of a blocking app are served by all three');
    unlike($s->log_text, qr/accepting new clients/, '... and the start line does not split them');
    my $r = run_cmd([ narwhal_cmd(), '--accepting-workers', '-1', 'eg/hello.psgi' ]);
    isnt($r->{code}, 0, '--accepting-workers -1: a non-zero exit');
    like($r->{err}, qr/^narwhal: --accepting-workers wants a whole number, not '-1'\n\z/, '... with a one-line error');
};

# 6. No accepting worker able to take a client while standby ones are
# idle: the manager takes the clients for them. The accepting worker is
# killed and its replacement cannot start (the app no longer loads: a
# failed start backs off); new clients are answered by standby workers
# all the same, not left in the listen queue.
my $part_no_accepting = sub {
    local $sport = free_port();
    my $flag = NarwhalTest::tmpdir() . "/no-load";
    my $app = NarwhalTest::write_app(<<"APP");
die "cannot load now\n" if -e '$flag';
sub { [200, ['Content-Type' => 'text/plain'], ["pid \$\$\n"]] }
APP
    my $s = spawn_server(app => $app, args => [ '--status-listen', "127.0.0.1:$sport", '--max-workers', 3,
                                                '--accepting-workers', 1, '--no-preload-app' ]);
    ok(wait_until(sub { serving() == 3 }, 10), 'three workers, one accepting');
    my ($victim) = map { $_->{pid} } grep { $_->{accepts} } serving();
    open(my $fh, '>', $flag) or die "$flag: $!";
    close $fh;
    kill KILL => $victim;
    ok(wait_until(sub { !grep { $_->{pid} == $victim } serving() }, 5), 'the accepting worker is gone');
    my @r = ask_at_once($s->port, '/', 2, 5);
    is(scalar(grep { defined $_->[0] } @r), 2, '... its replacement cannot start: two new clients answered');
    my ($slowest) = sort { $b <=> $a } map { $_->[0] // 99 } @r;
    cmp_ok($slowest, '<', 1, sprintf('... soon (%.2f s), by standby workers', $slowest));
    unlink $flag;
};

# 7. --drain-delay: the manager takes no new client while the server
# drains, so the standby workers take the listeners back; four clients of
# a blocking app are served side by side, not one after another.
my $part_drain = sub {
    local $sport = free_port();
    my $s = start('--max-workers', 4, '--accepting-workers', 1, '--drain-delay', 5);
    ok(wait_until(sub { serving() == 4 }, 10), 'four workers, one accepting');
    kill TERM => $s->pid;
    ok(wait_until(sub { (http_get($sport, '/health')->{status} // 0) == 503 }, 5), 'draining');
    sleep 0.3;
    my @r = ask_at_once($s->port, '/sleep/0.5', 4, 5);
    is(scalar(grep { defined $_->[0] } @r), 4, 'four clients of a blocking app while it drains: four answers');
    my ($slowest) = sort { $b <=> $a } map { $_->[0] // 99 } @r;
    cmp_ok($slowest, '<', 1, sprintf('... side by side (the last after %.2f s)', $slowest));
};

# 8. An elastic pool does not grow for the manager's look: a client that
# reaches a standby worker has waited 20 to 30 ms for it, over the 10 ms
# the pool grows on, while a standby worker sat idle. Three clients of a
# 0.2 s request, one after another each: at most four workers (it went
# to eight).
my $part_elastic = sub {
    local $sport = free_port();
    my $s = start('--min-workers', 2, '--max-workers', 8, '--accepting-workers', 1);
    ok(wait_until(sub { serving() == 2 }, 10), 'an elastic pool of two, one accepting');
    my @kids;
    for (1 .. 3) {
        my $pid = fork // die "fork: $!";
        if (!$pid) {
            require HTTP::Tiny;
            my $http = HTTP::Tiny->new(timeout => 10, keep_alive => 0);
            my $end = time + 2;
            my $ok = 1;
            while (time < $end) {
                $ok &&= $http->get('http://127.0.0.1:' . $s->port . '/sleep/0.2')->{status} == 200;
                sleep 0.05;
            }
            POSIX::_exit($ok ? 0 : 1);
        }
        push @kids, $pid;
    }
    my $failed = grep { waitpid($_, 0); $? != 0 } @kids;
    is($failed, 0, 'three clients of a blocking app, every request answered');
    cmp_ok(metrics()->{narwhal_workers_wanted}, '<=', 4, 'the pool grew to four workers at most');
};

in_parallel($part_default, $part_cpu_bound, $part_blocking, $part_kept, $part_no_manager,
            $part_no_accepting, $part_drain);
# The elastic part alone: its pool grows, as it should, on waits that
# seven other servers' CPU adds (it grew to 6 in about one suite run in
# four with them; its point is the manager's look, not their load).
$part_elastic->();

done_testing;
