use strict;
use warnings;
use Test::More;
use Test2::IPC;    # (parts of this file run in processes of their own)
use lib 't/lib';
use IO::Select ();
use HTTP::Tiny ();    # (loaded now: '... at once' below times the server, not its loading)
use Socket qw(AF_UNIX SOCK_DGRAM pack_sockaddr_un);
use Time::HiRes qw(time sleep);
use NarwhalTest qw(spawn_server write_app wait_until tmpdir manager_fallback http_get worker_pids
                   in_parallel);

# systemd's side of Type=notify, played with our own datagram socket: the
# master sends READY=1 only once its workers serve, RELOADING=1 and then
# READY=1 around a HUP, STOPPING=1 when a stop begins, each with a
# one-line STATUS=; the workers do not see NOTIFY_SOCKET.

my @NM = manager_fallback();
my $TMP = tmpdir();

# Each worker takes half a second to load the app while the file that
# NARWHAL_TEST_SLOW_LOAD names exists: READY=1 must wait for it. (Only the
# workers, whose parent is the master by then: its own check that the app
# loads, --no-preload-app, is quick, so that a READY=1 sent before the
# workers loaded would come well within that half second.)
my $APP = write_app(<<'APP');
my $parent = do { open(my $c, '<', '/proc/' . getppid() . '/cmdline'); $c ? <$c> // '' : '' };
Time::HiRes::sleep(0.5) if -e ($ENV{NARWHAL_TEST_SLOW_LOAD} // '') && $parent =~ /^narwhal master/;
sub { [200, ['Content-Type' => 'text/plain'], ["notify=" . ($ENV{NOTIFY_SOCKET} // 'none') . "\n"]] }
APP

sub listen_notify {
    my ($addr) = @_;
    socket(my $s, AF_UNIX, SOCK_DGRAM, 0) or die "socket: $!";
    bind($s, pack_sockaddr_un($addr)) or die "bind: $!";
    return $s;
}

# The next datagram within $timeout s, as { KEY => value }, with its raw text.
sub next_message {
    my ($s, $timeout) = @_;
    return undef unless IO::Select->new($s)->can_read($timeout);
    recv($s, my $buf, 4096, 0) // return undef;
    my %kv = map { /^([A-Z_]+)=(.*)$/ ? ($1 => $2) : () } split /\n/, $buf;
    return { %kv, _raw => $buf, _at => time };
}

# A server of its own that notifies a socket of its own, $part naming
# both (the parts run at once); its workers load slowly while
# $TMP/slow-$part exists. Returns the socket, the server and the time
# before the start.
sub notified_server {
    my ($part, $name, $slow) = @_;
    my ($bind, $env) = $name eq 'a socket path' ? ("$TMP/notify-$part.sock") x 2
                     : ("\0narwhal-test-$$-$part", "\@narwhal-test-$$-$part");
    my $flag = "$TMP/slow-$part";
    if ($slow) { open(my $fh, '>', $flag) or die "$flag: $!" }
    my $n = listen_notify($bind);
    my $t0 = time;
    my $s = spawn_server(app => $APP, env => { NOTIFY_SOCKET => $env, NARWHAL_TEST_SLOW_LOAD => $flag },
                         args => [ @NM, '--no-preload-app', '--max-workers', 2 ]);
    return ($n, $s, $t0);
}

# Each case in three parts, each with a server of its own (they run at
# once): the start, while it serves, a HUP and then a TERM.
my @parts;
for my $name ('a socket path', 'an abstract socket') {
    my $id = $name =~ /path/ ? 'path' : 'abstract';
    push @parts, sub { subtest "$name: READY=1 once the workers serve" => sub {
        my ($n, $s, $t0) = notified_server("$id-start", $name, 'slow');
        my $m = next_message($n, 15);
        ok($m && $m->{READY}, 'READY=1 arrives') or diag explain $m;
        cmp_ok($m->{_at} - $t0, '>=', 0.45, 'only once the workers had loaded the app (0.5 s each)') if $m;
        like($m->{STATUS} // '', qr/^2 worker\(s\) serving on 127\.0\.0\.1:\d+/, 'STATUS= says it in one line');
        my $t1 = time;
        my $r = http_get($s->port, '/');
        is($r->{status}, 200, 'the server serves at READY');
        cmp_ok(time - $t1, '<', 0.5, '... at once');
        is($r->{content}, "notify=none\n", "the app does not see NOTIFY_SOCKET");
    } };
    push @parts, sub { subtest "$name: nothing more while it serves" => sub {
        my ($n, $s) = notified_server("$id-serving", $name);
        my $m = next_message($n, 15);
        ok($m && $m->{READY}, 'READY=1 arrives') or diag explain $m;
        is(http_get($s->port, '/')->{status}, 200, 'the server serves');
        # (the master notifies from its manage loop, which looks every 50 ms
        # in a test server: seven looks)
        ok(!next_message($n, 0.35), 'nothing more while it serves');
    } };
    push @parts, sub { subtest "$name: HUP, then TERM" => sub {
        my ($n, $s) = notified_server("$id-reload", $name);
        my $m = next_message($n, 15);
        ok($m && $m->{READY}, 'READY=1 arrives') or diag explain $m;
        # the next generation loads slowly
        open(my $fh, '>', "$TMP/slow-$id-reload") or die "$TMP/slow-$id-reload: $!";
        my $t_hup = time;
        kill HUP => $s->pid;
        my $reload = next_message($n, 5);
        ok($reload && $reload->{RELOADING}, 'HUP: RELOADING=1') or diag explain $reload;
        like($reload->{MONOTONIC_USEC} // '', qr/^\d+$/, '... with MONOTONIC_USEC');
        my $again = next_message($n, 15);
        ok($again && $again->{READY}, '... then READY=1') or diag explain $again;
        # (from the HUP: RELOADING=1 may reach us late on a busy machine)
        cmp_ok($again->{_at} - $t_hup, '>=', 0.45, '... once the new workers had loaded the app')
            if $again;

        kill TERM => $s->pid;
        my $stop = next_message($n, 5);
        ok($stop && $stop->{STOPPING}, 'TERM: STOPPING=1') or diag explain $stop;
        like($stop->{STATUS} // '', qr/stopping/, '... with a STATUS=');
        ok(defined $s->wait_exit(10), 'and it stops');
    } };
}

# A crash loop at start is never ready.
push @parts, sub { subtest 'workers that cannot load the app' => sub {
    my $n = listen_notify("$TMP/never.sock");
    my $bad = write_app("die 'no app here';\n");
    my $s = spawn_server(app => $bad, env => { NOTIFY_SOCKET => "$TMP/never.sock" },
                         args => [ @NM, '--no-preload-app', '--max-workers', 1 ],
                         ready => sub { 1 });
    # (the master gives up at once here: once it is gone, nothing more can
    # come; while it runs, the wait is 3 s, as it was)
    $s->wait_exit(3);
    my $m = next_message($n, 0.1);
    ok(!$m || !$m->{READY}, 'no READY=1 while no worker serves') or diag explain $m;
    $s->stop;
} };

# All at once (each has its own server and socket; they wait for apps
# that load for half a second, or for a quiet 0.35 s).
in_parallel(@parts);
done_testing();
