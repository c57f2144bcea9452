use strict;
use warnings;
use Test::More;
use Test2::IPC;    # (parts of this file run in processes of their own)
use File::Spec ();
use Time::HiRes qw(time sleep);
use lib 't/lib';
use NarwhalTest::Clients ();
use NarwhalTest qw(spawn_server write_app tmpdir wait_until free_port worker_pids pid_alive
                   in_parallel);

# Recycling in turn (DESIGN.md, "Retirement"): a worker at its
# --max-reqs-per-child leaves only once its replacement is ready to adopt
# its connections (NW_RECYCLE_SUCCESSOR_WAIT_MS at most), and workers that
# reach their counts together are recycled one after the other, each
# leaving worker's connections going to its own replacement.

plan skip_all => 'recycling ahead of the limit is the connection manager\'s'
    if !NarwhalTest::managed();

my $TMP = tmpdir();

# An app whose loading takes 1 s once the marker file exists (a
# replacement that is slow to start), and which notes each load.
sub slow_loading_app {
    my ($name) = @_;
    my $marker = File::Spec->catfile($TMP, "$name-slow");
    my $loads = File::Spec->catfile($TMP, "$name-loads");
    my $app = write_app(<<"APP");
use Time::HiRes ();
select(undef, undef, undef, 1) if -e '$marker';
open(my \$log, '>>', '$loads') or die \$!;
printf \$log "%d %.3f\\n", \$\$, Time::HiRes::time();
close \$log;
sub { [200, ['Content-Type' => 'text/plain'], ["pid=\$\$\\n"]] };
APP
    return ($app, $marker, $loads);
}

sub touch { open(my $fh, '>', $_[0]) or die "$_[0]: $!"; close $fh }

sub loads {
    my ($file) = @_;
    open(my $fh, '<', $file) or return ();
    return map { [ split ' ' ] } <$fh>;
}

sub timed_get {     # [ pid or 'fail', seconds ]
    my ($http, $port) = @_;
    my $t0 = time;
    my $r = $http->get("http://127.0.0.1:$port/");
    my $pid = $r->{status} == 200 && $r->{content} =~ /pid=(\d+)/ ? $1 : 'fail';
    return [ $pid, time - $t0 ];
}

my @ARGS = ('--no-preload-app', '--min-worker-lifetime', 0, '--max-reqs-per-child', 40);

