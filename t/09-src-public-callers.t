#!/usr/bin/perl
# Every function a header of src/ declares is called from src/, xs/ or
# Narwhal.xs somewhere other than its own body. The C unit tests (t/c/) do
# not count: a function public only for them is made private to its file
# (or given a real caller), and one nothing calls goes. A use as a value
# (a function pointer in a table) counts as a call; so does a use in a
# macro's body, and an XSUB of the same name.
use strict;
use warnings;
use Test::More;
use File::Find ();
use FindBin ();

chdir "$FindBin::Bin/.." or die "$FindBin::Bin/..: $!";

sub files_under {
    my ($dir, $re) = @_;
    my @files;
    File::Find::find({ no_chdir => 1,
                       wanted => sub { push @files, $File::Find::name if -f && /$re/ } }, $dir)
        if -d $dir;
    return sort @files;
}

# The C of a file as tokens: no comments, string and character literals
# emptied, preprocessor lines dropped except a #define's body, which is
# kept as a block of its own ({ ... }) so that what it calls is seen.
sub tokens {
    my ($text) = @_;
    $text =~ s{(/\*.*?\*/|//[^\n]*)|("(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*')}
              {defined $1 ? ' ' : '""'}gse;
    $text =~ s/\\\n/ /g;
    $text =~ s/^[ \t]*#[ \t]*define[ \t]+\w+(?:\([^)]*\))?(.*)$/{ $1 }/mg;
    $text =~ s/^[ \t]*#.*$//mg;
    return $text =~ /([A-Za-z_]\w*|\S)/g;
}

sub read_file {
    my ($file) = @_;
    open(my $fh, '<', $file) or die "$file: $!";
    local $/;
    return scalar <$fh>;
}

my %keyword = map { $_ => 1 } qw(sizeof __attribute__ if while for switch return typeof
                                 __typeof__ _Static_assert static_assert _Alignof alignof
                                 defined __extension__ asm __asm__ offsetof);

# The tokens of a declaration without its __attribute__((...)) parts.
sub without_attributes {
    my @in = @_;
    my @out;
    while (@in) {
        my $t = shift @in;
        if ($t ne '__attribute__') {
            push @out, $t;
            next;
        }
        my $depth = 0;
        while (@in) {
            my $u = shift @in;
            $depth++ if $u eq '(';
            last if $u eq ')' && --$depth == 0;
        }
    }
    return @out;
}

# The function a declaration or a function's header (tokens at file
# level) names, or undef: a typedef, a variable, a function pointer.
sub function_named {
    my @t = without_attributes(@_);
    return undef if !@t || grep { $_ eq 'typedef' || $_ eq '=' } @t;
    my ($open) = grep { $t[$_] eq '(' } 0 .. $#t;
    return undef if !$open || $t[$#t] ne ')';
    my $name = $t[$open - 1];
    return undef if $name !~ /\A[A-Za-z_]\w*\z/ || $keyword{$name} || ($t[$open + 1] // '') eq '*';
    return $name;
}

# Walk a file's tokens: $declared->(NAME) for each function declared or
# defined at file level, $used->(NAME, FUNCTION) for every other
# identifier, with the function whose body it is in (undef: none).
sub walk {
    my ($tokens, $declared, $used) = @_;
    my ($depth, $in, @chunk) = (0, undef);
    for my $i (0 .. $#$tokens) {
        my $t = $tokens->[$i];
        if ($t eq '{') {
            if ($depth++ == 0) {
                $in = function_named(@chunk);
                $declared->($in) if defined $in;
                @chunk = ();
            }
        } elsif ($t eq '}') {
            $in = undef if --$depth == 0;
        } elsif ($depth == 0 && $t eq ';') {
            my $name = function_named(@chunk);
            $declared->($name) if defined $name;
            @chunk = ();
        } else {
            push @chunk, $t if $depth == 0;
            next if $t !~ /\A[A-Za-z_]/;
            my $declaring = $depth == 0 && ($tokens->[$i + 1] // '') eq '(';
            $used->($t, $in) unless $declaring;
        }
    }
}

# The functions the headers declare (or define: static inline ones).
my %header_of;
for my $h (files_under('src', qr/\.h\z/)) {
    walk([ tokens(read_file($h)) ], sub { $header_of{ $_[0] } //= $h }, sub { });
}
cmp_ok(scalar keys %header_of, '>', 50, 'the headers of src/ declare functions: '
       . scalar(keys %header_of));

# Their uses in src/, xs/ and Narwhal.xs. In an .xs file the XS after
# the first MODULE line is one block: everything in it is a use.
my %callers;
my @files = (files_under('src', qr/\.[ch]\z/), files_under('xs', qr/\.[ch]\z/),
             grep { -f } 'Narwhal.xs');
for my $file (@files) {
    my $text = read_file($file);
    $text =~ s/^(MODULE\s*=.*)\z/{\n$1\n}/ms if $file =~ /\.xs\z/;
    walk([ tokens($text) ], sub { }, sub {
        my ($name, $in) = @_;
        $callers{$name}{$file}++ if $header_of{$name} && !(defined $in && $in eq $name);
    });
}

# A part built and unit-tested on its own before the manager calls it:
# its header's functions wait for their callers here; once one has a
# caller, its entry goes (none now).
my %unwired = ();

for my $name (sort keys %header_of) {
    next if $unwired{ $header_of{$name} };
    ok($callers{$name}, "$name ($header_of{$name}) is called")
        or diag "$name: no caller in src/, xs/ or Narwhal.xs";
}
for my $h (sort keys %unwired) {
    my @called = grep { $header_of{$_} eq $h && $callers{$_} } sort keys %header_of;
    is("@called", '', "$h is not wired yet (when it is, drop it from %unwired)");
}
done_testing();
