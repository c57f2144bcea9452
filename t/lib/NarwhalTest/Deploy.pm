package NarwhalTest::Deploy;
use strict;
use warnings;
use Exporter 'import';
use Test::More;
use JSON::PP ();
use POSIX ();
use NarwhalTest qw(root run_cmd perl_cmd missing_all);

# The deployment scenarios of docs/DEPLOY.md in their quick version
# (xt/deploy/run --quick), as tests. t/80-82 run two scenarios each, each
# scenario in a run of its own and the two at once (they share nothing
# but the CPUs, and their clients are paced), so that a parallel run
# (prove -j) does not end on one long file. Clients count every request and
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
    my @runs = map { my $only = $_; in_background_cmd([ perl_cmd(), "$root/xt/deploy/run", '--quick', '--only', $only ]) }
               @scenarios;
    my @results = map { $_->() } @runs;
    my @lines = map { split /\n/, $_->{out} . $_->{err} } @results;
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
    for my $i (0 .. $#scenarios) {
        my $r = $results[$i];
        is($r->{code}, 0, "xt/deploy/run --quick --only $scenarios[$i] exits 0") or diag($r->{out}, $r->{err});
    }
    done_testing();
}

# run_cmd in a process of its own: returns a sub that waits for it and
# returns what run_cmd did.
sub in_background_cmd {
    my ($cmd) = @_;
    my $file = NarwhalTest::tmpdir() . "/deploy-run-$$-" . (0 + $cmd) . '.json';
    my $pid = fork // die "fork: $!";
    if (!$pid) {
        my $r = run_cmd($cmd, timeout => 300);
        open(my $f, '>', $file) or POSIX::_exit(1);
        print $f JSON::PP->new->encode($r);
        close $f;
        POSIX::_exit(0);
    }
    return sub {
        waitpid($pid, 0);
        open(my $f, '<', $file) or return { out => '', err => "no result from @$cmd\n", code => -1 };
        local $/;
        return JSON::PP->new->decode(<$f>);
    };
}

1;
