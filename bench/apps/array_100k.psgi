# array_100k: a 100 KB body given as an array of 100 pieces of 1 KB,
# no Content-Length: stresses body assembly (writev / buffering).
my @body = map { ('x' x 1023) . "\n" } 1 .. 100;
sub {
    return [ 200, [ 'Content-Type' => 'text/plain' ], [@body] ];
};
