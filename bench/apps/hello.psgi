# hello: the smallest useful response, 12-byte body with Content-Length.
# Used by hello_keepalive_*, hello_close, idle_keepalive_manager_*, idle_10k_plus_one.
my $body = "Hello World\n";
sub {
    return [ 200, [ 'Content-Type' => 'text/plain', 'Content-Length' => 12 ], [$body] ];
};
