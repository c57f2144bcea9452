# typical_app: what a small real application costs: Plack::Builder, an
# AccessLog middleware (logging to nowhere), Plack::Request parsing the query
# string. 12-byte body, no Content-Length (the server has to work it out).
use Plack::Builder;
use Plack::Request;

my $app = sub {
    my $req = Plack::Request->new(shift);
    my $foo = $req->param('foo');
    return [ 200, [ 'Content-Type' => 'text/plain' ], ["Hello World\n"] ];
};

builder {
    enable 'AccessLog', logger => sub { };
    $app;
};
