use strict;
use warnings;
use Test::More;
use Test2::IPC;    # (parts of this file run in processes of their own)
use Time::HiRes qw(time sleep);
use lib 't/lib';
use NarwhalTest qw(spawn_server write_app wait_until manager_fallback free_port worker_pids
                   raw_connect read_response read_until_close pid_alive in_parallel);

# Custody (DESIGN.md, "Custody of parked connections"): the manager holds
# a copy of every connection parked in a worker, so that a worker killed
# with KILL (the OOM killer's signal) or ended by the app's `exit` loses
# only the request it was serving. Its parked connections are taken over
# by the manager and served by the other workers; the one in flight is
# closed at once. A connection the worker closes still ends at once (it
# shuts the socket down first), and one the app took through psgix.io is
# the app's alone.

my @NM = manager_fallback();
plan skip_all => 'custody is the connection manager\'s'
    if !NarwhalTest::managed();

my $APP = write_app(<<'APP');
our @saved;
my %routes = (
    '/exit' => sub { exit 0 },
    '/keep-io' => sub {
        my $env = shift;
        return sub {
            my $io = $env->{'psgix.io'};
            syswrite($io, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: t\r\nConnection: Upgrade\r\n\r\n");
            push @saved, $io;       # the app keeps the socket after its request
        };
    },
    '/write-saved' => sub {
        my $n = @saved;
        for my $io (splice @saved) { syswrite($io, "later"); close $io }
        [200, ['Content-Type' => 'text/plain'], ["wrote $n"]];
    },
);
sub {
    my $env = shift;
    Time::HiRes::sleep($1) if $env->{PATH_INFO} =~ m{^/sleep/([\d.]+)};
    my $route = $routes{$env->{PATH_INFO}};
    return $route->($env) if $route;
    [200, ['Content-Type' => 'text/plain'],
     ["pid=$$ addr=$env->{REMOTE_ADDR} path=$env->{PATH_INFO}"]];
}
APP

# The status address of the part's server: each server has its own (the
# one before may still be stopping: each stops as its part ends, as its
# guard goes, and no test looks at the stop).
my $sport;
sub metrics { NarwhalTest::metrics_of($sport) }

sub server {
    my (@args) = @_;
    $sport = free_port();
    my $s = spawn_server(app => $APP, args => [ '--keepalive-wait' => 10, '--keepalive-timeout' => 30,
                                                '--status-listen' => "127.0.0.1:$sport", @args ]);
    ok(wait_until(sub { defined metrics()->{narwhal_custody_connections} }, 5), 'the status page is up');
    return $s;
}

sub ask {
    my ($c, $path) = @_;
    syswrite($c, "GET $path HTTP/1.1\r\nHost: t\r\n\r\n") or return undef;
    return read_response($c, 5);
}
sub pid_of { ($_[0] && $_[0]{body} =~ /pid=(\d+)/)[0] // 0 }

# Ask on every connection until the manager holds a copy of each, and
# return the pids that answered last (undef: never). Under load a request
# can take over NW_PARK_SLOW_REQUEST_MS: the park watcher passes the
# connections waiting behind it to the manager (and two such requests pause
# parking for a while); a connection handed to the manager needs no copy.
sub settle {
    my ($want, @c) = @_;
    my @pid;
    my $ok = wait_until(sub {
        @pid = map { pid_of(ask($_, '/settle')) } @c;
        sleep 0.1;      # (NW_CUSTODY_DELAY_MS, and the manager's turn)
        return (metrics()->{narwhal_custody_connections} // 0) == $want;
    }, 15);
    return $ok ? \@pid : undef;
}

# A worker killed between requests: every connection parked in it lives on.
my $part_killed_idle = sub {
    my $s = server('--max-workers' => 2);
    wait_until(sub { worker_pids($s->pid) == 2 }, 5);
    my @c = map { raw_connect($s->port) } 1 .. 8;
    my @pid = @{ settle(8, @c) || [] };
    is(scalar(grep { $_ } @pid), 8,
       'eight clients served, their connections parked, the manager holds a copy of each');
    my %in;
    $in{$_}++ for @pid;
    my ($victim) = sort { $in{$b} <=> $in{$a} } keys %in;
    kill KILL => $victim;
    my @again = map { ask($_, '/again') } @c;
    is(scalar(grep { $_ && $_->{status} == 200 } @again), 8,
       "after kill -9 of a worker holding $in{$victim} of them, all eight are answered on their own connections");
    is(scalar(grep { pid_of($_) == $victim } @again), 0, 'none by the dead worker');
    my $m = metrics();
    is($m->{narwhal_custody_taken_over_total}, $in{$victim}, 'narwhal_custody_taken_over_total counts them');
    is($m->{narwhal_custody_lost_total}, 0, 'and none lost');
    like($s->log_text, qr/manager warn: worker $victim ended without giving up its connections: took over $in{$victim}, closed 0/,
         'the error log says what the manager took over');
};

# A worker killed while serving: the request in flight is lost (its
# client sees the end at once), the connection parked beside it is not.
my $part_killed_serving = sub {
    my $s = server('--max-workers' => 1);
    my ($busy, $parked) = map { raw_connect($s->port) } 1 .. 2;
    my $pid = (@{ settle(2, $busy, $parked) || [] })[0];
    ok($pid, 'both in custody');
    syswrite($busy, "GET /sleep/5 HTTP/1.1\r\nHost: t\r\n\r\n");
    # The kill comes once the request runs and the park watcher has handed
    # the parked connection to the manager (NW_PARK_SLOW_REQUEST_MS into it).
    wait_until(sub { my $m = metrics();
                     $m->{'narwhal_workers{state="busy"}'} == 1 && $m->{'narwhal_connections{state="idle"}'} == 1 }, 5);
    kill KILL => $pid;
    my $t0 = time;
    my $rest = read_until_close($busy, 4);
    my $took = time - $t0;
    is($rest, '', 'the request in flight gets no answer');
    ok($took < 1, sprintf('its connection is closed at once (%.2f s), not held by the manager', $took));
    my $r = ask($parked, '/after');
    like($r && $r->{body}, qr{path=/after}, 'the connection parked beside it is served by the new worker');
    my $m = metrics();
    is($m->{narwhal_custody_lost_total}, 1, 'narwhal_custody_lost_total: the one in flight');
    # (the parked one was with the manager already: the park watcher hands
    # a busy worker's parked connections over during a slow request)

    # An app's exit: the same.
    my $r1 = ask($busy = raw_connect($s->port), '/first');
    ask($parked, '/before-exit');
    syswrite($busy, "GET /exit HTTP/1.1\r\nHost: t\r\n\r\n");
    is(read_until_close($busy, 4), '', "an app's exit: its request gets no answer");
    $r = ask($parked, '/after-exit');
    like($r && $r->{body}, qr{path=/after-exit}, 'and the connection parked beside it lives on');
};

# Closed by the worker: the FIN leaves at once although the manager held a
# copy. A socket the app keeps (psgix.io) is the app's to close.
my $part_closed = sub {
    my $s = server('--max-workers' => 1);
    my $c = raw_connect($s->port);
    ok(settle(1, $c), 'parked and in custody');
    syswrite($c, "GET /last HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
    my $t0 = time;
    my $all = read_until_close($c, 4);
    like($all, qr{path=/last}, 'Connection: close is answered');
    ok(time - $t0 < 1, 'and the connection ends at once');
    ok(wait_until(sub { (metrics()->{narwhal_custody_connections} // 0) == 0 }, 3),
       'the manager let its copy go');

    my $io = raw_connect($s->port);
    ask($io, '/first');
    syswrite($io, "GET /keep-io HTTP/1.1\r\nHost: t\r\nUpgrade: t\r\nConnection: Upgrade\r\n\r\n");
    my $head = '';
    while ($head !~ /\r\n\r\n/) { sysread($io, $head, 4096, length $head) or last }
    like($head, qr{^HTTP/1\.1 101 }, 'psgix.io: the app answered 101 and kept the socket');
    my $w = ask(raw_connect($s->port), '/write-saved');
    like($w && $w->{body}, qr/wrote 1/, 'the app wrote to it later and closed it');
    $t0 = time;
    is(read_until_close($io, 4), 'later', 'the client got what the app wrote after its request');
    ok(time - $t0 < 1, 'and the end at once: the manager had let go of its copy');
};

# A worker that leaves in good order (HUP) gives its parked connections to
# the others: the manager takes over nothing.
my $part_hup = sub {
    my $s = server('--max-workers' => 2);
    my @c = map { raw_connect($s->port) } 1 .. 6;
    ask($_, '/first') for @c;
    my @old = worker_pids($s->pid);
    kill HUP => $s->pid;
    ok(wait_until(sub { my %o = map { $_ => 1 } @old; !grep { $o{$_} } worker_pids($s->pid) }, 10),
       'HUP replaced both workers');
    my @again = map { ask($_, '/again') } @c;
    is(scalar(grep { $_ && $_->{status} == 200 } @again), 6, 'every connection answered after the HUP');
    is(metrics()->{narwhal_custody_taken_over_total}, 0, 'none taken over: they were given away');
    unlike($s->log_text, qr/ended without giving up/, 'and no such line in the error log');
};

# Connections a retiring worker gave to another, which is then killed:
# the manager watches their new owner too.
my $part_new_owner = sub {
    my $s = server('--max-workers' => 1);
    my @c = map { raw_connect($s->port) } 1 .. 4;
    ok(settle(4, @c), 'four in custody');
    my ($first) = worker_pids($s->pid);
    kill TTIN => $s->pid;
    ok(wait_until(sub { worker_pids($s->pid) == 2 }, 10), 'TTIN: a second worker');
    kill USR2 => $first;    # retired: its parked connections go to the others
    ok(wait_until(sub { my @w = worker_pids($s->pid); @w == 2 && !grep { $_ == $first } @w }, 10),
       'the first worker retired and was replaced');
    # (once the first worker has ended, the manager has let go of the
    # copies still in its name: those it holds then are the new owner's)
    ok(wait_until(sub { !pid_alive($first) && (metrics()->{narwhal_custody_connections} // 0) == 4 }, 3),
       'the four are in custody under their new owner');
    kill KILL => worker_pids($s->pid);
    my @again = map { ask($_, '/again') } @c;
    is(scalar(grep { $_ && $_->{status} == 200 } @again), 4,
       'after kill -9 of every worker, the four adopted connections are answered');
};

# Under --proxy-protocol a connection taken over keeps its PROXY address.
my $part_proxy = sub {
    my $s = server('--max-workers' => 1, '--proxy-protocol');
    my $c = raw_connect($s->port);
    syswrite($c, "PROXY TCP4 10.9.8.7 10.0.0.1 5555 80\r\nGET /first HTTP/1.1\r\nHost: t\r\n\r\n");
    my $r = read_response($c, 5);
    like($r && $r->{body}, qr{addr=10\.9\.8\.7}, 'the PROXY header gave the address');
    my $pid = (@{ settle(1, $c) || [] })[0];
    ok($pid, 'in custody');
    kill KILL => $pid;
    $r = ask($c, '/again');
    like($r && $r->{body}, qr{addr=10\.9\.8\.7 path=/again}, 'after its worker was killed, the same address');
};

# --no-custody: no copies; a parked connection dies with its worker.
my $part_no_custody = sub {
    my $s = server('--max-workers' => 1, '--no-custody');
    my $c = raw_connect($s->port);
    my $pid = pid_of(ask($c, '/first'));
    # A copy would be due NW_CUSTODY_DELAY_MS (10 ms) after the park, and a
    # worker sends those due before it serves its next connection: once a
    # request sent later is answered, a copy would be with the manager.
    sleep 0.02;
    ask(raw_connect($s->port), '/later');
    is(metrics()->{narwhal_custody_connections}, 0, '--no-custody: the manager holds no copy');
    kill KILL => $pid;
    my $r = ask($c, '/again');
    ok(!($r && $r->{status}), 'and the parked connection died with its worker');
};

# The parts in two processes at once (each part has its own server).
in_parallel(sub { $part_killed_idle->(); $part_killed_serving->(); $part_closed->(); $part_proxy->() },
            sub { $part_hup->(); $part_new_owner->(); $part_no_custody->() });
done_testing;
