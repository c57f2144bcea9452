use strict;
use warnings;
use Test::More;
use lib 't/lib';
use Time::HiRes qw(time sleep);
use NarwhalTest qw(spawn_server write_app wait_until tmpdir worker_pids children_of
                   manager_fallback http_get);

# USR1 after logrotate moved the logs away: every process (the master, the
# connection manager, each worker) writes to the new files from then on,
# none to the rotated one. Twice: as logrotate's "create" does it (the new
# file exists before USR1) and with no new file (the master creates it).

my @NM = manager_fallback();
my $MANAGED = NarwhalTest::managed();
my $TMP = tmpdir();

my $APP = write_app(<<'APP');
sub {
    my $env = shift;
    warn "app-warn $env->{QUERY_STRING}\n" if $env->{PATH_INFO} eq '/warn';
    [200, ['Content-Type' => 'text/plain'], ["pid=$$\n"]];
}
APP

sub slurp { open(my $fh, '<', $_[0]) or return ''; local $/; <$fh> // '' }
sub same_file {    # the open file behind /proc/PID/fd/N is the one at $path
    my ($pid, $fd, $path) = @_;
    my @a = stat("/proc/$pid/fd/$fd") or return 0;
    my @b = stat($path) or return 0;
    return $a[0] == $b[0] && $a[1] == $b[1];
}
sub manager_pid {
    my ($master) = @_;
    my %w = map { $_ => 1 } worker_pids($master);
    my ($m) = grep {
        my $fh;
        !$w{$_} && open($fh, '<', "/proc/$_/cmdline") && (<$fh> // '') =~ /^narwhal manager/;
    } children_of($master);
    return $m;
}

my $err = "$TMP/error.log";
my $acc = "$TMP/access.log";
# The workers' idle wait is 0.2 s here, not 1 s (NARWHAL_TEST_WORKER_WAIT):
# an idle worker writes its buffered access log lines then.
my $s = spawn_server(app => $APP, env => { NARWHAL_TEST_WORKER_WAIT => 0.2 },
                     args => [ @NM, '--max-workers', '2', '--error-log', $err, '--access-log', $acc ]);
my $port = $s->port;
ok(wait_until(sub { worker_pids($s->pid) == 2 }, 5), 'two workers');
my $manager = $MANAGED ? manager_pid($s->pid) : undef;
ok($manager, 'the manager runs') if $MANAGED;

for my $round ([ 'logrotate create', 1 ], [ 'moved only, the master creates', 0 ]) {
    my ($name, $create) = @$round;
    subtest $name => sub {
        # lines before the rotation, from the workers and the app
        is(http_get($port, "/warn?before-$create")->{status}, 200, 'a request before');
        ok(wait_until(sub { slurp($err) =~ /app-warn before-$create/ }, 5), 'its warn is logged');
        rename $err, "$err.1" or die "rename: $!";
        rename $acc, "$acc.1" or die "rename: $!";
        if ($create) {
            open(my $fh, '>', $_) or die "$_: $!" for $err, $acc;
        }
        my @procs = ([ master => $s->pid ], (map { [ "worker $_" => $_ ] } worker_pids($s->pid)),
                     ($manager ? [ manager => $manager ] : ()));
        ok((grep { same_file($_->[1], 2, "$err.1") } @procs) == @procs,
           'before USR1, every process writes to the moved file');
        kill USR1 => $s->pid;
        ok(wait_until(sub { (grep { same_file($_->[1], 2, $err) } @procs) == @procs }, 5),
           'after USR1, stderr of every process is the new error log')
            or diag join ', ', map { "$_->[0]: " . (readlink("/proc/$_->[1]/fd/2") // '?') } @procs;
        for my $p (@procs) {
            ok(same_file($p->[1], 2, $err), "... $p->[0]");
        }
        my $old_err = slurp("$err.1");
        my $old_acc = slurp("$acc.1");
        # workers: serve on every worker (close connections: the kernel
        # spreads them), each warn goes to the new error log
        my (%seen, $sent);
        for my $i (1 .. 40) {
            my $r = http_get($port, "/warn?after-$create-$i");
            $seen{$1}++ if $r->{content} =~ /pid=(\d+)/;
            $sent = $i;
            last if keys %seen >= 2 && $i >= 10;
        }
        ok(wait_until(sub { slurp($err) =~ /app-warn after-$create-1\n/ }, 5), "the app's warn is in the new error log");
        ok(wait_until(sub { slurp($acc) =~ m{GET /warn\?after-$create-1 } }, 5),
           'the access log lines are in the new access log');
        like(slurp($err), qr/^\S+Z narwhal\[\d+\] master info: USR1 from pid \d+ \([^)]*\): reopened the logs/m,
             "the master's line is in the new error log");
        like(slurp($err), qr/^\S+Z narwhal\[$manager\] manager info: reopened the error log/m,
             "the manager's line is in the new error log") if $manager;
        # every worker's access lines after the rotation have gone out (a
        # buffer goes out within the idle wait), all to the new file
        ok(wait_until(sub { my $a = slurp($acc); !grep { $a !~ m{GET /warn\?after-$create-$_ } } 1 .. $sent }, 5),
           "all $sent requests' access lines are in the new access log");
        is(slurp("$err.1"), $old_err, 'nothing more in the moved error log');
        is(slurp("$acc.1"), $old_acc, 'nothing more in the moved access log');
        unlink "$err.1", "$acc.1";
    };
}

# A rotation while workers start (USR1 right after HUP, so that the master
# passes it to workers it has just forked): none dies of it, and they
# write to the new file too.
subtest 'USR1 while workers start' => sub {
    my $moved = '';
    for my $i (1 .. 5) {
        my %old = map { $_ => 1 } worker_pids($s->pid);
        rename $err, "$err.1" or die "rename: $!";
        kill HUP => $s->pid;
        kill USR1 => $s->pid;
        # Each round ends when the master has taken both (its line is in
        # the new file, so it writes no more to the moved one) and the new
        # generation serves in place of the old one, on the new file.
        wait_until(sub {
            my @w = worker_pids($s->pid);
            slurp($err) =~ /master info: USR1 from pid \d+ \([^)]*\): reopened the logs/
                && @w == 2 && !grep { $old{$_} || !same_file($_, 2, $err) } @w;
        }, 10);
        $moved .= slurp("$err.1");
        unlink "$err.1";
    }
    ok(wait_until(sub { my @w = worker_pids($s->pid); @w == 2 && !grep { !same_file($_, 2, $err) } @w }, 10),
       'two workers, each on the new error log');
    # (no wait for a late line: a worker that USR1 killed never reopened
    # its stderr, so it is not one of these two, and the master wrote why
    # it died before it forked the worker in its place, or gave the new
    # generation up, which then would not have replaced the old one)
    my $all = $moved . slurp($err);
    unlike($all, qr/killed by signal 10\b|cannot start/, 'no worker was killed by USR1') or diag $all;
    is(http_get($port, '/')->{status}, 200, 'and the server serves');
};

$s->stop;
done_testing();
