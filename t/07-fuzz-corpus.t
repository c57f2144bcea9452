#!/usr/bin/perl
# Replays each fuzzing corpus through its libFuzzer harness, built without
# libFuzzer (fuzz/replay.c) under ASan/UBSan: any sanitizer report, failed
# invariant (abort) or non-zero exit fails the test.
use strict;
use warnings;
use Test::More;
use File::Spec;
use lib 't/lib';
use NarwhalTest::CBuild qw(root build run_program);

# The corpora are development material: a release tarball leaves them out.
plan skip_all => 'no fuzz corpora here (a release tarball leaves fuzz/ out)' unless -d root() . '/fuzz';

# (name, corpus directory under fuzz/, at least this many files, harness;
# what it links with comes from its includes)
my @HARNESSES = (
    [ 'HTTP parser',    'corpus',       40, 'fuzz/fuzz_http.c' ],
    [ 'frame decoder',  'corpus-frame', 15, 'fuzz/fuzz_frame.c' ],
    [ 'PROXY parser',   'corpus-proxy', 20, 'fuzz/fuzz_proxy.c' ],
    [ 'TLS handshake',  'corpus-tls',   10, 'fuzz/fuzz_tls.c' ],
);

for my $h (@HARNESSES) {
    my ($name, $dir, $min, $harness) = @$h;
    my $corpus = File::Spec->catdir(root(), 'fuzz', $dir);
    opendir(my $dh, $corpus) or die "$corpus: $!";
    my @files = sort map { File::Spec->catfile($corpus, $_) }
                grep { !/^\./ && -f File::Spec->catfile($corpus, $_) } readdir $dh;
    closedir $dh;
    cmp_ok(scalar @files, '>=', $min, "$name: the corpus has at least $min files");
    (my $exe_name = "replay-$dir") =~ tr/-/_/;
    my $exe = build($exe_name, [ 'fuzz/replay.c', $harness ]);
    my ($status, $out, $err) = run_program($exe, @files);
    is($status, 0, "$name: replay exited with status 0") or do {
        for my $file (@files) {    # name the culprits
            my ($st) = run_program($exe, $file);
            diag("fails: $file") if $st != 0;
        }
    };
    like($out, qr/^replayed ${\ scalar @files} files$/m, "$name: every corpus file replayed");
    is($err, '', "$name: no sanitizer report") or diag($err);
}
done_testing();
