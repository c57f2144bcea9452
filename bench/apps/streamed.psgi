# streamed: psgi.streaming with a writer, 4 chunks (chunked encoding on the wire).
my @chunks = map { "chunk $_ " . ('s' x 56) . "\n" } 1 .. 4;
sub {
    my $env = shift;
    return sub {
        my $respond = shift;
        my $w = $respond->([ 200, [ 'Content-Type' => 'text/plain' ] ]);
        $w->write($_) for @chunks;
        $w->close;
    };
};
