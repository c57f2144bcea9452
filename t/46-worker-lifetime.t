use strict;
use warnings;
use Test::More;
use Test2::IPC;    # (parts of this file run in processes of their own)
use lib 't/lib';
use Time::HiRes qw(time sleep);
use NarwhalTest qw(spawn_server wait_until tmpdir manager_fallback free_port http_get worker_pids
                   raw_connect read_response run_cmd narwhal_cmd write_app in_parallel);

# --max-worker-lifetime: a worker older than the limit is replaced as one
# at its --max-reqs-per-child is, on a quiet server too; a keep-alive
# client notices nothing; the restarts are counted by reason.

my @NM = manager_fallback();
my $MANAGED = NarwhalTest::managed();

my $APP = write_app(<<'APP');
sub { [200, ['Content-Type' => 'text/plain'], ["pid=$$\n"]] }
APP

# A lifetime of 1 s: the shortest that a worker (forked from a master that
# loaded the app) outlives its start by far on a loaded machine, so that
# each generation serves before it is replaced.
my $sport = free_port();
my $part_lifetime = sub {
    my $t0 = time;
    my $s = spawn_server(app => $APP, args => [ @NM, '--max-workers', 2, '--max-worker-lifetime', 1,
                                                ($MANAGED ? ('--status-listen', "127.0.0.1:$sport") : ()) ]);
    ok(wait_until(sub { worker_pids($s->pid) == 2 }, 5), 'two workers');
    my %first = map { $_ => 1 } worker_pids($s->pid);

    # Quiet: nothing is sent, the workers are replaced all the same.
    ok(wait_until(sub { !grep { $first{$_} } worker_pids($s->pid) }, 8), 'on a quiet server both first workers leave');
    my $gone = time - $t0;
    cmp_ok($gone, '>=', 1, sprintf('... not before their lifetime (%.1f s)', $gone));
    cmp_ok($gone, '<', 5.5, '... and soon after it (1 s + 10% each, one at a time)');
    ok(wait_until(sub { worker_pids($s->pid) == 2 }, 5), 'two workers again');
    like($s->log_text, qr/worker \d+ is \d+ s old, over --max-worker-lifetime 1; replacing it/, 'the log says why');

    # Busy: a keep-alive client across two more generations gets every answer
    # (for 5 s; with the manager, until its count says that the second
    # generation was replaced too, and a little longer).
    sub lifetime_restarts {
        my $m = http_get("http://127.0.0.1:$sport", '/metrics');
        return $m->{content} =~ /^narwhal_worker_restarts_total\{reason="lifetime"\} (\d+)$/m ? $1 : 0;
    }
    my $c = raw_connect($s->port);
    my (%served_by, $failed, $next_look, $done_at);
    my $until = time + 5;
    while (time < $until && !($done_at && time > $done_at)) {
        if ($MANAGED && !$done_at && time >= ($next_look // 0)) {
            $next_look = time + 0.2;
            $done_at = time + 0.3 if lifetime_restarts() >= 4;
        }
        syswrite($c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
        my $r = read_response($c, 5);
        if (!$r || $r->{status} != 200) {
            $failed++;
            $c = raw_connect($s->port);     # (a client would reconnect; counted as a failure here)
            next;
        }
        $served_by{$1}++ if $r->{body} =~ /pid=(\d+)/;
        if ($r->{headers}{connection} && $r->{headers}{connection} =~ /close/i) {
            $c = raw_connect($s->port);
        }
        sleep 0.02;
    }
    ok(!$failed, 'a keep-alive client lost no request') or diag "$failed failed";
    cmp_ok(scalar keys %served_by, '>=', 2, 'it was served by ' . scalar(keys %served_by) . ' workers in turn');

    if ($MANAGED) {
        my $m = http_get("http://127.0.0.1:$sport", '/metrics');
        my ($n) = $m->{content} =~ /^narwhal_worker_restarts_total\{reason="lifetime"\} (\d+)$/m;
        cmp_ok($n // 0, '>=', 4, "counted as reason=\"lifetime\" ($n)");
        my ($crash) = $m->{content} =~ /^narwhal_worker_restarts_total\{reason="crash"\} (\d+)$/m;
        is($crash, 0, '... not as crashes');
    }
    close $c;    # (a stopping worker lingers 0.5 s for a parked client that stays)
    $s->stop;
};

# Bad values: one line naming the flag, a non-zero exit.
my $part_bad = sub {
    for my $bad ('-1', 'soon', '') {
        my $r = run_cmd([ narwhal_cmd(), '--max-worker-lifetime', $bad, '--listen', '127.0.0.1:1', $APP ], timeout => 10);
        isnt($r->{code}, 0, "--max-worker-lifetime '$bad': a non-zero exit");
        my @l = split /\n/, $r->{err};
        is(scalar @l, 1, '... one line');
        like($l[0] // '', qr/--max-worker-lifetime/, '... naming the flag');
    }
};

in_parallel($part_lifetime, $part_bad);    # (the first waits for lifetimes to pass)
done_testing();
