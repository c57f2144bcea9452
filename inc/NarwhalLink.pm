package NarwhalLink;
use strict;
use warnings;
use File::Spec;

# What a C program made of Narwhal's sources links with, derived from its
# includes: the one build description for the C units (t/lib/NarwhalTest/
# CBuild.pm for the unit tests and the corpus replays), the manager program
# and the XS module (Makefile.PL) and the fuzzing harnesses (fuzz/fuzz.mk).
#
# The rule: a file's `#include "..."` lines name headers (looked for next
# to the file, then from the top directory, then in each of src/'s parts,
# SRC_DIRS); a header src/PART/nw_x.h whose nw_x.c is beside it brings
# that file in, and every file brought in is read the same way. Adding
# src/PART/nw_x.c with its nw_x.h is then the whole build change:
# whatever includes nw_x.h links nw_x.c.
# Headers not in the tree (perl.h, XSUB.h, the system's) are skipped.
#
# A header that brings a library says so in %LIBS below: whatever
# includes it (directly or through the files it brings in) links with
# those flags too, and nothing else does.
#
#   perl inc/NarwhalLink.pm FILE...   print the C files FILE... link with
#                                     (FILE... first, then the closure,
#                                     paths as given / relative to here)
#   perl inc/NarwhalLink.pm --libs FILE...
#                                     print the linker flags they need

# The headers of the tree whose code links a library, with its flags.
our %LIBS = (
    'src/manager/nw_tls.h' => '-lssl -lcrypto',    # the TLS part (OpenSSL)
);

# src/'s parts: what both programs use, the XS module's (the worker and
# the master), the connection manager's. The compilers' -I list.
use constant SRC_DIRS => qw(src/shared src/worker src/manager);
sub include_flags { my ($prefix) = @_; return map { '-I' . ($prefix // '') . $_ } SRC_DIRS }

# link_sources($root, @files): @files (paths relative to $root) followed by
# the .c files of src/ they need, sorted, relative to $root.
sub link_sources {
    my ($root, @files) = @_;
    my ($found) = closure($root, @files);
    return (@files, sort @$found);
}

# link_libs($root, @files): the linker flags (a list) of the headers in
# %LIBS that @files and the files they bring in include.
sub link_libs {
    my ($root, @files) = @_;
    my (undef, $seen) = closure($root, @files);
    my %flag;
    return grep { !$flag{$_}++ } map { split ' ', $LIBS{$_} } grep { $seen->{$_} } sort keys %LIBS;
}

# The .c files of src/ that @files bring in, and every file seen on the
# way (a set: the headers included and the .c files).
sub closure {
    my ($root, @files) = @_;
    my (%seen, @todo, @found);
    $seen{$_} = 1 for @files;
    @todo = @files;
    while (defined(my $file = shift @todo)) {
        for my $header (includes($root, $file)) {
            next if $seen{$header}++;
            push @todo, $header;
            (my $c = $header) =~ s/\.h\z/.c/;
            next if $c eq $header || $seen{$c} || !-f "$root/$c" || $c !~ m{\Asrc/\w+/nw_[^/]+\.c\z};
            $seen{$c} = 1;
            push @todo, $c;
            push @found, $c;
        }
    }
    return (\@found, \%seen);
}

# The headers of the tree that $file includes, relative to $root.
sub includes {
    my ($root, $file) = @_;
    open(my $fh, '<', "$root/$file") or die "NarwhalLink: $root/$file: $!\n";
    my (undef, $dir) = File::Spec->splitpath($file);
    my @out;
    while (my $line = <$fh>) {
        next unless $line =~ /^\s*#\s*include\s+"([^"]+)"/;
        my $name = $1;
        for my $cand ((length $dir ? File::Spec->catfile($dir, $name) : ()), $name, map { "$_/$name" } SRC_DIRS) {
            my $canon = File::Spec->canonpath($cand);
            $canon =~ s{\A\./}{};
            if (-f "$root/$canon") {
                push @out, $canon;
                last;
            }
        }
    }
    close $fh;
    return @out;
}

# The top directory: the one above inc/.
sub root {
    my $here = File::Spec->rel2abs(__FILE__);
    my (undef, $dir) = File::Spec->splitpath($here);
    return File::Spec->canonpath(File::Spec->catdir($dir, File::Spec->updir));
}

sub main {
    my (@args) = @_;
    my $libs = @args && $args[0] eq '--libs' ? shift @args : undef;
    die "usage: perl inc/NarwhalLink.pm [--libs] FILE...\n" unless @args;
    my $root = Cwd::realpath(root());
    my @rel = map { File::Spec->abs2rel(Cwd::realpath($_), $root) } @args;
    if ($libs) {
        print join(' ', link_libs($root, @rel)), "\n";
        return 0;
    }
    my @out = link_sources($root, @rel);
    print join(' ', @args, map { File::Spec->abs2rel("$root/$_") } @out[@args .. $#out]), "\n";
    return 0;
}

unless (caller) {
    require Cwd;
    exit main(@ARGV);
}

1;
