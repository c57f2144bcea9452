use strict;
use warnings;
use Test::More;
use Test2::IPC;    # (parts of this file run in processes of their own)
use lib 't/lib';
use File::Temp ();
use IO::Socket::UNIX ();
use Socket ();
use POSIX ();
use Time::HiRes qw(time sleep);
use NarwhalTest qw(spawn_server write_app raw_connect read_response wait_until narwhal_cmd
                   run_cmd free_port manager_fallback perl_cmd root missing in_parallel);

# Listening as deployments need it: unix sockets with a mode and group set
# before anyone can connect (and docs/DEPLOY.md's nginx recipe, with
# Debian's nginx running its workers as www-data), one listener however it is
# spelled (plackup passes a path twice), --reuse-port, a TCP address as
# several sockets (--listen-queues), and the status pages' unix socket.
# The ten parts below, each with servers of its own, run at once.

my @NM = manager_fallback();
my $APP = write_app("sub { [200, ['Content-Type' => 'text/plain'], [\"ok \$\$\\n\"]] }");
my $DIR = File::Temp::tempdir('narwhal-sock-XXXXXX', TMPDIR => 1, CLEANUP => 1);
chmod 0755, $DIR;

sub get_unix {
    my ($path) = @_;
    my $c = raw_connect($path) or return undef;
    syswrite($c, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    return read_response($c, 5);
}

# 1. --socket-mode and --socket-group
my $part_mode = sub {
    # a group that is not the one the file would get anyway: nogroup as
    # root, else one of ours besides the primary (or the primary alone)
    my ($primary, @ours) = split ' ', $);
    my ($gid) = $> == 0 ? (scalar(getgrnam('nogroup')) // 65534) : ((grep { $_ != $primary } @ours), $primary);
    my $path = "$DIR/mode.sock";
    my $s = spawn_server(app => $APP, no_listen => 1, unix => $path,
                         args => [ @NM, '--socket-mode', '0660', '--socket-group', $gid ]);
    my @st = stat $path;
    is(sprintf('%04o', $st[2] & 07777), '0660', '--socket-mode 0660');
    is($st[5], $gid, "--socket-group sets the group ($gid)");
    is(get_unix($path)->{status}, 200, 'and it serves');
    $s->stop;
    my $plain = "$DIR/plain.sock";
    my $s2 = spawn_server(app => $APP, no_listen => 1, unix => $plain, args => [@NM]);
    my $mode = (stat $plain)[2] & 07777;
    is(sprintf('%04o', $mode), sprintf('%04o', 0777 & ~umask), 'without --socket-mode: the umask decides');
};

# 1b. The status pages' unix socket takes the same mode and group: it was
# left to the umask (0755), so that only root could connect, and a
# scraper running as any other user could not read /metrics.
my $part_status_mode = sub {
  SKIP: {
    skip('the status pages need the connection manager (this run is --no-manager)', 4) unless NarwhalTest::managed();
    my ($primary, @ours) = split ' ', $);
    my ($gid) = $> == 0 ? (scalar(getgrnam('nogroup')) // 65534) : ((grep { $_ != $primary } @ours), $primary);
    my ($path, $status) = ("$DIR/app-st.sock", "$DIR/status.sock");
    my $s = spawn_server(app => $APP, no_listen => 1, unix => $path,
                         args => [ '--status-listen', $status, '--socket-mode', '0666',
                                   '--socket-group', $gid ]);
    # (opened just after the app's; its mode and group are set between its
    # bind and its listen, so once a client can connect they are there)
    wait_until(sub { -S $status && IO::Socket::UNIX->new(Peer => $status, Type => Socket::SOCK_STREAM()) }, 5);
    my @st = stat $status;
    is(sprintf('%04o', $st[2] & 07777), '0666', '--socket-mode applies to --status-listen\'s socket');
    is($st[5], $gid, "... and --socket-group ($gid)");
    my $health = sub {      # /health through the socket, in a child as nobody when root
        my $pid = fork // die "fork: $!";
        if (!$pid) {
            if ($> == 0) {
                my ($uid, $ngid) = (getpwnam('nobody'))[2, 3];
                POSIX::setgid($ngid);
                POSIX::setuid($uid) or POSIX::_exit(3);
            }
            my $c = raw_connect($status) or POSIX::_exit(2);
            syswrite($c, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
            my $r = read_response($c, 5);
            POSIX::_exit($r && $r->{status} == 200 ? 0 : 1);
        }
        waitpid($pid, 0);
        return $? >> 8;
    };
    my $said;    # (503 "starting" until a worker serves)
    wait_until(sub { ($said = $health->()) == 0 }, 5);
    is($said, 0, $> == 0 ? 'a client running as nobody reads /health'
                                : 'a client reads /health');
    $s->stop;
    my $status2 = "$DIR/status2.sock";    # (a stop leaves the status socket's file)
    my $s2 = spawn_server(app => $APP, no_listen => 1, unix => $path,
                          args => [ '--status-listen', $status2 ]);
    # (bound under umask 0177, then given its mode: wait for the mode)
    my $mode_of = sub { -S $status2 ? sprintf('%04o', (stat $status2)[2] & 07777) : '' };
    wait_until(sub { $mode_of->() eq sprintf('%04o', 0777 & ~umask) }, 5);
    is($mode_of->(), sprintf('%04o', 0777 & ~umask),
       'without --socket-mode: the umask decides, as for the app\'s');
    $s2->stop;
  }
};

# 2. Refusals: one line, non-zero.
my $part_refusals = sub {
    for my $case ([ [ '--socket-mode', '0999' ], qr/--socket-mode wants an octal mode/ ],
                  [ [ '--socket-mode', 'rw' ], qr/--socket-mode wants an octal mode/ ],
                  [ [ '--socket-group', 'no-such-group-here' ], qr/--socket-group: no group 'no-such-group-here'/ ]) {
        my ($args, $want) = @$case;
        my $r = run_cmd([ narwhal_cmd(), '--listen', "$DIR/x.sock", @$args, $APP ], timeout => 10);
        isnt($r->{code}, 0, "@$args: refused");
        like($r->{err}, $want, '... saying why');
    }
};

# 3. One listener however it is spelled: the second spelling used to fail
# with "address in use" (or "another server is listening there").
my $part_spellings = sub {
    my $port = free_port();
    my $s = spawn_server(app => $APP, no_listen => 1, port => $port,
                         command => [ narwhal_cmd(), @NM, '--listen', ":$port", '--listen', "0.0.0.0:$port", $APP ]);
    ok($s->pid, ':PORT and 0.0.0.0:PORT open one listener');
    my $path = "$DIR/twice.sock";
    my $u = spawn_server(app => $APP, no_listen => 1, unix => $path,
                         command => [ narwhal_cmd(), @NM, '--listen', $path, '--listen', "unix:$path", $APP ]);
    is(get_unix($path)->{status}, 200, 'PATH and unix:PATH open one listener');
    $u->stop;
    SKIP: {
        my $plackup = (grep { -x } '/usr/bin/plackup')[0] or missing('plackup not installed', 1);
        my $p2 = "$DIR/plackup.sock";
        my $pl = spawn_server(app => $APP, no_listen => 1, unix => $p2,
                              command => [ perl_cmd(), $plackup, '-s', 'Narwhal', @NM ? ('--no-manager=1') : (),
                                           '--listen', $p2, $APP ]);
        is(get_unix($p2)->{status}, 200, 'plackup -s Narwhal --listen PATH starts and serves');
    }
};

# 4. --reuse-port: a second instance on the same port starts; without it, not.
my $part_reuse_port = sub {
    my $port = free_port();
    my @one = ('--reuse-port', '--listen-queues', 1);
    my $a = spawn_server(app => $APP, port => $port, args => [ @NM, @one ]);
    my $b = spawn_server(app => $APP, port => $port, args => [ @NM, @one ]);
    # (a connect proves nothing here: the first answers it) two listening sockets on the port
    SKIP: {
        missing('ss (iproute2) is not installed', 1) unless have_ss();
        ok(wait_until(sub { 2 == grep { /:$port\b/ } `ss -Hltn 2>/dev/null` }, 10),
           'two instances with --reuse-port listen on one port');
    }
    $a->stop;
    my $r0;
    wait_until(sub {
        my $c = raw_connect($port) or return 0;
        syswrite($c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
        $r0 = read_response($c, 5);
    }, 5);
    is($r0 && $r0->{status}, 200, 'the second serves when the first has gone');
    # (the second instance's sockets have SO_REUSEPORT: one that would
    # open several queues must still be refused, not join them)
    my $r = run_cmd([ narwhal_cmd(), '--listen', "127.0.0.1:$port", '--listen-queues', 2, $APP ],
                    timeout => 10);
    isnt($r->{code}, 0, 'without --reuse-port a second instance is refused');
    like($r->{err}, qr/cannot listen on 127\.0\.0\.1:$port/, '... saying so');
};

# 5. The nginx recipe of docs/DEPLOY.md, as written, with Debian's nginx running its
# workers as www-data.
my $part_nginx = sub {
    SKIP: {
        missing('needs root, nginx and a www-data user', 3) if $> || !-x '/usr/sbin/nginx' || !defined getpwnam('www-data');
        open(my $rf, '<', root() . '/docs/DEPLOY.md') or die;
        (my $deploy = do { local $/; <$rf> }) =~ s/ *\\\n */ /g;    # (a command continued with \)
        my ($cmd) = $deploy =~ m{^    (narwhal --listen /run/narwhal/app\.sock[^\n]*)$}m
            or skip 'docs/DEPLOY.md has no nginx recipe command', 3;
        my @args = split ' ', $cmd;
        shift @args;
        pop @args;    # app.psgi
        my $sock = "$DIR/run/app.sock";
        mkdir "$DIR/run";
        s{/run/narwhal/app\.sock}{$sock} for @args;
        my $s = spawn_server(app => $APP, no_listen => 1, unix => $sock, args => [ @NM, @args ]);
        my $port = free_port();
        my $conf = "$DIR/nginx.conf";
        open(my $nf, '>', $conf) or die;
        print $nf <<"CONF";
user www-data;
daemon off;
pid $DIR/nginx.pid;
error_log $DIR/nginx-error.log;
events { worker_connections 64; }
http {
    access_log off;
    client_body_temp_path $DIR/tmp_body;
    proxy_temp_path $DIR/tmp_proxy;
    fastcgi_temp_path $DIR/tmp_fastcgi;
    uwsgi_temp_path $DIR/tmp_uwsgi;
    scgi_temp_path $DIR/tmp_scgi;
    upstream narwhal { server unix:$sock; keepalive 32; }
    server {
        listen 127.0.0.1:$port;
        location / {
            proxy_pass http://narwhal;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host \$host;
        }
    }
}
CONF
        close $nf;
        my $ng = spawn_server(app => $APP, port => $port, command => [ '/usr/sbin/nginx', '-c', $conf, '-e', "$DIR/nginx-error.log" ]);
        my $c = raw_connect($port);
        syswrite($c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
        my $r = read_response($c, 5);
        is($r && $r->{status}, 200, "nginx as www-data reaches Narwhal through docs/DEPLOY.md's recipe ($cmd)");
        like($r->{body}, qr/^ok \d+/, '... and gets the app\'s answer');
        $s->stop;
        # the same without the socket options: nginx's workers cannot connect
        my $s2 = spawn_server(app => $APP, no_listen => 1, unix => $sock, args => [ @NM, '--listen', $sock ]);
        $c = raw_connect($port);
        syswrite($c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
        $r = read_response($c, 5);
        is($r && $r->{status}, 502, 'without --socket-mode/--socket-group nginx gets 502 (what the recipe used to give)');
        $ng->stop;
    }
};

# 6. --backlog: by default the kernel's somaxconn (at least 1024), as the
# listen queue's limit that ss shows; a given value is used as it is.
my $part_backlog = sub {
    SKIP: {
        missing('ss (iproute2) is not installed', 2) unless grep { -x "$_/ss" } split(/:/, $ENV{PATH}), '/usr/sbin', '/sbin';
        open my $fh, '<', '/proc/sys/net/core/somaxconn' or die "somaxconn: $!";
        my ($somaxconn) = <$fh> =~ /(\d+)/;
        my $want = $somaxconn > 1024 ? $somaxconn : 1024;
        $want = $somaxconn if $want > $somaxconn;   # listen() caps it
        for my $case ([ [], $want, "the default follows net.core.somaxconn ($somaxconn)" ],
                      [ [ '--backlog', 100 ], 100, '--backlog 100' ]) {
            my ($args, $limit, $name) = @$case;
            my $port = free_port();
            my $s = spawn_server(app => $APP, port => $port, args => [ @NM, @$args ]);
            my ($line) = grep { /127\.0\.0\.1:$port\s/ } split /\n/, run_cmd([ 'ss', '-Hltn' ])->{out};
            my (undef, undef, $sendq) = split ' ', $line // '';
            is($sendq, $limit, "$name: a listen queue of $limit");
            $s->stop;
        }
    }
};

# 7. --listen-queues: a TCP address is several sockets, each with a queue
# of --backlog. With the workers stopped, 30 clients that have sent their
# requests wait in the kernel: four queues of 16 hold them all, one holds
# 17 at most (the rest are dropped, and come back when the clients
# retransmit); woken, the workers answer every one. (Without the manager,
# which would take the clients itself when the workers take none.)
sub queued_on {    # per listening socket on the port: its accept queue
    my ($port) = @_;
    return map { (split ' ')[1] } grep { /127\.0\.0\.1:$port\s/ } `ss -Hltn 2>/dev/null`;
}
sub sockets_on {   # how many listen on server $s's port, once it has a worker
    my ($s, $port) = @_;    # (a connect answers once the first socket listens,
    wait_until(sub { NarwhalTest::worker_pids($s->pid) }, 10);  # a moment before the
    return scalar(() = queued_on($port));                        # others are opened)
}
my $part_queues = sub {
    SKIP: {
        missing('ss (iproute2) is not installed', 17) unless have_ss();
        for my $queues (4, 1) {
            my $port = free_port();
            my $s = spawn_server(app => $APP, port => $port,
                                 args => [ '--no-manager', '--max-workers', 2, '--backlog', 16,
                                           '--listen-queues', $queues ]);
            is(sockets_on($s, $port), $queues, "--listen-queues $queues: as many sockets on the port");
            my @w;
            wait_until(sub { (@w = NarwhalTest::worker_pids($s->pid)) == 2 }, 10);
            is(scalar(() = $s->log_text =~ /warn: --listen-queues \d+ without the connection manager/g),
               $queues > 1 ? 1 : 0, '... said to be a risk without the manager: ' . ($queues > 1 ? 'once' : 'not for 1'));
            is(kill(STOP => @w), 2, 'both workers stopped');
            my @c = map { raw_connect($port) } 1 .. 30;
            syswrite($_, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n") for grep { $_ } @c;
            my $held = 0;
            wait_until(sub { $held = 0; $held += $_ for queued_on($port); $held >= 30 }, 1);
            if ($queues > 1) {
                cmp_ok($held, '>=', 30, 'four queues of 16 hold 30 waiting clients');
            } else {
                cmp_ok($held, '<=', 17, 'one queue of 16 holds 17 at most');
            }
            kill CONT => @w;
            my $ok = grep { my $r = $_ && read_response($_, 10); $r && $r->{status} == 200 } @c;
            is($ok, 30, "--listen-queues $queues: all 30 answered once the workers run");
            $s->stop;
        }
        my $r = run_cmd([ narwhal_cmd(), '--listen-queues', 32, map({ ('--listen', "127.0.0.1:$_") }
                          2 .. 3), $APP ], timeout => 10);
        isnt($r->{code}, 0, '--listen-queues past the listeners a worker watches is refused');
        like($r->{err}, qr/^narwhal: --listen-queues 32: 2 TCP addresses with 32 sockets each .* more than the 63 listeners/,
             '... in one line');
        my $port = free_port();
        my $s = spawn_server(app => $APP, port => $port, args => [ @NM, '--accepting-workers', 3 ]);
        my $want = NarwhalTest::managed() ? 3 : 1;   # (without the manager: one, below)
        is(sockets_on($s, $port), $want, "by default, one socket per accepting worker ($want)");
        like($s->log_text, qr/listening on 127\.0\.0\.1:$port with/, 'the start line names the address once');
        $s->stop;
        # (--accepting-workers defaults to the CPUs: never more queues than workers)
        $port = free_port();
        $s = spawn_server(app => $APP, port => $port, args => [ @NM, '--max-workers', 1,
                                                                '--accepting-workers', 3 ]);
        is(sockets_on($s, $port), 1, 'one worker, three accepting asked for: one socket');
        $s->stop;
        # Without the connection manager (--no-manager, or none needed:
        # --disable-keepalive) a wake-up a worker took and left (two
        # queues reported, one served) is passed on by nobody: a client
        # waited for a busy worker's whole request while another sat idle
        # (t/73 part 5, a few rounds in 30). So one queue by default.
        for my $no ([ '--no-manager' ], [ '--disable-keepalive' ]) {
            my $p = free_port();
            my $n = spawn_server(app => $APP, port => $p, args => [ @$no, '--max-workers', 3 ]);
            is(sockets_on($n, $p), 1, "@$no: by default one socket per address");
            $n->stop;
        }
    }
};
# 8. Twelve listeners (six addresses, two queues each): a client the
# manager takes from the last one, every worker being stuck, reaches the
# app with that listener's SERVER_PORT (the manager once numbered its
# listeners "0, 1, 10, 11, 2, ...", and sent this one as the third).
my $part_many = sub {
    SKIP: {
        skip 'the manager takes clients only when it runs', 2 unless NarwhalTest::managed();
        my $app = write_app(<<'APP');
sub {
    my $env = shift;
    select(undef, undef, undef, 1.5) if $env->{PATH_INFO} eq '/hold';
    [200, ['Content-Type' => 'text/plain'], ["port $env->{SERVER_PORT}\n"]];
}
APP
        my ($sport, @ports) = map { free_port() } 1 .. 6;
        my $s = spawn_server(app => $app, args => [ '--max-workers', 1, '--listen-queues', 2,
                                                    '--status-listen', "127.0.0.1:$sport",
                                                    map { ('--listen', "127.0.0.1:$_") } @ports ]);
        my $last = $ports[-1];
        my $hold = raw_connect($s->port);
        syswrite($hold, "GET /hold HTTP/1.1\r\nHost: x\r\n\r\n");
        # (the worker is on /hold: the manager takes the next client; a
        # fixed wait let the worker take it, on a busy machine, after /hold)
        wait_until(sub { (NarwhalTest::metrics_of($sport)->{narwhal_manager_accepting} // 0) == 1 }, 5);
        my $c = raw_connect($last);
        syswrite($c, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        my $r = read_response($c, 10);
        is($r && $r->{body}, "port $last\n", 'the twelfth listener\'s client gets its SERVER_PORT');
        cmp_ok(NarwhalTest::metrics_of($sport)->{narwhal_manager_accepted_total} // 0, '>=', 1,
               '... taken by the manager');
        $s->stop;
    }
};
# 9. Two servers opening one port in the same instant (each with two
# queues, neither with --reuse-port): the second is refused, rather than
# joining the first's group. The first used to bind the port alone, close
# it, then bind its group with SO_REUSEPORT: a second server that did the
# same in between found the port free, and both shared it. (In this
# process: the second starts while the first opens its second socket.)
my $part_same_instant = sub {
    require Narwhal::Listener;
    require IO::Socket::IP;
    my $spec = Narwhal::Listener::parse_spec('127.0.0.1:' . free_port());
    my $opts = { backlog => 16 };
    my ($calls, $second, $refused) = (0);
    my $new = \&IO::Socket::IP::new;
    no warnings 'redefine';
    local *IO::Socket::IP::new = sub {
        if (++$calls == 2) {
            $second = eval { [ Narwhal::Listener::open_address({ %$spec }, $opts, 2) ] };
            $refused = $@;
        }
        goto &$new;
    };
    my @first = eval { Narwhal::Listener::open_address({ %$spec }, $opts, 2) };
    is(scalar @first, 2, 'the first server opens its two sockets');
    ok(!$second, 'a second server starting in the same instant does not join them');
    like($refused // '', qr/^cannot listen on 127\.0\.0\.1:$spec->{port}/, '... it is refused');
    my $port0 = eval { [ Narwhal::Listener::open_address(Narwhal::Listener::parse_spec('127.0.0.1:0'),
                                                         $opts, 3) ] } || [];
    is(scalar(grep { $_->{port} && $_->{port} == $port0->[0]{port} } @$port0), 3,
       'port 0: three sockets on the port the kernel picked');
};

# 11. A server started while the last one on its path is stopping: the
# old one's listener refuses, so the new one takes the path over; the old
# master, exiting once its last request is answered, removed the path it
# had made, which was by then the new server's file, and the new server
# went on serving on a path no client could reach. A master removes its
# socket file only while it is the file it bound.
my $part_overlap = sub {
    my $path = "$DIR/overlap.sock";
    my $slow = write_app("sub { sleep 2 if \$_[0]{PATH_INFO} eq '/slow'; [200, [], [\"ok \$\$\\n\"]] }");
    my $old = spawn_server(app => $slow, no_listen => 1, unix => $path, args => [@NM]);
    my $c = raw_connect($path);
    syswrite($c, "GET /slow HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    sleep 0.3;
    kill TERM => $old->pid;
    ok(wait_until(sub { !IO::Socket::UNIX->new(Peer => $path, Type => Socket::SOCK_STREAM()) }, 5),
       'a stopping server refuses new connections on its path');
    my $new = spawn_server(app => $APP, no_listen => 1, unix => $path, args => [@NM]);
    is(read_response($c, 5)->{status}, 200, "the old server answers the request it had");
    $old->stop('none');
    ok(-S $path, 'the old master left the new server\'s socket file in place');
    is((get_unix($path) // {})->{status}, 200, 'and the new server is reached there');
    $new->stop;
    ok(!-e $path, 'the new server removes its own file when it stops');
};

sub have_ss { grep { -x "$_/ss" } split(/:/, $ENV{PATH}), '/usr/sbin', '/sbin' }

in_parallel($part_mode, $part_status_mode, $part_refusals, $part_spellings, $part_reuse_port, $part_nginx, $part_backlog,
            $part_queues, $part_many, $part_same_instant, $part_overlap);
done_testing();
