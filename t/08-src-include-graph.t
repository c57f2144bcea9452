#!/usr/bin/perl
# The modules of src/ include one another without a cycle. A module is
# foo.c with its foo.h; a header with no .c of its own (nw_x_internal.h)
# belongs to the module whose .c defines what it declares, or is a module
# of its own when no .c does (nw_limits.h: macros and inline code). An
# edge A -> B is a file of A that includes a header of B; a cycle names
# each edge's #include line. Every file under src/ is read, at any depth.
use strict;
use warnings;
use Test::More;
use File::Find ();
use File::Spec ();
use FindBin ();

chdir "$FindBin::Bin/.." or die "$FindBin::Bin/..: $!";

my @files;
File::Find::find({ no_chdir => 1,
                   wanted => sub { push @files, $File::Find::name if -f && /\.[ch]\z/ } }, 'src');
@files = sort map { File::Spec->abs2rel($_) } @files;
my %is_file = map { $_ => 1 } @files;
my %by_base;
for my $f (@files) {
    (my $base = $f) =~ s{.*/}{};
    push @{ $by_base{$base} }, $f;
}

sub code_of {    # without comments
    my ($file) = @_;
    open(my $fh, '<', $file) or die "$file: $!";
    my $text = do { local $/; <$fh> };
    $text =~ s{/\*.*?\*/}{"\n" x ($& =~ tr/\n//)}gse;    # (lines kept: they are named)
    $text =~ s{//[^\n]*}{}g;
    return $text;
}
my %code = map { $_ => code_of($_) } @files;

# A header named in an #include "..." of $file: next to it, from the top,
# from src/, or else the only file of that name under src/.
sub resolve {
    my ($file, $name) = @_;
    my (undef, $dir) = File::Spec->splitpath($file);
    for my $cand ((length $dir ? File::Spec->catfile($dir, $name) : ()), $name, "src/$name") {
        my $canon = File::Spec->canonpath($cand);
        return $canon if $is_file{$canon};
    }
    (my $base = $name) =~ s{.*/}{};
    my $same = $by_base{$base} || [];
    return @$same == 1 ? $same->[0] : undef;
}

# Functions a file declares (prototypes) and defines (bodies) at file level.
sub declared {
    my ($text) = @_;
    return $text =~ /^[A-Za-z_][^;{}()#]*?\b([A-Za-z_]\w*)\s*\([^;{}]*\)\s*;/mg;
}
my %defined_in;
for my $c (grep { /\.c\z/ } @files) {
    $defined_in{$1} //= $c while $code{$c} =~ /^[A-Za-z_][^;{}()#=]*?\b([A-Za-z_]\w*)\s*\([^;{}]*\)\s*\{/mg;
}

# The module of each file.
my %module_of;
for my $f (@files) {
    (my $m = $f) =~ s/\.[ch]\z//;
    $module_of{$f} = $m;
    next if $f !~ /\.h\z/ || $is_file{"$m.c"};
    my %votes;
    $votes{ $defined_in{$_} =~ s/\.c\z//r }++ for grep { $defined_in{$_} } declared($code{$f});
    my ($owner) = sort { $votes{$b} <=> $votes{$a} || $a cmp $b } keys %votes;
    $module_of{$f} = $owner if defined $owner;
}

# The edges, each with the #include lines that make it.
my %edge;
for my $f (@files) {
    my $line = 0;
    for (split /\n/, $code{$f}, -1) {
        $line++;
        next unless /^\s*#\s*include\s+"([^"]+)"/;
        my $h = resolve($f, $1) // next;
        my ($from, $to) = ($module_of{$f}, $module_of{$h});
        push @{ $edge{$from}{$to} }, "$f:$line includes $1" if $from ne $to;
    }
}
my @modules = sort keys %{ { map { $_ => 1 } values %module_of } };
my $nedges = 0;
$nedges += keys %{ $edge{$_} } for keys %edge;
cmp_ok(scalar @modules, '>', 10, 'src/ has modules: ' . scalar @modules);
cmp_ok($nedges, '>', 10, "... that include one another: $nedges edges");

# Strongly connected components (Tarjan); one of more than one module
# holds a cycle.
my ($index, %idx, %low, %on, @stack, @components) = (0);
sub connect_from {
    my ($v) = @_;
    $idx{$v} = $low{$v} = $index++;
    push @stack, $v;
    $on{$v} = 1;
    for my $w (sort keys %{ $edge{$v} || {} }) {
        if (!defined $idx{$w}) {
            connect_from($w);
            $low{$v} = $low{$w} if $low{$w} < $low{$v};
        } elsif ($on{$w}) {
            $low{$v} = $idx{$w} if $idx{$w} < $low{$v};
        }
    }
    return if $low{$v} != $idx{$v};
    my @c;
    while (1) {
        my $w = pop @stack;
        $on{$w} = 0;
        push @c, $w;
        last if $w eq $v;
    }
    push @components, [ sort @c ] if @c > 1;
}
defined $idx{$_} or connect_from($_) for @modules;

# A shortest cycle from $start back to it, inside its component $c.
sub cycle_through {
    my ($start, $c) = @_;
    my %in = map { $_ => 1 } @$c;
    my %prev;
    my @queue = ($start);
    while (defined(my $v = shift @queue)) {
        for my $w (sort keys %{ $edge{$v} || {} }) {
            next unless $in{$w};
            if ($w eq $start) {
                my @path = ($v);
                unshift @path, $prev{ $path[0] } while $path[0] ne $start;
                return (@path, $start);
            }
            next if exists $prev{$w};
            $prev{$w} = $v;
            push @queue, $w;
        }
    }
    return ();
}

# A cycle through each module of each component (one cycle may pass
# through several).
my @said;
for my $c (@components) {
    my %named;
    for my $m (@$c) {
        next if $named{$m};
        my @cycle = cycle_through($m, $c);
        $named{$_} = 1 for @cycle;
        my @why = map { @{ $edge{ $cycle[$_] }{ $cycle[$_ + 1] } } } 0 .. $#cycle - 1;
        push @said, join("\n    ", 'include cycle: ' . join(' -> ', @cycle), @why);
    }
}
ok(!@components, 'no include cycle between the modules of src/')
    or diag join("\n", @said);
done_testing();
