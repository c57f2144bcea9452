# cpu_app: a request that keeps the CPU busy (templating, JSON, sums):
# about BENCH_CPU_MS milliseconds of CPU (default 2) in a busy loop, then
# 12 bytes with Content-Length. The loop is calibrated once, when the app
# is loaded: it is grown until one run takes 50 ms of this process's CPU
# time (CLOCK_PROCESS_CPUTIME_ID, so time spent waiting for a CPU does not
# count), the fastest of 5 such runs sets the cost of one iteration, and a
# request runs BENCH_CPU_MS worth of them. BENCH_CPU_ITERS skips the
# calibration and fixes the count: bench/real-apps calibrates once and
# gives every server the same count, so all do the same work.
#   perl -e 'do "./bench/apps/cpu_app.psgi"; print "$BenchCpu::ITERS\n"'
# prints the count this machine gets for 2 ms (31,577 on the 2-core Xeon VM
# the benchmarks run on; one iteration is a multiply, an add and a modulo).
package BenchCpu {
    use strict;
    use warnings;
    use Time::HiRes qw(clock_gettime CLOCK_PROCESS_CPUTIME_ID);

    our $MS = $ENV{BENCH_CPU_MS} // 2;

    sub burn {
        my ($n) = @_;
        my $x = 1;
        $x = ($x * 33 + $_) % 1_000_003 for 1 .. $n;
        return $x;
    }

    sub cpu_seconds { return clock_gettime(CLOCK_PROCESS_CPUTIME_ID) }

    sub calibrate {
        my $n = 1000;
        burn($n);
        while (1) {
            my $t0 = cpu_seconds();
            burn($n);
            last if cpu_seconds() - $t0 >= 0.05;
            $n *= 2;
        }
        my $best;
        for (1 .. 5) {
            my $t0 = cpu_seconds();
            burn($n);
            my $dt = cpu_seconds() - $t0;
            $best = $dt if !defined $best || $dt < $best;
        }
        return int($MS / 1000 * $n / $best + 0.5) || 1;
    }

    our $ITERS = $ENV{BENCH_CPU_ITERS} || calibrate();
}

my $body = "Hello World\n";
sub {
    BenchCpu::burn($BenchCpu::ITERS);
    return [ 200, [ 'Content-Type' => 'text/plain', 'Content-Length' => 12 ], [$body] ];
};
