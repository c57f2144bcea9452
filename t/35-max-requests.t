use strict;
use warnings;
use Test::More;
use Test2::IPC;    # (parts of this file run in processes of their own)
use lib 't/lib';
use NarwhalTest qw(free_port spawn_server write_app perl_cmd manager_fallback http_get in_parallel);
use Narwhal::Options ();

# --max-requests (--max-reqs-per-child) given by the operator means what
# it says: a worker is replaced after that many requests, however young.
# --min-worker-lifetime's floor (10 s by default) holds only the default
# count, or a count given with it (Narwhal::Options, "min_worker_lifetime").

my @NM = manager_fallback();
my $APP = write_app("sub { [200, ['Content-Type' => 'text/plain'], [\"pid=\$\$\\n\"]] }\n");

is(Narwhal::Options::normalize(max_requests => 200)->{min_worker_lifetime}, 0,
   '--max-requests 200: no floor');
is(Narwhal::Options::normalize()->{min_worker_lifetime}, 10, 'the default count: the 10 s floor');
is(Narwhal::Options::normalize(max_requests => 200, min_worker_lifetime => 5)->{min_worker_lifetime}, 5,
   'a floor given with the count stays');

# 30 requests in a second or two, one worker: the pids that answered
# (20 ms apart: a replacement starting under load has time to be ready,
# and the whole is still far under the 10 s floor)
sub pids_of {
    my ($port) = @_;
    my %pid;
    for (1 .. 30) {
        select(undef, undef, undef, 0.02);
        my ($p) = (http_get($port, '/')->{content} // '') =~ /pid=(\d+)/;
        $pid{$p}++ if $p;
    }
    return scalar keys %pid;
}

in_parallel(
    sub {
        my $port = free_port();
        my $s = spawn_server(app => $APP, port => $port, args => [ @NM, '--max-workers', 1, '--max-requests', 5 ]);
        cmp_ok(pids_of($port), '>=', 3, '--max-requests 5: workers replaced every 5 requests, however young');
        $s->stop;
    },
    sub {
        my $port = free_port();
        my $s = spawn_server(app => $APP, port => $port,
                             args => [ @NM, '--max-workers', 1, '--max-requests', 5, '--min-worker-lifetime', 10 ]);
        is(pids_of($port), 1, '--max-requests 5 --min-worker-lifetime 10: the floor asked for holds');
        $s->stop;
    },
    sub {
        SKIP: {
            skip 'plackup is not installed', 1 unless -x '/usr/bin/plackup';
            my $port = free_port();
            my $s = spawn_server(port => $port, command => [ perl_cmd(), '/usr/bin/plackup', '-s', 'Narwhal',
                '-E', 'deployment', (@NM ? '--manager=0' : ()), '--listen', "127.0.0.1:$port",
                '--max-workers', 1, '--max-requests', 5, $APP ]);
            cmp_ok(pids_of($port), '>=', 3, 'plackup --max-requests 5: the same');
            $s->stop;
        }
    },
);
done_testing;
