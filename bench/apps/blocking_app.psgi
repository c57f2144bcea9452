# blocking_app: /slow sleeps 100 ms (a blocking DB call, say), everything else
# is answered at once. The client asks for /slow once in 20 requests and
# reports the latency of the fast requests separately: a server that lets one
# slow request delay the fast ones shows it in the /fast p99.
use Time::HiRes ();
sub {
    my $env = shift;
    Time::HiRes::sleep(0.1) if $env->{PATH_INFO} eq '/slow';
    return [ 200, [ 'Content-Type' => 'text/plain', 'Content-Length' => 12 ], ["Hello World\n"] ];
};
