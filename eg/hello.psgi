# The smallest Narwhal example: narwhal eg/hello.psgi
my $body = "Hello, World!\n";
sub {
    my $env = shift;
    return [ 200, [ 'Content-Type' => 'text/plain' ], [ $body ] ];
};
