# sleep_app: a request that waits on something else (a database query, an
# API call) and costs the process almost no CPU: it sleeps BENCH_SLEEP_MS
# milliseconds (default 5) with Time::HiRes::sleep, then answers 12 bytes
# with Content-Length. One file for bench/real-apps' sleep1/5/20/100 rows:
#   BENCH_SLEEP_MS=20 plackup -s Starman bench/apps/sleep_app.psgi
# A pool of W workers tops out at W / (BENCH_SLEEP_MS / 1000) requests a second.
use Time::HiRes ();
my $secs = ($ENV{BENCH_SLEEP_MS} // 5) / 1000;
my $body = "Hello World\n";
sub {
    Time::HiRes::sleep($secs);
    return [ 200, [ 'Content-Type' => 'text/plain', 'Content-Length' => 12 ], [$body] ];
};
