use strict;
use warnings;
use Test::More;
use File::Basename qw(dirname);
use File::Spec ();
use lib 't/lib';
use NarwhalTest qw(root);

# What the release carries points only at what it carries. The tarball
# holds the files MANIFEST names (dev/, bench/, xt/, fuzz/ and .ci/ are
# left out: MANIFEST.SKIP), and an install copies less: the modules, their
# POD and bin/narwhal.
#  - Every relative link and image in a Markdown file of the tarball
#    (README.md, docs/*.md) names a file in MANIFEST.
#  - Every file the installed POD names (F<...>, L<...> to a path) is in
#    MANIFEST: docs/ and src/ are in the tarball, and the POD says where
#    they are (Narwhal's SEE ALSO).
#  - What the installed code says at run time (a log line, an error)
#    names no file at all outside what is installed: its reader has the
#    installed program and perldoc, not the tarball.
# Runs the same in a checkout and in the unpacked tarball.

my $root = root();
open(my $mf, '<', "$root/MANIFEST") or die "MANIFEST: $!";
my %shipped = map { /^(\S+)/ ? ($1 => 1) : () } <$mf>;
my %dirs;
for my $f (keys %shipped) {
    (my $d = $f) =~ s{/[^/]*$}{} or next;
    while ($d ne '') { $dirs{$d} = 1; $d =~ s{/?[^/]*$}{} }
}

sub slurp {
    my ($path) = @_;
    open(my $fh, '<:encoding(UTF-8)', "$root/$path") or die "$path: $!";
    local $/;
    return scalar <$fh>;
}

# A relative path, from the top of the distribution, in the tarball?
sub shipped {
    my ($path) = @_;
    $path = File::Spec->canonpath($path);
    1 while $path =~ s{(?:^|/)(?!\.\./)[^/]+/\.\.(?:/|$)}{/} && $path =~ s{^/}{};
    $path =~ s{/$}{};
    return $path !~ m{^\.\./} && ($shipped{$path} || $dirs{$path});
}

# 1. Markdown: the text outside fenced blocks and code spans.
for my $doc (sort grep { /\.md$/ } keys %shipped) {
    (my $text = slurp($doc)) =~ s/^(```|~~~).*?^\1[^\n]*$//msg;
    $text =~ s/`[^`\n]*`//g;
    my @links = ($text =~ /!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)/g,
                 $text =~ /<(?:img|a)\b[^>]*?\b(?:src|href)="([^"]+)"/g);
    my @bad;
    for my $link (@links) {
        next if $link =~ /^[a-z][a-z0-9+.-]*:/i || $link =~ /^#/;
        (my $path = $link) =~ s/#.*//;
        my $dir = dirname($doc);
        push @bad, $link unless shipped($dir eq '.' ? $path : "$dir/$path");
    }
    ok(!@bad, "$doc: its " . @links . ' links lead into the tarball')
        or diag map { "  not in MANIFEST: $_\n" } @bad;
}

# 2. The installed POD, and 3. the installed code's strings.
my @installed = sort grep { m{^lib/.*\.(?:pm|pod)$} || $_ eq 'bin/narwhal' } keys %shipped;
ok(scalar(grep { m{^lib/} } @installed), 'MANIFEST names the modules');
# (a path from the top of the distribution: not /dev/null, not ~/src/x)
my $dist_path = qr{(?<![\w/.~-])((?:docs|dev|bench|xt|fuzz|src|xs|t|eg|inc)/[\w./-]*[\w/])};
for my $file (@installed) {
    my (@pod_bad, @code_bad);
    my ($in_pod, $line_no) = (0, 0);
    my $for_comment = 0;
    for my $line (split /\n/, slurp($file)) {
        $line_no++;
        if ($line =~ /^=(\w+)/) {
            $in_pod = $1 ne 'cut';
            $for_comment = $line =~ /^=for\s+comment\b/;    # (not shown to a reader)
            next if $for_comment;
        }
        $for_comment = 0 if $line =~ /^\s*$/;
        if ($in_pod) {
            next if $for_comment;
            # a file: F<dir/name>; L<dir/name.ext> (not L<Module/section>)
            my @refs = ((grep { m{/} && !m{^[/~]} } $line =~ /F<([^>]+)>/g),
                        (grep { m{^[\w.-]+(?:/[\w.-]+)+\.\w+$} } $line =~ /L<(?:[^|>]*\|)?([^>]+)>/g));
            for my $ref (grep { !/^[a-z][a-z0-9+.-]*:/i } @refs) {
                push @pod_bad, "line $line_no: $ref" unless shipped($ref);
            }
            for my $path ($line =~ /$dist_path/g) {
                push @pod_bad, "line $line_no: $path" unless shipped($path);
            }
        } else {
            (my $code = $line) =~ s/(?:^|\s)#.*$//;
            for my $string ($code =~ /"((?:[^"\\]|\\.)*)"|'((?:[^'\\]|\\.)*)'/g) {
                next unless defined $string;
                next if $string =~ /[A-Z]<[^>]/;        # POD text (the option table's)
                push @code_bad, "line $line_no: $1" if $string =~ $dist_path;
            }
        }
    }
    my %seen;
    @pod_bad = grep { !$seen{$_}++ } @pod_bad;
    ok(!@pod_bad, "$file: the files its POD names are in the tarball")
        or diag map { "  not in MANIFEST: $_\n" } @pod_bad;
    ok(!@code_bad, "$file: what it says at run time names no file an install lacks")
        or diag map { "  names $_\n" } @code_bad;
}

done_testing();
