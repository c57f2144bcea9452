use strict;
use warnings;
use Test::More;
use Time::HiRes ();
use lib 't/lib';
use NarwhalTest qw(spawn_server raw_connect read_response wait_until);

# The park watcher's lock is held while acceptor methods free connection
# objects, and that can run Perl code: here a parked connection's psgix.io
# handle, blessed by the app, has a DESTROY that calls exit. Leaving the
# XS method that way must release the lock, or the worker would hang when
# its END block or the acceptor's DESTROY takes it again.

plan skip_all => 'the manager is switched off for this run'
    if !NarwhalTest::managed();

my $app = <<'APP';
sub Bye::DESTROY { exit 0 }
sub {
    my $env = shift;
    bless $env->{'psgix.io'}, 'Bye' if $env->{PATH_INFO} eq '/io';
    [200, ['Content-Type' => 'text/plain'], ["pid=$$"]];
}
APP

my $srv = spawn_server(app => $app, args => [ '--max-workers' => 1, '--keepalive-wait' => 0.3 ]);
my $s = raw_connect($srv->port);
syswrite($s, "GET /io HTTP/1.1\r\nHost: t\r\n\r\n");
my $r = read_response($s, 5);
my ($pid) = ($r && $r->{body} // '') =~ /pid=(\d+)/;
ok($pid, 'served; the connection is parked') or return done_testing();
# After --keepalive-wait it is handed to the manager and its Conn freed,
# under the lock: the app's DESTROY exits.
my $gone = wait_until(sub {
    return 1 unless kill 0, $pid;
    open my $fh, '<', "/proc/$pid/stat" or return 1;
    return (split ' ', scalar <$fh>)[2] eq 'Z';
}, 3);
ok($gone, 'the worker that exited in a DESTROY is gone (not hung on park_lock)');
kill KILL => $pid unless $gone;    # do not make the server's stop wait for it
done_testing();
