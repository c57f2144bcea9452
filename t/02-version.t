use strict;
use warnings;
use Test::More;
use lib 't/lib';
use ExtUtils::MakeMaker ();
use NarwhalTest qw(root);

# One version, said the same everywhere: $VERSION in lib/Narwhal.pm (the
# tarball's name, `narwhal --version`, /status and narwhal_build_info),
# the newest entry of Changes, and the tarball the README installs.
# Changes names each version once, newest first, and only the newest
# may be unreleased.

my $root = root();
my $version = MM->parse_version("$root/lib/Narwhal.pm");
like($version, qr/^\d+\.\d+$/, "lib/Narwhal.pm's \$VERSION ($version)");

open(my $f, '<', "$root/Changes") or die "Changes: $!";
my @heads = map { /^(\S+)\s+(.*?)\s*$/ ? [ $1, $2 ] : () } grep { /^\d/ } <$f>;
ok(@heads, 'Changes has version headings');
is($heads[0][0], $version, "Changes starts with $version");

my %seen;
my @twice = grep { $seen{$_}++ } map { $_->[0] } @heads;
is_deeply(\@twice, [], 'Changes names each version once');

my @order = map { $_->[0] } @heads;
is_deeply(\@order, [ sort { $b <=> $a } @order ], 'newest first');

my @bad_dates = map { "$_->[0] $_->[1]" }
                grep { $_->[1] !~ /^\d{4}-\d\d-\d\d$/ } @heads[1 .. $#heads];
is_deeply(\@bad_dates, [], 'every release but the newest has a date');
like($heads[0][1] // '', qr/^(?:\d{4}-\d\d-\d\d|unreleased)$/, 'the newest: a date or unreleased');

open(my $r, '<', "$root/README.md") or die "README.md: $!";
my @named = do { local $/; <$r> } =~ /\bNarwhal-(\d[\d._]*)\.tar\.gz/g;
ok(@named >= 2, 'the README says how to install a tarball');
is_deeply([ grep { $_ ne $version } @named ], [], "... of this version ($version)");

done_testing();
