use strict;
use warnings;
use Test::More;
use lib 't/lib';
use Time::HiRes qw(time sleep);
use Narwhal ();
use NarwhalTest qw(spawn_server wait_until tmpdir manager_fallback free_port http_get worker_pids
                   run_cmd);

# /metrics as Prometheus stores it: worker series labelled by slot (a
# fixed few while the workers are replaced), narwhal_build_info, the
# master's process_* families (checked against /proc), and promtool's
# lint clean.

my @NM = manager_fallback();
plan skip_all => 'the status pages need the connection manager'
    if !NarwhalTest::managed();

my $sport = free_port();
my $t0 = time;
my $s = spawn_server(args => [ '--max-workers', 2, '--max-requests', 4, '--min-worker-lifetime', 0, '--status-listen', "127.0.0.1:$sport" ]);
my $port = $s->port;

sub metrics {
    my $r = http_get("http://127.0.0.1:$sport", '/metrics');
    return $r->{status} == 200 ? $r->{content} : '';
}

# Workers replaced every 4 requests: about ten generations of each
my (%labels, %pids);
for my $i (1 .. 40) {
    my $r = http_get($port, '/');
    $pids{$_}++ for worker_pids($s->pid);
    if ($i % 4 == 0) {
        my $m = metrics();
        $labels{$1}++ while $m =~ /^narwhal_worker_resident_bytes\{(\w+="[^"]*")\}/mg;
    }
}
cmp_ok(scalar keys %pids, '>', 4, 'workers were replaced (' . scalar(keys %pids) . ' pids seen)');
ok(!(grep { /^pid=/ } keys %labels), 'no series is labelled by pid') or diag explain \%labels;
my @slots = map { /^slot="(\d+)"$/ ? $1 : () } keys %labels;
is(scalar @slots, scalar keys %labels, 'every worker series is labelled by slot');
cmp_ok(scalar @slots, '<=', 3, 'at most --max-workers + 1 slots over all the generations: ' . join(',', sort @slots));

my $m = metrics();
like($m, qr/^narwhal_build_info\{version="\Q$Narwhal::VERSION\E",perl="\Q${\ sprintf('%vd', $^V)}\E"\} 1$/m,
     "narwhal_build_info names Narwhal's version and perl's");
my %v = map { /^(process_\w+) (\S+)$/ ? ($1 => $2) : () } split /\n/, $m;
for my $name (qw(process_cpu_seconds_total process_resident_memory_bytes process_virtual_memory_bytes
                 process_start_time_seconds process_open_fds process_max_fds)) {
    ok(defined $v{$name}, "$name is there");
    like($m, qr/^# TYPE $name (?:counter|gauge)$/m, '... with its TYPE');
}
my $master = $s->pid;
cmp_ok(abs(($v{process_start_time_seconds} // 0) - $t0), '<', 5, "the start time is the master's");
my @fds = glob "/proc/$master/fd/*";
cmp_ok(abs(($v{process_open_fds} // -100) - @fds), '<=', 3, "open fds: the master's (/proc says " . @fds . ')');
open(my $statm, '<', "/proc/$master/statm") or die;
my (undef, $rss_pages) = split ' ', <$statm>;
my $rss = $rss_pages * 4096;
cmp_ok(abs(($v{process_resident_memory_bytes} // 0) - $rss) / $rss, '<', 0.2, "resident memory: the master's");
cmp_ok($v{process_cpu_seconds_total} // -1, '>=', 0, 'cpu seconds');

SKIP: {
    my ($promtool) = grep { -x } map { "$_/promtool" } split /:/, $ENV{PATH} // '';
    skip 'promtool is not installed (Debian: apt-get install prometheus)', 2 unless $promtool;
    my $r = run_cmd([ $promtool, 'check', 'metrics' ], stdin => $m, timeout => 20);
    is($r->{code}, 0, 'promtool check metrics: exit 0') or diag $r->{out}, $r->{err};
    is($r->{out} . $r->{err}, '', '... and no complaint');
}
$s->stop;
done_testing();
