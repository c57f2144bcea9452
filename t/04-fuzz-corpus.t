#!/usr/bin/perl
# Replays the fuzzing corpus (fuzz/corpus) through the libFuzzer harness,
# built without libFuzzer (fuzz/replay.c) under ASan/UBSan: any sanitizer
# report, failed invariant (abort) or non-zero exit fails the test.
use strict;
use warnings;
use Test::More;
use File::Spec;
use lib 't/lib';
use NarwhalTest::CBuild qw(root build run_program);

my $corpus = File::Spec->catdir(root(), 'fuzz', 'corpus');
opendir(my $dh, $corpus) or die "$corpus: $!";
my @files = sort map { File::Spec->catfile($corpus, $_) }
            grep { !/^\./ && -f File::Spec->catfile($corpus, $_) } readdir $dh;
closedir $dh;
cmp_ok(scalar @files, '>=', 40, 'corpus has at least 40 files');

my $exe = build('replay', [qw(fuzz/replay.c fuzz/fuzz_http.c src/nw_http.c)]);
my ($status, $out, $err) = run_program($exe, @files);
is($status, 0, 'replay exited with status 0') or do {
    for my $file (@files) {    # name the culprits
        my ($st) = run_program($exe, $file);
        diag("fails: $file") if $st != 0;
    }
};
like($out, qr/^replayed ${\ scalar @files} files$/m, 'every corpus file replayed');
is($err, '', 'no sanitizer report') or diag($err);

# The frame decoder's harness (fuzz/fuzz_frame.c) over its own corpus.
my $fcorpus = File::Spec->catdir(root(), 'fuzz', 'corpus-frame');
opendir($dh, $fcorpus) or die "$fcorpus: $!";
my @ffiles = sort map { File::Spec->catfile($fcorpus, $_) }
             grep { !/^\./ && -f File::Spec->catfile($fcorpus, $_) } readdir $dh;
closedir $dh;
cmp_ok(scalar @ffiles, '>=', 15, 'frame corpus has at least 15 files');
my $fexe = build('replay_frame', [qw(fuzz/replay.c fuzz/fuzz_frame.c src/nw_frame.c)]);
($status, $out, $err) = run_program($fexe, @ffiles);
is($status, 0, 'frame replay exited with status 0') or do {
    for my $file (@ffiles) {
        my ($st) = run_program($fexe, $file);
        diag("fails: $file") if $st != 0;
    }
};
like($out, qr/^replayed ${\ scalar @ffiles} files$/m, 'every frame corpus file replayed');
is($err, '', 'no sanitizer report from the frame decoder') or diag($err);

# The PROXY protocol parser's harness (fuzz/fuzz_proxy.c) over its corpus.
my $pcorpus = File::Spec->catdir(root(), 'fuzz', 'corpus-proxy');
opendir($dh, $pcorpus) or die "$pcorpus: $!";
my @pfiles = sort map { File::Spec->catfile($pcorpus, $_) }
             grep { !/^\./ && -f File::Spec->catfile($pcorpus, $_) } readdir $dh;
closedir $dh;
cmp_ok(scalar @pfiles, '>=', 20, 'PROXY corpus has at least 20 files');
my $pexe = build('replay_proxy', [qw(fuzz/replay.c fuzz/fuzz_proxy.c src/nw_proxy.c)]);
($status, $out, $err) = run_program($pexe, @pfiles);
is($status, 0, 'PROXY replay exited with status 0') or do {
    for my $file (@pfiles) {
        my ($st) = run_program($pexe, $file);
        diag("fails: $file") if $st != 0;
    }
};
like($out, qr/^replayed ${\ scalar @pfiles} files$/m, 'every PROXY corpus file replayed');
is($err, '', 'no sanitizer report from the PROXY parser') or diag($err);
done_testing();
