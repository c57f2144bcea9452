use strict;
use warnings;
use Test::More;
use File::Basename qw(dirname);
use File::Spec ();

# Every relative link and image in the Markdown documents leads to a file
# of the tree, and a link to a heading (file.md#anchor) to a heading that
# is there, as GitHub makes anchors. No network: links with a scheme
# (https:, mailto:) are not followed. Raw benchmark output
# (bench/results/) is not part of the tree, so nothing may link into it.
# And README.md and docs/DESIGN.md stay within their line counts.

my $root = File::Spec->rel2abs(dirname(__FILE__) . '/..');
# A release tarball leaves development material out (MANIFEST.SKIP): a
# link there is checked in a checkout only.
my $tarball = !-d "$root/.git";
my $left_out = qr{^(?:bench|dev|fuzz|xt|\.ci)(?:/|$)};
my @docs = grep { -f "$root/$_" }
           ('README.md', 'bench/README.md', 'fuzz/README.md',
            map { File::Spec->abs2rel($_, $root) } sort glob("$root/docs/*.md"));

sub read_file {
    my ($path) = @_;
    open my $fh, '<:encoding(UTF-8)', $path or die "$path: $!";
    local $/;
    return scalar <$fh>;
}

# The text outside fenced code blocks and code spans.
sub prose {
    my ($text) = @_;
    $text =~ s/^(```|~~~).*?^\1[^\n]*$//msg;
    $text =~ s/`[^`\n]*`//g;
    return $text;
}

# GitHub's anchors: lower case, punctuation dropped, spaces to hyphens,
# a repeated heading numbered from -1.
my %anchors_of;
sub anchors {
    my ($file) = @_;
    return $anchors_of{$file} ||= do {
        my $text = read_file($file);
        $text =~ s/^(```|~~~).*?^\1[^\n]*$//msg;
        my (%seen, %anchor);
        for my $heading ($text =~ /^#{1,6}[ \t]+(.+?)[ \t#]*$/mg) {
            (my $slug = lc $heading) =~ s/[^\w\- ]//g;
            $slug =~ tr/ /-/;
            my $n = $seen{$slug}++;
            $anchor{$n ? "$slug-$n" : $slug} = 1;
        }
        \%anchor;
    };
}

for my $doc (@docs) {
    my $text = prose(read_file("$root/$doc"));
    my @links = $text =~ /!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)/g;
    my @bad;
    for my $link (@links) {
        next if $link =~ /^[a-z][a-z0-9+.-]*:/i;
        my ($path, $anchor) = $link =~ /^([^#]*)(?:#(.*))?$/;
        my $target = length $path
            ? File::Spec->canonpath(File::Spec->catfile($root, dirname($doc), $path))
            : "$root/$doc";
        my $rel = File::Spec->abs2rel($target, $root);
        if ($rel =~ m{^bench/results(?:/|$)}) {
            push @bad, "$link (bench/results/ is raw output, not in the tree)";
        } elsif (!-e $target && $tarball && $rel =~ $left_out) {
            next;
        } elsif (!-e $target) {
            push @bad, "$link (no such file)";
        } elsif (defined $anchor && length $anchor && $target =~ /\.md$/
                 && !anchors($target)->{$anchor}) {
            push @bad, "$link (no such heading in $rel)";
        }
    }
    ok(!@bad, "$doc: " . @links . ' links resolve') or diag join "\n", map { "  $_" } @bad;
}

# What a newcomer reads first stays short: the README says what Narwhal is
# and how to start (the rest is in docs/), DESIGN.md how it works (history
# and measurements are in git and docs/PERFORMANCE.md).
my %max_lines = ('README.md' => 300, 'docs/DESIGN.md' => 1200);
for my $doc (sort keys %max_lines) {
    my $lines = () = read_file("$root/$doc") =~ /\n/g;
    ok($lines <= $max_lines{$doc}, "$doc: $lines lines, at most $max_lines{$doc}");
}

done_testing;
