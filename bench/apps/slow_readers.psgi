# slow_readers: "/" answers hello; "/big" a 10 MB body as one array piece
# (what slow readers ask for in bench/slow-readers; nginx serves the same
# bytes as a static file).
my $big = 'x' x (10 * 1024 * 1024);
sub {
    my $env = shift;
    return [ 200, [ 'Content-Type' => 'application/octet-stream' ], [$big] ] if $env->{PATH_INFO} eq '/big';
    return [ 200, [ 'Content-Type' => 'text/plain', 'Content-Length' => 12 ], ["Hello World\n"] ];
};
