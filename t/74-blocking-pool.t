use strict;
use warnings;
use Test::More;
use Test2::IPC;    # (the clients run in processes of their own)
use lib 't/lib';
use JSON::PP ();
use POSIX ();
use Time::HiRes qw(time sleep);
use NarwhalTest qw(spawn_server wait_until free_port http_get write_app);

# Requests that block (docs/DESIGN.md, "Requests that block"): a worker
# whose requests sleep (a database wait) sends its kept-alive clients
# through the manager's serve queue, and a standby worker accepts, so the
# whole pool serves; a worker whose requests run on a CPU parks and stands
# by as before. And the CPU quota of a cgroup bounds the CPUs the defaults
# count (docs/DESIGN.md, "CPU quotas").

plan skip_all => 'standby workers need the connection manager' if !NarwhalTest::managed();

# /sleep/SECONDS sleeps, /burn/SECONDS runs on a CPU that long; every
# answer names the worker.
my $APP = write_app(<<'APP');
use Time::HiRes ();
sub {
    my $env = shift;
    if ($env->{PATH_INFO} =~ m{^/sleep/([\d.]+)}) {
        Time::HiRes::sleep($1);
    } elsif ($env->{PATH_INFO} =~ m{^/burn/([\d.]+)}) {
        my $clock = Time::HiRes::CLOCK_THREAD_CPUTIME_ID();
        my $until = Time::HiRes::clock_gettime($clock) + $1;
        1 while Time::HiRes::clock_gettime($clock) < $until;
    }
    [200, ['Content-Type' => 'text/plain'], ["pid $$\n"]];
}
APP

our $sport;
sub status {
    my $r = http_get($sport, '/status.json');
    return $r->{success} ? eval { JSON::PP::decode_json($r->{content}) } : undef;
}
sub serving { grep { $_->{state} =~ /^(?:idle|busy)$/ } @{ (status() || {})->{workers} || [] } }
sub accepting { scalar grep { $_->{accepts} } serving() }

# $n keep-alive clients (HTTP::Tiny, no retries) asking for $path for
# $seconds; the requests answered and failed, and the most workers seen
# accepting meanwhile. With $close, a new connection for each request.
sub load {
    my ($port, $path, $n, $seconds, $close) = @_;
    pipe(my $r, my $w) or die "pipe: $!";
    my @kids;
    for (1 .. $n) {
        my $pid = fork // die "fork: $!";
        if (!$pid) {
            close $r;
            require HTTP::Tiny;
            my $http = HTTP::Tiny->new(timeout => 10, keep_alive => !$close, max_redirect => 0);
            my ($ok, $bad) = (0, 0);
            my $until = time + $seconds;
            while (time < $until) {
                $http->get("http://127.0.0.1:$port$path")->{status} == 200 ? $ok++ : $bad++;
            }
            syswrite($w, "$ok $bad\n");
            POSIX::_exit(0);
        }
        push @kids, $pid;
    }
    close $w;
    my $most = 0;
    my $until = time + $seconds - 0.3;
    while (time < $until) {
        my $a = accepting();
        $most = $a if $a > $most;
        sleep 0.2;
    }
    waitpid($_, 0) for @kids;
    my ($ok, $bad) = (0, 0);
    while (my $line = <$r>) {
        my ($o, $b) = split ' ', $line;
        $ok += $o;
        $bad += $b;
    }
    return ($ok, $bad, $most);
}

my $port_of = sub { $_[0]->port };

# 1. A blocking app: 8 kept-alive clients of a 10 ms request, 4 workers of
# which 1 accepts. One worker alone serves 100 a second at most; the pool,
# 400. Every worker serves, the standby ones accept while the requests
# block, and stand by again once the load is gone.
{
    local $sport = free_port();
    my $s = spawn_server(app => $APP, args => [ '--status-listen', "127.0.0.1:$sport",
                                                '--max-workers', 4, '--accepting-workers', 1 ]);
    ok(wait_until(sub { serving() == 4 }, 10), 'four workers, one accepting');
    is(accepting(), 1, 'one accepts before any load');
    my $t0 = time;
    my ($ok, $bad, $most) = load($s->port, '/sleep/0.01', 8, 3);
    my $rate = $ok / (time - $t0);
    is($bad, 0, "every request answered ($ok)");
    cmp_ok($rate, '>', 220, sprintf('%.0f requests a second: more than one worker (100) or two could serve', $rate));
    is($most, 4, 'all four workers accepted while the requests blocked');
    my @served = map { $_->{served} } serving();
    is(scalar(grep { $_ > 20 } @served), 4, "every worker served (@served)");
    ok(wait_until(sub { accepting() == 1 }, 6), 'once the load is gone, one accepts again');
    $s->stop;
}

