# file_2_4mb: a 2.4 MB file returned as a real filehandle (sendfile-able).
# bench/run generates the file in its temp dir and passes it in BENCH_FILE.
my $path = $ENV{BENCH_FILE} or die "BENCH_FILE is not set\n";
my $size = -s $path or die "BENCH_FILE $path: missing or empty\n";
sub {
    open my $fh, '<:raw', $path or return [ 500, [], ["open: $!\n"] ];
    return [ 200, [ 'Content-Type' => 'application/octet-stream', 'Content-Length' => $size ], $fh ];
};