# (a) One worker at its count while its replacement loads (1 s) serves on
# until the replacement is ready; then it leaves and the replacement
# serves. Leaving at its count, its client's next request waited for the
# replacement's whole start.
my $successor = sub {
    my ($app, $marker, $loads) = slow_loading_app('successor');
    my $s = spawn_server(app => $app, args => [ @ARGS, '--max-workers', 1 ]);
    my $port = $s->port;
    require HTTP::Tiny;
    my $http = HTTP::Tiny->new(timeout => 10, keep_alive => 1);
    my $first = timed_get($http, $port);
    my $old = $first->[0];
    touch($marker);
    my @got = ($first, map { timed_get($http, $port) } 2 .. 38);
    # 38 served: the replacement is asked for and loads for 1 s
    my $t0 = time;
    while (time - $t0 < 4) {
        push @got, timed_get($http, $port);
        last if $got[-1][0] ne $old;
        sleep 0.01;
    }
    my @by_old = grep { $_->[0] eq $old } @got;
    my ($slowest) = sort { $b <=> $a } map { $_->[1] } @got[38 .. $#got];
    ok(!grep({ $_->[0] eq 'fail' } @got), 'every request answered') or diag explain \@got;
    cmp_ok(scalar @by_old, '>', 40, 'the old worker served past its count of 40 while its replacement loaded')
        or diag scalar(@by_old) . ' by the old worker';
    ok($got[-1][0] ne $old && $got[-1][0] ne 'fail', '... and then its replacement served');
    cmp_ok($slowest, '<', 0.5, sprintf('no request waited for the replacement to load (slowest %.2f s)', $slowest));
    ok(wait_until(sub { !pid_alive($old) }, 5), '... and the old worker left');
    $s->stop;
};

# (b) Two workers at their counts together: the second asks for its
# replacement only once the first has left (which it does once its own
# replacement has loaded), so the two replacements load one after the
# other, 1 s apart; asked together, both loaded at once. Four keep-alive
# clients that never retry keep both workers at work throughout.
my $in_turn = sub {
    my ($app, $marker, $loads) = slow_loading_app('turn');
    my $s = spawn_server(app => $app, args => [ @ARGS, '--max-workers', 2 ]);
    my @orig = @{ wait_until(sub { my @w = worker_pids($s->pid); @w == 2 ? \@w : undef }, 10) || [] };
    is(scalar @orig, 2, 'two workers');
    my $loaded = sub { my %l = map { $_->[0] => 1 } loads($loads); !grep { !$l{$_} } @orig };
    ok(wait_until($loaded, 10), '... both loaded');
    touch($marker);
    my $touched = time;
    my @clients = NarwhalTest::Clients::start_clients($TMP, $s->port, 4, '/', 10, 0, pace => 0.002);
    my $gone = wait_until(sub { !grep { pid_alive($_) } @orig }, 8);
    my $t = NarwhalTest::Clients::finish(@clients);
    ok($gone, 'both original workers were recycled');
    is($t->{answered}, $t->{sent}, "every request answered ($t->{answered} of $t->{sent})")
        or diag explain $t;
    # (a replacement may reach its count too, and be recycled in turn)
    my @new = sort { $a->[1] <=> $b->[1] } grep { $_->[1] > $touched } loads($loads);
    cmp_ok(scalar @new, '>=', 2, 'the replacements loaded') or diag explain [ loads($loads) ];
    if (@new >= 2) {
        my $apart = abs($new[1][1] - $new[0][1]);
        cmp_ok($apart, '>=', 0.8, sprintf('one after the other: their loads ended %.2f s apart', $apart))
            or diag explain [ loads($loads) ], "touched at $touched", $s->log_text;
    }
    $s->stop;
};

# (c) A holder of the turn stuck on a request that does not end (here
# until the test lets it go) holds it NW_RECYCLE_TURN_MAX_MS at most (1 s
# here): then the other worker takes it and is recycled. Held until the
# holder's fold, the other worker served thousands of requests over its
# count of 40 for as long as the request lasted.
my $stuck_holder = sub {
    my $stuck = File::Spec->catfile($TMP, 'stuck-holder');
    my $release = File::Spec->catfile($TMP, 'stuck-release');
    my $app = write_app(<<"APP");
use Fcntl ();
use Time::HiRes ();
my \$n = 0;
sub {
    # the first worker to serve its 39th request (it holds the turn: it
    # asked after its 38th) stays on it until the test is done
    if (++\$n == 39 && sysopen(my \$fh, '$stuck', Fcntl::O_CREAT() | Fcntl::O_EXCL() | Fcntl::O_WRONLY())) {
        print \$fh "\$\$\\n";
        close \$fh;
        my \$t0 = Time::HiRes::time();
        Time::HiRes::sleep(0.05) while !-e '$release' && Time::HiRes::time() - \$t0 < 60;
    }
    [200, ['Content-Type' => 'text/plain'], ["pid=\$\$\\n"]];
};
APP
    my $s = spawn_server(app => $app, args => [ '--min-worker-lifetime', 0, '--max-reqs-per-child', 40,
                                                '--max-workers', 2 ],
                         env => { NARWHAL_TEST_RECYCLE_TURN_MS => 1000 });
    my $port = $s->port;
    my @orig = @{ wait_until(sub { my @w = worker_pids($s->pid); @w == 2 ? \@w : undef }, 10) || [] };
    is(scalar @orig, 2, 'two workers');
    require HTTP::Tiny;
    my $http = HTTP::Tiny->new(timeout => 1, keep_alive => 0);
    my $get = sub { $http->get("http://127.0.0.1:$port/") };
    my $holder = wait_until(sub {
        $get->();
        open(my $fh, '<', $stuck) or return;
        return (<$fh> // '') =~ /(\d+)/ ? $1 : undef;
    }, 10);
    ok($holder && grep({ $_ == $holder } @orig), 'a worker holding the turn is stuck on a request');
    my ($other) = grep { !$holder || $_ != $holder } @orig;
    my $t0 = time;
    my $recycled = wait_until(sub { $get->(); !pid_alive($other) }, 8, 0.001);
    ok($recycled, sprintf('the other worker was recycled all the same (%.1f s later)', time - $t0))
        or diag $s->log_text;
    ok(pid_alive($holder), '... while the holder is still on its request');
    touch($release);
    $s->stop;
};

in_parallel($successor, $in_turn, $stuck_holder);

done_testing;