# 1b. The same with a new connection for each request (HTTP/1.0 clients,
# a proxy without upstream keep-alive): nothing is ever parked, so a
# standby worker gets no first request through the serve queue; the
# manager takes new clients for it while the accepting one's requests
# block and clients wait in the listen queue (nw_scoreboard_standby_unused).
{
    local $sport = free_port();
    my $s = spawn_server(app => $APP, args => [ '--status-listen', "127.0.0.1:$sport",
                                                '--max-workers', 4, '--accepting-workers', 1 ]);
    ok(wait_until(sub { serving() == 4 }, 10), 'a connection per request: four workers, one accepting');
    my $t0 = time;
    my ($ok, $bad, $most) = load($s->port, '/sleep/0.01', 8, 3, 1);
    my $rate = $ok / (time - $t0);
    is($bad, 0, "every request answered ($ok)");
    cmp_ok($rate, '>', 220, sprintf('%.0f requests a second: more than one worker (100) or two could serve', $rate));
    my @served = map { $_->{served} } serving();
    is(scalar(grep { $_ > 20 } @served), 4, "every worker served (@served)");
    is($most, 4, 'all four accepted while the requests blocked');
    $s->stop;
}

# 2. A CPU-bound app of 2 ms requests: they do not block, so the standby
# workers stay out of it (accepting stays 1) and the accepting worker
# parks its clients: no more workers compete for the CPUs than accept.
# The accepting worker is stopped for 0.1 s on the way, as a busy machine
# can stall it (and a busy machine adds stalls of its own): the park
# watcher passes the clients waiting behind that request to the manager,
# and standby workers serve them until their connections end (here
# --max-keepalive-reqs 50). A lone slow request does not pause parking,
# which would send every client through the manager for seconds.
{
    local $sport = free_port();
    my $s = spawn_server(app => $APP, args => [ '--status-listen', "127.0.0.1:$sport", '--max-workers', 4,
                                                '--accepting-workers', 1, '--max-keepalive-reqs', 50 ]);
    ok(wait_until(sub { serving() == 4 }, 10), 'four workers, one accepting (CPU-bound)');
    my ($accepting_pid) = map { $_->{pid} } grep { $_->{accepts} } serving();
    $accepting_pid = 0 if !$accepting_pid || $accepting_pid < 2;
    ok($accepting_pid, "the accepting worker's pid in /status.json");
    my $stall = fork // die "fork: $!";
    if (!$stall) {
        POSIX::_exit(0) if !$accepting_pid;
        sleep 0.5;
        kill STOP => $accepting_pid;
        sleep 0.1;
        kill CONT => $accepting_pid;
        POSIX::_exit(0);
    }
    my ($ok, $bad, $most) = load($s->port, '/burn/0.002', 3, 2);
    waitpid($stall, 0);
    is($bad, 0, "every request answered ($ok)");
    is($most, 1, 'one worker accepted throughout');
    my ($by_accepting, $by_standby) = (0, 0);
    $_->{accepts} ? ($by_accepting += $_->{served}) : ($by_standby += $_->{served}) for serving();
    my $m = (http_get($sport, '/metrics') // {})->{content} // '';
    my ($to_manager) = $m =~ /^narwhal_handoffs_total\{direction="to_manager"\} (\d+)/m;
    my ($to_worker) = $m =~ /^narwhal_handoffs_total\{direction="to_worker"\} (\d+)/m;
    my $all = $by_accepting + $by_standby;
    diag("no client went to the manager: the stop came between requests") if !$to_worker;
    cmp_ok($to_manager // 1e9, '<=', 0.05 * $all,
           "clients went through the manager only around stalls ($to_manager hand-offs, $all requests): "
           . 'parking was not paused');
    cmp_ok($by_standby, '<=', 50 * ($to_worker // 0),
           "standby workers served only the clients the manager gave them, until they closed "
           . "($by_standby requests for $to_worker clients; the accepting worker $by_accepting)") or do {
        diag(join ' ', map { "[$_->{pid} accepts=$_->{accepts} served=$_->{served}]" } serving());
        diag($s->log_text);
    };
    $s->stop;
}

# 4. An elastic pool (--min-workers 1 --max-workers 8) under 16 kept-alive
# clients of a 20 ms request: it grows on the waits, the workers it adds
# serve (their requests block, so the clients come through the serve
# queue), and none is retired as idle while the clients wait.
{
    local $sport = free_port();
    my $s = spawn_server(app => $APP, args => [ '--status-listen', "127.0.0.1:$sport", '--min-workers', 1,
                                                '--max-workers', 8, '--worker-idle-timeout', 1 ]);
    ok(wait_until(sub { serving() == 1 }, 10), 'an elastic pool of one worker');
    my $t0 = time;
    my ($ok, $bad) = load($s->port, '/sleep/0.02', 16, 4);
    my $rate = $ok / (time - $t0);
    is($bad, 0, "every request answered ($ok)");
    my $log = $s->log_text;
    my @sizes = $log =~ /pool: \d+ -> (\d+) workers: \d+ of \d+ requests waited/g;
    my $most = (sort { $b <=> $a } @sizes)[0] // 1;
    cmp_ok($most, '>=', 6, "it grew on the waits (to $most workers)");
    unlike($log, qr/was idle for/, 'no worker was retired as idle while the clients waited');
    cmp_ok($rate, '>', 150, sprintf('%.0f requests a second (one worker: 50; eight: 400)', $rate));
    $s->stop;
}

# 4b. Short waits on a short blocking request: 8 kept-alive clients of a
# 2 ms request, an elastic pool of 2 to 16. Each request waits about
# three times its length with 2 workers, which is under the 10 ms a
# CPU-bound pool grows on; while requests block the pool grows on waits
# over 1 ms, and stops once a worker is idle at a look: about one worker
# a client, not 16.
{
    local $sport = free_port();
    my $s = spawn_server(app => $APP, args => [ '--status-listen', "127.0.0.1:$sport", '--min-workers', 2,
                                                '--max-workers', 16 ]);
    ok(wait_until(sub { serving() == 2 }, 10), 'an elastic pool of two workers');
    my ($ok, $bad) = load($s->port, '/sleep/0.002', 8, 4);
    is($bad, 0, "every request answered ($ok)");
    my @sizes = $s->log_text =~ /pool: \d+ -> (\d+) workers: \d+ of \d+ requests waited over 1 ms/g;
    my $most = (sort { $b <=> $a } @sizes)[0] // 2;
    cmp_ok($most, '>=', 5, "it grew on waits over 1 ms (to $most workers)");
    cmp_ok($most, '<=', 11, '... and not far past one worker a client');
    $s->stop;
}

# 5. A CPU quota: a real cgroup (v1's cpu controller, where this machine
# lets root make one) of half a CPU. The start line says it, and one
# worker accepts (the CPUs the defaults count: 1).
SKIP: {
    my $base = '/sys/fs/cgroup/cpu';
    skip 'needs root and a writable cgroup v1 cpu controller', 3
        unless $> == 0 && -w $base && -e "$base/cpu.cfs_quota_us";
    my $cg = "$base/narwhal-test-$$";
    mkdir $cg or skip "cannot make a cgroup: $!", 3;
    my $put = sub { open(my $fh, '>', "$cg/$_[0]") or return 0; print $fh "$_[1]\n"; close $fh };
    $put->('cpu.cfs_period_us', 100000) && $put->('cpu.cfs_quota_us', 50000)
        or skip "cannot set the quota: $!", 3;
    local $sport = free_port();
    my $s = spawn_server(app => $APP, args => [ '--status-listen', "127.0.0.1:$sport", '--max-workers', 4 ],
                         child_setup => sub { $put->('tasks', $$) });
    ok(wait_until(sub { serving() == 4 }, 20), 'four workers in a cgroup of half a CPU');
    like($s->log_text, qr/with 4 workers, 1 accepting new clients \(the rest stand by\) on 1 CPU \(cgroup CPU quota 0\.50\)/,
         'the start line says the quota, and one accepts');
    is(accepting(), 1, '... and one does');
    $s->stop;
    # (the server's processes have left it: it can go)
    wait_until(sub { rmdir $cg }, 5) or diag("could not remove $cg: $!");
}

done_testing();
