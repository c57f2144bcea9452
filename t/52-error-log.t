use strict;
use warnings;
use Test::More;
use lib 't/lib';
use POSIX ();
use Time::Local ();
use Time::HiRes qw(time sleep);
use NarwhalTest qw(spawn_server write_app wait_until tmpdir worker_pids manager_fallback
                   http_get);

# Narwhal's own error-log lines, as an operator greps them: every line the
# master, the manager and the workers write starts with an ISO 8601 time,
# narwhal[PID], the process's role and a level; the app's own warn lines
# stay as the app wrote them.

my @NM = manager_fallback();
my $TMP = tmpdir();

my $APP = write_app(<<'APP');
sub {
    my $env = shift;
    my $p = $env->{PATH_INFO};
    if ($p eq '/warn') { warn "app-warning-line\n"; return [200, [], ["warned\n"]] }
    if ($p eq '/die') { die "app-died-here\nsecond line of it\n" }
    if ($p eq '/crash') { kill SEGV => $$ }
    [200, ['Content-Type' => 'text/plain'], ["pid=$$\n"]];
}
APP

sub slurp { open(my $fh, '<', $_[0]) or return ''; local $/; <$fh> // '' }

# "2026-11-26T13:40:01.123Z narwhal[1234] master info: text"
my $LINE = qr/^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z) narwhal\[(\d+)\] (master|worker|manager) (error|warn|info): (.*)$/;

sub ours {
    my ($text) = @_;
    return map { /$LINE/ ? { time => $1, pid => $2, role => $3, level => $4, text => $5, line => $_ } : () }
           split /\n/, $text;
}

my $log = "$TMP/error.log";
my $t0 = time;
my $s = spawn_server(app => $APP, args => [ @NM, '--max-workers', '2', '--error-log', $log ]);
ok(wait_until(sub { slurp($log) =~ /listening on/ }, 5), 'the start line is in the error log');

is(http_get($s->port, '/warn')->{status}, 200, 'a request that warns');
is(http_get($s->port, '/die')->{status}, 500, 'a request that dies');
my @w = worker_pids($s->pid);
my $crashed = http_get($s->port, '/crash');
ok(wait_until(sub { slurp($log) =~ /was killed by signal 11/ }, 5), 'the crash is logged');
ok(wait_until(sub { slurp($log) =~ /app-died-here/ && slurp($log) =~ /app-warning-line/ }, 5),
   'the app lines are there');
my $t1 = time;
my $text = slurp($log);
my @ours = ours($text);

my ($start) = grep { $_->{text} =~ /listening on/ } @ours;
ok($start, 'the start line has the prefix') or diag $text;
is($start->{role}, 'master', '... says master') if $start;
is($start->{pid}, $s->pid, "... with the master's pid") if $start;
is($start->{level}, 'info', '... at level info') if $start;
if ($start) {
    my ($y, $mo, $d, $h, $mi, $sec) = $start->{time} =~ /^(\d+)-(\d+)-(\d+)T(\d+):(\d+):([\d.]+)Z$/;
    my $at = Time::Local::timegm(0, $mi, $h, $d, $mo - 1, $y) + $sec;
    cmp_ok(abs($at - $t0), '<', 10, 'its time is now, in UTC') or diag "$start->{time} against " . scalar gmtime($t0);
}

my ($died) = grep { $_->{text} =~ /app-died-here/ } @ours;
ok($died, "a request's error is one of Narwhal's lines") or diag $text;
is($died->{role}, 'worker', '... from a worker') if $died;
is($died->{level}, 'error', '... at level error') if $died;
ok((grep { $_ == $died->{pid} } @w), "... with the worker's pid") if $died;
like($died->{text}, qr{^GET /die: app-died-here$}, '... naming the request') if $died;
ok((grep { $_->{text} eq 'second line of it' && $_->{role} eq 'worker' } @ours),
   'the second line of the error has the prefix too');

my ($crash) = grep { $_->{text} =~ /was killed by signal 11/ } @ours;
ok($crash && $crash->{role} eq 'master' && $crash->{level} eq 'error',
   "a worker's crash is the master's error line") or diag $text;
like($crash->{text}, qr{^worker \d+ was killed by signal 11 while serving GET /crash$}, '... what it served')
    if $crash;

like($text, qr/^app-warning-line$/m, "the app's warn line is as the app wrote it");
unlike($text, qr/^narwhal: /m, 'no line of the old unstamped kind');

# every line is either ours (stamped) or the app's: nothing else
my @other = grep { !/$LINE/ && !/^app-warning-line$/ } split /\n/, $text;
is_deeply(\@other, [], 'every other line has the prefix');

$s->stop;
done_testing();
