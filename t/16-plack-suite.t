use strict;
use warnings;
use Test::More;
use Test2::IPC;    # (the shapes run in processes of their own)
use lib 't/lib';
use NarwhalTest qw(raw_connect read_response tmpdir in_parallel free_port);
# The servers here start in this process's children, not through
# spawn_server: the short stop timings spawn_server gives its servers
# (NarwhalTest's TEST_TIMING) are set here, before Narwhal's modules read
# them.
BEGIN { %ENV = (%ENV, NarwhalTest::TEST_TIMING()) }
use HTTP::Response ();
use Plack::Test::Suite;
use Plack::Handler::Narwhal;

# Plack's own server test suite, run against Narwhal in several shapes:
# HTTP/1.1 and 1.0, TCP and a unix socket, one and several workers,
# keep-alive on and off.

my @configs = (
    { name => 'HTTP/1.1 TCP, 1 worker',          workers => 1 },
    { name => 'HTTP/1.1 TCP, 3 workers',         workers => 3 },
    { name => 'HTTP/1.0 TCP, 2 workers',         workers => 2, version => '1.0' },
    { name => 'HTTP/1.1 unix socket, 2 workers', workers => 2, unix => 1 },
    { name => 'HTTP/1.0 unix socket, 1 worker',  workers => 1, unix => 1, version => '1.0' },
    { name => 'keep-alive disabled, 2 workers',  workers => 2, args => { disable_keepalive => 1 } },
);

# Each shape with its own server, all at once.
in_parallel(map { my $c = $_; sub { subtest $c->{name} => sub { run_suite($c) } } } @configs);
done_testing;

sub run_suite {
    my ($c) = @_;
    my $sock = $c->{unix} ? tmpdir() . "/suite-$$-" . int(rand 1e6) . ".sock" : undef;
    no warnings 'redefine';
    # Test::TCP takes the kernel's pick of a free port, from the range the
    # suite's clients take their local ports from by the thousand: one of
    # them held it once before the server bound it ("cannot listen ...
    # Address already in use"). free_port draws below that range.
    local *Test::TCP::empty_port = sub { free_port() };
    local *Plack::LWPish::request = sub { raw_client($c, $sock, $_[1]) }
        if $c->{unix} || $c->{version};
    Plack::Test::Suite->run_server_tests(sub {
        my ($port, $app) = @_;
        $app = Plack::Middleware::Lint->wrap($app);
        my @listen = ("127.0.0.1:$port", $sock ? ($sock) : ());
        Plack::Handler::Narwhal->new(
            listen => \@listen, max_workers => $c->{workers},
            graceful_timeout => 2, %{ $c->{args} || {} },
        )->run($app);
    });
}

# A client for what HTTP::Tiny cannot do: HTTP/1.0, and unix sockets.
sub raw_client {
    my ($c, $sock_path, $req) = @_;
    my $version = $c->{version} || '1.1';
    # (the suite waits for the TCP port; the unix socket is opened just
    # after it, and a client can come in between)
    NarwhalTest::wait_until(sub { -S $sock_path }, 5) if $sock_path;
    my $s = raw_connect($sock_path || $req->uri->port) or die "connect: $!";
    my $uri = $req->uri;
    my $path = $uri->path_query;
    $path = '/' unless length $path;
    my $content = $req->content // '';
    my @h = ("Host: " . $uri->host_port);
    $req->header('Content-Length' => length $content)
        if length $content && !defined $req->header('Content-Length');
    $req->headers->scan(sub { push @h, "$_[0]: $_[1]" unless lc $_[0] eq 'host' });
    push @h, 'Connection: close' if $version eq '1.1';
    syswrite($s, join("\r\n", $req->method . " $path HTTP/$version", @h, '', '') . $content);
    my $r = read_response($s, 10, $req->method eq 'HEAD')
        or return HTTP::Response->new(599, 'no response');
    my $res = HTTP::Response->new($r->{status}, $r->{reason});
    $res->protocol($r->{protocol});
    $res->push_header($_->[0] => $_->[1]) for @{ $r->{header_list} };
    $res->content($r->{body});
    $res->request($req);
    return $res;
}
