#!/usr/bin/perl
# Builds the connection manager (src/manager/narwhal-manager.c with
# src/nw_manager.c) and its C test (t/c/test_manager.c) under
# AddressSanitizer and UndefinedBehaviorSanitizer, runs the test against the
# manager, and passes each of its TAP results through as a test here.
# The C test plays the master and the workers over real sockets; see it for
# what is covered.
use strict;
use warnings;
use Test::More;
use File::Temp qw(tempdir);
use File::Spec;
use FindBin;
use Config;

plan skip_all => 'the connection manager is Linux only (epoll, signalfd)'
    unless $^O eq 'linux';

my $root = File::Spec->rel2abs(File::Spec->catdir($FindBin::Bin, File::Spec->updir));

sub find_in_path {
    my ($prog) = @_;
    return $prog if File::Spec->file_name_is_absolute($prog) && -x $prog;
    for my $dir (File::Spec->path) {
        my $f = File::Spec->catfile($dir, $prog);
        return $f if -x $f && !-d $f;
    }
    return;
}

sub find_cc {
    for my $cand (grep { defined && length } $ENV{CC}, 'cc', 'gcc', 'clang', $Config{cc}) {
        my ($prog) = split ' ', $cand;
        my $path = find_in_path($prog);
        return $path if $path;
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

my $cc = find_cc() or plan skip_all => 'no C compiler found';

my $dir = tempdir(CLEANUP => 1);
my $errfile = File::Spec->catfile($dir, 'stderr');
my $manager = File::Spec->catfile($dir, 'narwhal-manager');
my $test = File::Spec->catfile($dir, 'test_manager');
my @flags = (
    qw(-std=gnu99 -g -O1 -Wall -Wextra -Werror),
    '-fsanitize=address,undefined', '-fno-sanitize-recover=undefined', '-fno-omit-frame-pointer',
    "-I$root/src", "-I$root/t/c",
);
my %build = (
    $manager => [map { "$root/$_" } qw(src/manager/narwhal-manager.c src/nw_manager.c
                                        src/nw_frame.c src/nw_io.c)],
    $test    => [map { "$root/$_" } qw(t/c/test_manager.c src/nw_frame.c src/nw_io.c)],
);
for my $exe ($manager, $test) {
    my @compile = ($cc, @flags, @{ $build{$exe} }, '-o', $exe);
    my ($status, $out, $err) = run_cmd($errfile, @compile);
    my $name = (File::Spec->splitpath($exe))[2];
    if (!ok($status == 0, "compile $name with $cc and sanitizers")) {
        diag("@compile");
        diag($out . $err);
        done_testing();
        exit;
    }
}

local $ENV{ASAN_OPTIONS}  = 'detect_leaks=1:abort_on_error=1';
local $ENV{UBSAN_OPTIONS} = 'halt_on_error=1:print_stacktrace=1';
my ($status, $out, $err) = run_cmd($errfile, $test, $manager);

my ($ran, $planned) = (0, undef);
for my $line (split /\n/, $out) {
    if ($line =~ /^(not )?ok (\d+)(?: - (.*))?$/) {
        $ran++;
        is($2, $ran, "C test numbered in order") unless $2 == $ran;
        ok(!$1, 'C: ' . ($3 // "test $2"));
    }
    elsif ($line =~ /^1\.\.(\d+)$/) {
        $planned = $1;
    }
    elsif ($line =~ /^#/) {
        note($line);
    }
    else {
        diag("unexpected output: $line");
    }
}
ok(defined $planned && $planned == $ran, 'C tests: ran as many as planned')
    or diag('planned ' . ($planned // 'none') . ", ran $ran");
is($status, 0, 'C test binary exited with status 0');
is($err, '', 'no sanitizer report or other stderr output') or diag($err);

done_testing();
