use strict;
use warnings;
use Test::More;
use lib 't/lib';
use NarwhalTest qw(root run_cmd missing);

# MANIFEST (what `make dist` puts in the tarball) is the files git tracks
# less MANIFEST.SKIP: a file added to the tree and not to MANIFEST would
# be missing from the release. Only in a checkout; a tarball has no git.

my $root = root();

# Each file once, and each there (in a tarball too: what MANIFEST names
# and the tarball lacks, make dist left out).
{
    open(my $f, '<', "$root/MANIFEST") or die "MANIFEST: $!";
    my @files = map { /^(\S+)/ ? $1 : () } <$f>;
    my %n;
    is_deeply([ grep { $n{$_}++ == 1 } @files ], [], 'MANIFEST names each file once');
    is_deeply([ grep { !-f "$root/$_" } @files ], [], '... and each is there');
}

SKIP: {
    skip 'not a git checkout (a release tarball)', 1 unless -d "$root/.git" && -x "$root/dev/manifest";
    missing('git is not installed', 1) unless grep { -x "$_/git" } split /:/, $ENV{PATH};
    my $r = run_cmd([ $^X, "$root/dev/manifest", '--check' ]);
    is($r->{code}, 0, 'MANIFEST is what dev/manifest writes') or diag($r->{out}, $r->{err});
}
done_testing();
