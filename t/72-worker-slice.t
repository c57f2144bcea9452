use strict;
use warnings;
use Test::More;
use lib 't/lib';
use POSIX ();
use NarwhalTest qw(spawn_servers worker_pids run_cmd narwhal_cmd write_app wait_until);

# --worker-slice (DESIGN.md, "Worker time slices"): each worker asks the
# kernel for that time slice (Linux 6.12's custom slices), which
# /proc/PID/sched shows as se.slice; the master and the manager keep the
# kernel's default.

sub slice_of {
    my ($pid) = @_;
    open(my $fh, '<', "/proc/$pid/sched") or return;
    while (my $line = <$fh>) { return $1 if $line =~ /^se\.slice\s*:\s*(\d+)/ }
    return;
}

my ($release) = (POSIX::uname())[2] =~ /^(\d+\.\d+)/;
plan skip_all => "Linux $release has no custom time slices (6.12 and later)"
    if !defined slice_of($$) || !$release || $release < 6.12;

# a bound the table refuses, in one line (with an app of the test's own:
# the release tarball carries no bench/)
my $app = write_app("sub { [200, ['Content-Type' => 'text/plain'], [\"ok\\n\"]] }");
my $r = run_cmd([ narwhal_cmd(), '--worker-slice', '0.5', $app ], timeout => 10);
isnt($r->{code}, 0, '--worker-slice 0.5: refused');
like($r->{err}, qr/\A[^\n]*--worker-slice must be at most 0\.1[^\n]*\n\z/, '... in one line') or diag $r->{err};

my $kernel_default = slice_of($$);
my ($default, $two_ms, $off) = spawn_servers(
    {}, { args => [ '--worker-slice', '0.002' ] }, { args => [ '--worker-slice', '0' ] });
for my $case ([ $default, 300_000, 'the default, 0.3 ms' ], [ $two_ms, 2_000_000, '0.002' ],
              [ $off, $kernel_default, "0: the kernel's default" ]) {
    my ($s, $want, $name) = @$case;
    # (a worker asks as it sets up, after its fork: under load, a moment
    # after the server answers)
    my @w;
    wait_until(sub { @w = worker_pids($s->pid); @w == 4 && !grep { (slice_of($_) // -1) != $want } @w }, 10);
    is(scalar @w, 4, "--worker-slice $name: four workers");
    is_deeply([ map { slice_of($_) } @w ], [ ($want) x @w ], "... each asked for $want ns");
    is(slice_of($s->pid), $kernel_default, '... the master keeps the default');
    $s->stop;
}

done_testing;
