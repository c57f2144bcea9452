package NarwhalTest::Deploy;
use strict;
use warnings;
use Exporter 'import';
use Test::More;
use NarwhalTest qw(root run_cmd perl_cmd missing_all);

# The deployment scenarios of docs/DEPLOY.md in their quick version
# (xt/deploy/run --quick), as tests. t/70-72 run two scenarios each, so
# that a parallel run (prove -j) overlaps them with the rest of the suite
# instead of ending on one 45 s file. Clients count every request and
# never retry: every scenario must lose none. A scenario whose needs are
# missing (root, nginx, HAProxy, start_server) is skipped by the run, and
# said so here.

our @EXPORT_OK = qw(run_quick);

sub run_quick {
    my (@scenarios) = @_;
    my $root = root();
    plan skip_all => 'xt/ is development material (a release tarball leaves it out)'
        unless -f "$root/xt/deploy/run";
    missing_all('the deployment scenarios need root') if $>;
    my $r = run_cmd([ perl_cmd(), "$root/xt/deploy/run", '--quick', '--only', join(',', @scenarios) ],
                    timeout => 300);
    my @lines = split /\n/, $r->{out} . $r->{err};
    my @rows = grep { /^\S.*\s\d+\s+\d+\s+\d+\s+\d+\s+\d+\s/ } @lines;
    diag($_) for grep { my $l = $_; !/^scenario/ && !grep { $_ eq $l } @rows } @lines;   # skips, errors
    missing_all("no deployment scenario could run here (@scenarios: needs nginx, HAProxy, start_server)")
        unless @rows;
    if ($ENV{NARWHAL_TEST_ALL}) {
        ok(!grep({ /skipped/ } @lines), "every scenario ran (@scenarios; NARWHAL_TEST_ALL)");
    }
    for my $row (@rows) {
        my ($name, $sent, $answered, $failed, $reset, $wrong) =
            $row =~ /^(.+?)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s/ or next;
        ok(!$failed && !$reset && !$wrong, "$name: nothing lost") or diag($row);
    }
    is($r->{code}, 0, "xt/deploy/run --quick --only @scenarios exits 0") or diag($r->{out}, $r->{err});
    done_testing();
}

1;
