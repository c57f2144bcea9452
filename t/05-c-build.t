#!/usr/bin/perl
# One build description for the C: what a C unit test, the manager program,
# the XS module and a fuzzing harness link with comes from their includes
# (inc/NarwhalLink.pm), so no test, Makefile.PL or fuzz/fuzz.mk names a
# file of src/ to link. And every src/*/nw_*.c is compiled into a C unit test
# (run under the sanitizers by t/06-c-units.t and t/10-14).
use strict;
use warnings;
use Test::More;
use lib 't/lib';
use NarwhalTest::CBuild qw(root link_sources link_libs);

my $root = root();
chdir $root or die "$root: $!";

sub code_of {    # a file without its comments (# and /* */ both)
    my ($file) = @_;
    open(my $fh, '<', $file) or die "$file: $!";
    my $text = do { local $/; <$fh> };
    $text =~ s{/\*.*?\*/}{}gs if $file =~ /\.(?:c|h)\z/;
    $text =~ s/^\s*#(?!\s*include).*$//mg;
    $text =~ s/\s#\s.*$//mg;
    return $text;
}

my @tests = sort glob('t/*.t');
my %code = map { $_ => code_of($_) } @tests;

# The programs the unit tests build: each C test in t/c/ and the manager.
my @programs = (sort(glob('t/c/test_*.c')), 'src/manager/narwhal-manager.c');
my %compiled_by;
for my $prog (@programs) {
    (my $name = $prog) =~ s{.*/}{};
    $name =~ s/\.c\z//;
    my @by = grep { $code{$_} =~ /\bbuild\(/ && $code{$_} =~ /(?<![\w-])\Q$name\E(?![\w-])/ } @tests;
    ok(@by, "$prog is built by a test (@by)");
    push @{ $compiled_by{$_} }, $name for link_sources($prog);
}

# Every file of src/ is compiled into one of them.
for my $c (sort glob('src/*/nw_*.c')) {
    ok($compiled_by{$c}, "$c is compiled into a C unit test ("
                          . join(', ', @{ $compiled_by{$c} || [] }) . ')');
}

# No one else lists what to link: a new src/PART/nw_x.c is then the one edit.
for my $file (@tests, 'Makefile.PL', (-d 'fuzz' ? 'fuzz/fuzz.mk' : ())) {
    my @named = code_of($file) =~ m{\b(nw_\w+\.c)\b}g;
    is("@named", '', "$file names no src/*.c to link");
}

# The XS module links what Narwhal.xs and xs/ include: the worker's C and
# all it needs; what it leaves out is the manager program's alone, but for
# a part built and unit-tested before the manager links it (its C file
# here, until it is linked; none now).
my %unwired = ();
my %in_xs = map { $_ => 1 } link_sources('Narwhal.xs', sort glob('xs/*.c'));
my @left = grep { !$in_xs{$_} } sort glob('src/*/nw_*.c');
my $in_manager = sub { grep { $_ eq 'narwhal-manager' } @{ $compiled_by{ $_[0] } || [] } };
cmp_ok(scalar(grep { m{\Asrc/} } keys %in_xs), '>', @left, 'the XS module links most of src/');
is(join(' ', grep { !$unwired{$_} && !$in_manager->($_) } @left), '',
   "what it leaves out (@left) is the manager program's");
ok(!$in_manager->($_), "$_ is not linked by the manager yet (when it is, drop it from %unwired)")
    for sort keys %unwired;

# A header that brings a library (inc/NarwhalLink.pm's %LIBS) brings it to
# what includes it alone: not to the XS module (the workers never link
# OpenSSL).
is(join(' ', link_libs('Narwhal.xs', sort glob('xs/*.c'))), '',
   'the XS module links no library a header brings');
is(join(' ', link_libs('t/c/test_tls.c')), '-lssl -lcrypto', 'test_tls links OpenSSL');
is(join(' ', link_libs('t/c/test_http.c')), '', 'test_http does not');

# src/'s parts say who links a file: src/shared/ both programs,
# src/worker/ the XS module alone (the worker and the master), src/manager/
# the manager program alone.
my %in_manager = map { $_ => 1 } link_sources('src/manager/narwhal-manager.c');
for my $c (sort glob('src/*/nw_*.c')) {
    my $part = $in_xs{$c} && $in_manager{$c} ? 'shared' : $in_xs{$c} ? 'worker' : 'manager';
    like($c, qr{\Asrc/$part/}, "$c is in src/$part/");
}
done_testing();
