package NarwhalTest::CBuild;
use strict;
use warnings;
use Exporter 'import';
use Config;
use File::Spec;
use File::Temp qw(tempdir);
use FindBin;
use Test::More;
use NarwhalTest ();

# Building C test programs under AddressSanitizer and UBSan, running them,
# and passing their TAP through as Test::More results.

our @EXPORT_OK = qw(root find_cc build link_sources run_program relay_tap);

use constant SANITIZE => ('-fsanitize=address,undefined', '-fno-sanitize-recover=all',
                          '-fno-omit-frame-pointer');

my $ROOT = File::Spec->rel2abs(File::Spec->catdir($FindBin::Bin, File::Spec->updir));
sub root { $ROOT }

# What a program links with comes from its includes (inc/NarwhalLink.pm).
require File::Spec->catfile($ROOT, 'inc', 'NarwhalLink.pm');
sub link_sources { NarwhalLink::link_sources($ROOT, @_) }

my $DIR;
sub _dir { $DIR ||= tempdir(CLEANUP => 1) }

sub _find_in_path {
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
        my $path = _find_in_path($prog);
        return $path if $path;
    }
    return;
}

# Runs a command (list form, no shell); returns (exit status, stdout, stderr).
sub run_program {
    my (@cmd) = @_;
    my $errfile = File::Spec->catfile(_dir(), 'stderr');
    open(my $saved, '>&', \*STDERR) or die "dup STDERR: $!";
    open(STDERR, '>', $errfile) or die "redirect STDERR: $!";
    local $ENV{ASAN_OPTIONS}  = 'detect_leaks=1:abort_on_error=1';
    local $ENV{UBSAN_OPTIONS} = 'halt_on_error=1:print_stacktrace=1';
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
    return ($status, $out, $err);
}

# Whether the compiler links a program with the sanitizers (a CPAN
# user's machine may lack their runtime libraries).
my %SANITIZERS;
sub sanitizers_work {
    my ($cc) = @_;
    return $SANITIZERS{$cc} //= do {
        my $src = File::Spec->catfile(_dir(), 'probe.c');
        open(my $f, '>', $src) or die "$src: $!";
        print $f "int main(void) { return 0; }\n";
        close $f;
        my $exe = File::Spec->catfile(_dir(), 'probe');
        my ($status) = run_program($cc, SANITIZE, $src, '-o', $exe);
        $status == 0 && (run_program($exe))[0] == 0 ? 1 : 0;
    };
}

# build($name, [files relative to the root], @extra_flags): compile the
# files and the src/*.c they need (link_sources) with sanitizers into a
# temp dir; one test result; returns the program's path, or ends the test
# file when it does not compile.
sub build {
    my ($name, $files, @extra) = @_;
    my @sources = link_sources(@$files);
    my $cc = find_cc() or NarwhalTest::missing_all('no C compiler found');
    sanitizers_work($cc)
        or NarwhalTest::missing_all("$cc cannot build with AddressSanitizer and UBSan "
                                    . '(Debian: libasan and libubsan come with gcc)');
    my $exe = File::Spec->catfile(_dir(), $name);
    my @cmd = ($cc, qw(-std=gnu99 -g -O1 -Wall -Wextra), SANITIZE, @extra,
               "-I$ROOT/src", "-I$ROOT/t/c", (map { "$ROOT/$_" } @sources), '-o', $exe);
    my ($status, $out, $err) = run_program(@cmd);
    return $exe if ok($status == 0, "compile $name with $cc and sanitizers");
    diag("@cmd");
    diag($out . $err);
    done_testing();
    exit;
}

# Pass a C program's TAP through, then check its plan, exit and stderr.
# The comments after a failing test (its got and expected) go out as
# diagnostics, seen in a run that is not verbose; the others as notes.
sub relay_tap {
    my ($status, $out, $err) = @_;
    my ($ran, $planned, $failing) = (0, undef, 0);
    for my $line (split /\n/, $out) {
        if ($line =~ /^(not )?ok (\d+)(?: - (.*))?$/) {
            $ran++;
            is($2, $ran, 'C test numbered in order') unless $2 == $ran;
            $failing = !ok(!$1, 'C: ' . ($3 // "test $2"));
        } elsif ($line =~ /^1\.\.(\d+)$/) {
            $planned = $1;
            $failing = 0;
        } elsif ($line =~ /^#/) {
            $failing ? diag($line) : note($line);
        } else {
            diag("unexpected output: $line");
        }
    }
    ok(defined $planned && $planned == $ran, 'C tests: ran as many as planned')
        or diag('planned ' . ($planned // 'none') . ", ran $ran");
    is($status, 0, 'C test binary exited with status 0');
    is($err, '', 'no sanitizer report or other stderr output') or diag($err);
}

1;
