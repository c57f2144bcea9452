use strict;
use warnings;
use Test::More;
use lib 't/lib';
use NarwhalTest qw(root run_cmd missing);

# MANIFEST (what `make dist` puts in the tarball) is the files git tracks
# less MANIFEST.SKIP: a file added to the tree and not to MANIFEST would
# be missing from the release. Only in a checkout; a tarball has no git.

my $root = root();

# The README's install lines name the tarball of this version.
{
    require "$root/lib/Narwhal.pm" unless defined $Narwhal::VERSION;
    open(my $f, '<', "$root/README.md") or die "README.md: $!";
    my @named = do { local $/; <$f> } =~ /\bNarwhal-(\d[\d._]*)\.tar\.gz/g;
    ok(@named >= 2, 'the README says how to install a tarball');
    is_deeply([ grep { $_ ne $Narwhal::VERSION } @named ], [], "... of this version ($Narwhal::VERSION)");
}

SKIP: {
    skip 'not a git checkout (a release tarball)', 1 unless -d "$root/.git" && -x "$root/dev/manifest";
    missing('git is not installed', 1) unless grep { -x "$_/git" } split /:/, $ENV{PATH};
    my $r = run_cmd([ $^X, "$root/dev/manifest", '--check' ]);
    is($r->{code}, 0, 'MANIFEST is what dev/manifest writes') or diag($r->{out}, $r->{err});
}
done_testing();
