#!/usr/bin/perl
# Replays the fuzzing corpus (fuzz/corpus) through the libFuzzer harness,
# built with gcc (no libFuzzer needed) and ASan/UBSan: any sanitizer report,
# failed invariant (abort) or non-zero exit fails the test.
use strict;
use warnings;
use Test::More;
use File::Temp qw(tempdir);
use File::Spec;
use FindBin;

my $root = File::Spec->rel2abs(File::Spec->catdir($FindBin::Bin, File::Spec->updir));
my $corpus = File::Spec->catdir($root, 'fuzz', 'corpus');

sub find_in_path {
    my ($prog) = @_;
    for my $dir (File::Spec->path) {
        my $f = File::Spec->catfile($dir, $prog);
        return $f if -x $f && !-d $f;
    }
    return;
}

# Runs a command (list form, no shell); returns (exit status, stdout, stderr).
sub run_cmd {
    my ($errfile, @cmd) = @_;
    open(my $saved, '>&', \*STDERR) or die "dup STDERR: $!";
    open(STDERR, '>', $errfile) or die "redirect STDERR: $!";
    my $pid = open(my $fh, '-|', @cmd);
    my $out = '';
    if ($pid) {
        local $/;
        $out = <$fh> // '';
        close $fh;
    }
    my $status = $pid ? $? : -1;
    open(STDERR, '>&', $saved) or die "restore STDERR: $!";
    open(my $efh, '<', $errfile) or die "$errfile: $!";
    my $err = do { local $/; <$efh> } // '';
    close $efh;
    return ($status, $out, $err);
}

my $cc = find_in_path($ENV{NW_FUZZ_CC} // 'gcc') // find_in_path('cc')
    or plan skip_all => 'no C compiler found';

opendir(my $dh, $corpus) or die "$corpus: $!";
my @files = sort map { File::Spec->catfile($corpus, $_) }
            grep { !/^\./ && -f File::Spec->catfile($corpus, $_) } readdir $dh;
closedir $dh;
cmp_ok(scalar @files, '>=', 40, 'corpus has at least 40 files');

my $dir = tempdir(CLEANUP => 1);
my $exe = File::Spec->catfile($dir, 'replay');
my $errfile = File::Spec->catfile($dir, 'stderr');

my @compile = (
    $cc, qw(-std=gnu99 -g -O1 -Wall -Wextra),
    '-fsanitize=address,undefined', '-fno-sanitize-recover=all', '-fno-omit-frame-pointer',
    "-I$root/src",
    "$root/fuzz/replay.c", "$root/fuzz/fuzz_http.c", "$root/src/nw_http.c",
    '-o', $exe,
);
my ($status, $out, $err) = run_cmd($errfile, @compile);
if (!ok($status == 0, "compile the replayer with $cc and sanitizers")) {
    diag("@compile");
    diag($out . $err);
    done_testing();
    exit;
}

local $ENV{ASAN_OPTIONS}  = 'detect_leaks=1:abort_on_error=1';
local $ENV{UBSAN_OPTIONS} = 'halt_on_error=1:print_stacktrace=1';
($status, $out, $err) = run_cmd($errfile, $exe, @files);

is($status, 0, 'replay exited with status 0') or do {
    # Name the culprits: replay the files one by one.
    for my $file (@files) {
        my ($st) = run_cmd($errfile, $exe, $file);
        diag("fails: $file") if $st != 0;
    }
};
like($out, qr/^replayed ${\ scalar @files} files$/m, 'every corpus file replayed');
is($err, '', 'no sanitizer report') or diag($err);

done_testing();
