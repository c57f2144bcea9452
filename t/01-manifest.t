use strict;
use warnings;
use Test::More;
use lib 't/lib';
use NarwhalTest qw(root run_cmd missing_all);

# MANIFEST (what `make dist` puts in the tarball) is the files git tracks
# less MANIFEST.SKIP: a file added to the tree and not to MANIFEST would
# be missing from the release. Only in a checkout; a tarball has no git.

my $root = root();
plan skip_all => 'not a git checkout (a release tarball)' unless -d "$root/.git" && -x "$root/dev/manifest";
missing_all('git is not installed') unless grep { -x "$_/git" } split /:/, $ENV{PATH};
my $r = run_cmd([ $^X, "$root/dev/manifest", '--check' ]);
is($r->{code}, 0, 'MANIFEST is what dev/manifest writes') or diag($r->{out}, $r->{err});
done_testing();
