use strict;
use warnings;
use Test::More;
use Time::HiRes ();
use lib 't/lib';
use NarwhalTest qw(spawn_server raw_connect read_response tmpdir wait_until);

# The worker cleans a finished request's $env and fills it in for the next
# one ("The $env" in docs/DESIGN.md). Whatever an app does to its $env, the
# next request must see a hash indistinguishable from a fresh one, and what
# the app left in it must be freed at the end of its request, as before.

my $dir = tmpdir();
my $marker = "$dir/guard.marker";

my $app = <<"APP";
use Scalar::Util ();
my \$marker = '$marker';
package Guard { sub new { bless [\$_[1]], \$_[0] } sub DESTROY { open my \$m, '>', \$_[0][0]; print \$m 'freed' } }
my (\@kept, \$weak, \$valref);
sub describe {
    my (\$v) = \@_;
    return 'undef' unless defined \$v;
    return 'ARRAY[' . join(',', \@\$v) . ']' if ref \$v eq 'ARRAY';
    return ref(\$v) if ref \$v;
    return 'GLOB:' . *{\$v}{NAME} if ref(\\\$v) eq 'GLOB';
    return (utf8::is_utf8(\$v) ? 'utf8:' : 'bytes:') . \$v;
}
sub dump_env {
    my (\$env) = \@_;
    return join "\\n", map { "\$_=" . describe(\$env->{\$_}) . (Scalar::Util::blessed(\\\$env->{\$_}) ? ' (blessed)' : '') }
        grep { \$_ ne 'REMOTE_PORT' } sort keys %\$env;
}
my %routes = (
    '/dump' => sub { [200, [], [dump_env(\$_[0])]] },
    '/mess' => sub {
        my \$env = shift;
        \$env->{SCRIPT_NAME} = '/mounted';
        \$env->{'psgi.url_scheme'} = 'https';
        \$env->{'psgi.errors'} = \\*STDOUT;
        \$env->{'psgi.multithread'} = 1;
        \$env->{'psgi.version'} = [9, 9];
        delete \$env->{SERVER_NAME};
        delete \$env->{'psgix.harakiri'};
        utf8::decode(\$env->{PATH_INFO});
        \$env->{QUERY_STRING} = [1];
        \$env->{REMOTE_ADDR} = 42;
        \$env->{HTTP_HOST} .= '-changed';
        \$env->{HTTP_X_ADDED} = 'by the app';
        bless \\\$env->{SERVER_PROTOCOL}, 'Tagged';
        bless \\\$env->{SCRIPT_NAME}, 'Tagged';
        bless \\\$env->{HTTP_X_B}, 'Tagged';
        \$env->{'my.guard'} = Guard->new(\$marker);
        \$env->{'my.string'} = 'x' x 5000;
        my \$io = \$env->{'psgix.io'};
        push \@{ \$env->{'psgix.cleanup.handlers'} }, sub { 1 };
        [200, [], ['messed']];
    },
    '/keep' => sub { push \@kept, \$_[0]; [200, [], ['kept']] },
    '/kept' => sub { [200, [], [\$kept[0]{PATH_INFO} . '|' . (\$kept[0]{HTTP_X_KEEP} // '')]] },
    '/weak' => sub { \$weak = \$_[0]; Scalar::Util::weaken(\$weak); [200, [], ['weak']] },
    '/weak-after' => sub { [200, [], [defined \$weak ? 'alive' : 'gone']] },
    '/valref' => sub { \$valref = \\\$_[0]{HTTP_X_VAL}; [200, [], ['valref']] },
    '/valref-after' => sub { [200, [], [\$\$valref]] },
    '/add' => sub {     # /add?k1,k2: the app adds these keys (Plack::Request's way)
        my \$env = shift;
        \$env->{\$_} = "added \$_" for split /,/, \$env->{QUERY_STRING};
        [200, [], [join '|', map { \$env->{\$_} // '-' } qw(HTTP_X_LEARN)]];
    },
    '/hdr' => sub { my \$e = shift; [200, [], [join '|', map { \$e->{\$_} // '-' } qw(HTTP_X_D HTTP_X_A CONTENT_TYPE)]] },
);
sub { my \$env = shift; my (\$route) = \$env->{PATH_INFO} =~ m{^(/[a-z-]+)}; (\$routes{\$route // ''} || sub { [404, [], ['?']] })->(\$env) };
APP

my $srv = spawn_server(app => $app, args => ['--max-workers' => 1]);
my $port = $srv->port;

sub ask {
    my ($sock, $path, @headers) = @_;
    my $head = "GET $path HTTP/1.1\r\nHost: t\r\n" . join('', map { "$_\r\n" } @headers) . "\r\n";
    syswrite($sock, $head) or return undef;
    my $res = read_response($sock, 5) or return undef;
    return $res->{body};
}

my $c = raw_connect($port) or die "connect: $!";
my $fresh = ask($c, '/dump?a=1', 'X-A: 1');
like($fresh, qr/^HTTP_X_A=bytes:1$/m, 'a request header is in $env');
like($fresh, qr/^SCRIPT_NAME=bytes:$/m, 'SCRIPT_NAME empty');
like($fresh, qr/^psgi\.errors=GLOB:STDERR$/m, 'psgi.errors is STDERR');
like($fresh, qr/^psgi\.version=ARRAY\[1,1\]$/m, 'psgi.version [1,1]');
like($fresh, qr/^psgix\.io=/m, 'psgix.io is there');
is(ask($c, '/dump?a=1', 'X-A: 1'), $fresh, 'the next request on the connection sees the same $env');

ok(!-e $marker, 'nothing freed yet');
is(ask($c, '/mess%C3%A9', 'X-B: 2', 'Content-Type: text/x-mess'), 'messed', 'an app that changes everything in $env');
ok(wait_until(sub { -e $marker }, 3),
   'what the app left in $env is freed at the end of its request, before any next request');
is(ask($c, '/dump?a=1', 'X-A: 1'), $fresh, 'the request after it sees a fresh $env: template values back, '
   . 'deleted keys back, added keys and headers gone, PATH_INFO bytes again');

# Headers: a spare $env reuses the last request's header entries
is(ask($c, '/hdr', 'X-D: 1', 'X-A: a'), '1|a|-', 'headers');
is(ask($c, '/hdr', 'X-D: 1', 'X-D: 2', 'Content-Type: text/plain'), '1, 2|-|text/plain',
   'a repeated header is joined; headers absent this time are gone');
is(ask($c, '/hdr'), '-|-|-', 'no headers left over');

# Keys the app adds are deleted at the clean, found by the keys the clean
# before remembered when they are the same (and by a walk when not). A
# remembered key that arrives as a request header this time is the
# request's, not the app's: it must not be taken for an added one.
for my $round (1 .. 3) {
    is(ask($c, '/add?plack.a,plack.b'), '-', "the app adds two keys ($round)");
    is(ask($c, '/dump?a=1', 'X-A: 1'), $fresh, "then a fresh \$env ($round)");
}
is(ask($c, '/add?plack.b'), '-', 'the app adds one of the two');
is(ask($c, '/dump?a=1', 'X-A: 1'), $fresh, 'then a fresh $env');
is(ask($c, '/add?plack.c,plack.d,plack.e'), '-', 'the app adds others');
is(ask($c, '/dump?a=1', 'X-A: 1'), $fresh, 'then a fresh $env');
is(ask($c, '/add?HTTP_X_LEARN,plack.k'), 'added HTTP_X_LEARN', 'the app adds a header-like key and another');
is(ask($c, '/add?HTTP_X_LEARN,plack.k'), 'added HTTP_X_LEARN', 'again');
is(ask($c, '/add?plack.z', 'X-Learn: sent'), 'sent',
   'the same key as a request header this time: the request\'s value');
is(ask($c, '/dump?a=1', 'X-A: 1'), $fresh, 'then a fresh $env: the key the app added is gone');

# The app keeps $env, a weak reference to it, or a reference to a value
is(ask($c, '/keep', 'X-Keep: yes'), 'kept', 'the app keeps $env');
is(ask($c, '/dump?a=1', 'X-A: 1'), $fresh, 'the next request gets a fresh $env');
is(ask($c, '/kept'), '/keep|yes', 'and the kept one is untouched');
is(ask($c, '/weak'), 'weak', 'the app keeps a weak reference to $env');
is(ask($c, '/weak-after'), 'gone', 'which goes undef at the end of the request, as for any hash');
is(ask($c, '/valref', 'X-Val: mine'), 'valref', 'the app keeps a reference to a value in $env');
is(ask($c, '/dump?a=1', 'X-A: 1'), $fresh, 'the next request gets a fresh $env');
is(ask($c, '/valref-after'), 'mine', 'and the value the app holds is untouched');

# Another connection gets the spare; psgix.io is its own socket. (The
# first is closed first: with --no-manager the one worker would hold it
# for its keep-alive time, as long as ask() waits.)
close $c;
my $c2 = raw_connect($port) or die "connect: $!";
is(ask($c2, '/dump?a=1', 'X-A: 1'), $fresh, 'a request on another connection sees the same $env');
close $c2;

# The spare $env must not keep a finished connection open (psgix.io's magic
# refers to the connection): Connection: close is answered with a FIN at once.
for my $path ('/dump', '/mess') {
    my $s = raw_connect($port) or die;
    syswrite($s, "GET $path HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
    my $t0 = Time::HiRes::time();
    my $got = NarwhalTest::read_until_close($s, 5);
    my $took = Time::HiRes::time() - $t0;
    like($got, qr{^HTTP/1.1 200}, "$path with Connection: close answered");
    cmp_ok($took, '<', 2, "$path: and closed right after the response (${\ sprintf '%.2f', $took} s)");
}

done_testing;
