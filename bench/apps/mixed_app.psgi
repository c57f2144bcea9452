# mixed_app: most requests are quick, a few are very slow. /slow sleeps
# BENCH_SLOW_MS (default 1000: a report, an export), everything else sleeps
# BENCH_FAST_MS (default 2: a small query); Time::HiRes::sleep, so neither
# costs CPU. The client picks the mix: bench/real-apps sends 1 request in
# 100 to /slow and reports the fast requests' latency on its own
# (bench/build/kaclient --paths /fast:99,/slow:1), which shows whether a
# slow request holds up quick ones queued behind it. 12 bytes with
# Content-Length.
use Time::HiRes ();
my $fast = ($ENV{BENCH_FAST_MS} // 2) / 1000;
my $slow = ($ENV{BENCH_SLOW_MS} // 1000) / 1000;
my $body = "Hello World\n";
sub {
    my $env = shift;
    Time::HiRes::sleep($env->{PATH_INFO} eq '/slow' ? $slow : $fast);
    return [ 200, [ 'Content-Type' => 'text/plain', 'Content-Length' => 12 ], [$body] ];
};
