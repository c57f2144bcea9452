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

our @EXPORT_OK = qw(root find_cc build build_threaded link_sources link_libs run_program run_programs relay_tap);

use constant SANITIZE => ('-fsanitize=address,undefined', '-fno-sanitize-recover=all',
                          '-fno-omit-frame-pointer');

# Every C test program is compiled with the same flags, so that each
# src/*/nw_*.c is compiled once for the whole suite (the object cache below);
# the threads some of them use (-pthread) cost the others nothing. -g1:
# line tables and function names, what a sanitizer's report shows; not
# the variables' descriptions of -g, which only a debugger reads and
# which took a quarter of the compile time.
use constant BASE_CFLAGS => qw(-std=gnu99 -g1 -O1 -Wall -Wextra -Werror -pthread);

# ThreadSanitizer instead (it cannot join AddressSanitizer): for the
# parts that run threads of their own (build_threaded).
use constant TSAN => ('-fsanitize=thread', '-fno-omit-frame-pointer');

# The sanitizers of the build under way (build_threaded sets TSAN).
our @SANITIZERS = (SANITIZE);

my $ROOT = File::Spec->rel2abs(File::Spec->catdir($FindBin::Bin, File::Spec->updir));
sub root { $ROOT }

# What a program links with comes from its includes (inc/NarwhalLink.pm):
# the C files and the libraries (a header in its %LIBS brings its flags).
require File::Spec->catfile($ROOT, 'inc', 'NarwhalLink.pm');
sub link_sources { NarwhalLink::link_sources($ROOT, @_) }
sub link_libs { NarwhalLink::link_libs($ROOT, @_) }

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

# run_programs([@cmd], ...): the commands at the same time; for each, in
# the same order, [exit status, stdout, stderr] as run_program gives them.
sub run_programs {
    my @cmds = @_;
    require POSIX;
    my (%job_of, @res);
    for my $i (0 .. $#cmds) {
        my ($out, $err) = map { File::Spec->catfile(_dir(), "run-$i.$_") } qw(out err);
        my $pid = fork // die "fork: $!";
        if (!$pid) {
            $ENV{ASAN_OPTIONS}  = 'detect_leaks=1:abort_on_error=1';
            $ENV{UBSAN_OPTIONS} = 'halt_on_error=1:print_stacktrace=1';
            open(STDIN, '<', '/dev/null');
            open(STDOUT, '>', $out) or POSIX::_exit(126);
            open(STDERR, '>', $err) or POSIX::_exit(126);
            exec(@{ $cmds[$i] }) or POSIX::_exit(127);
        }
        $job_of{$pid} = [ $i, $out, $err ];
    }
    while (%job_of) {
        my $pid = waitpid(-1, 0);
        last if $pid < 0;
        my $job = delete $job_of{$pid} or next;
        my ($i, $out, $err) = @$job;
        $res[$i] = [ $?, _slurp($out), _slurp($err) ];
        unlink $out, $err;
    }
    return @res;
}

# Whether the compiler links a program with the sanitizers (a CPAN
# user's machine may lack their runtime libraries).
my %SANITIZERS_WORK;
sub sanitizers_work {
    my ($cc) = @_;
    return $SANITIZERS_WORK{"$cc @SANITIZERS"} //= do {
        my $src = File::Spec->catfile(_dir(), 'probe.c');
        open(my $f, '>', $src) or die "$src: $!";
        print $f "int main(void) { return 0; }\n";
        close $f;
        my $exe = File::Spec->catfile(_dir(), 'probe');
        my ($status) = run_program($cc, @SANITIZERS, $src, '-o', $exe);
        $status == 0 && (run_program($exe))[0] == 0 ? 1 : 0;
    };
}

# build($name, [files relative to the root], @extra_flags): compile the
# files and the src/*/nw_*.c they need (link_sources) with sanitizers, linked
# with the libraries their headers bring (link_libs), into a
# temp dir; one test result; returns the program's path, or ends the test
# file when it does not compile.
#
# Each file is compiled on its own, two at a time, into an object cache
# (blib/ctest-objs: the suite's C tests share src/*/nw_*.c and compile each once
# for the whole run, whichever test file comes first; a lock makes the
# others wait for it). An object is named by a digest of the compiler, the
# flags, the file and every header of the tree: any change compiles anew.
sub build {
    my ($name, $files, @extra) = @_;
    my @sources = link_sources(@$files);
    my @libs = link_libs(@$files);
    my $cc = find_cc() or NarwhalTest::missing_all('no C compiler found');
    sanitizers_work($cc)
        or NarwhalTest::missing_all("$cc cannot build with AddressSanitizer and UBSan "
                                    . '(Debian: libasan and libubsan come with gcc)');
    my $exe = File::Spec->catfile(_dir(), $name);
    my @flags = (BASE_CFLAGS, @SANITIZERS, @extra, NarwhalLink::include_flags("$ROOT/"), "-I$ROOT/t/c");
    my ($objs, $failed) = _compile_all($cc, \@flags, @sources);
    my ($status, $out, $err) = $failed ? (1, '', $failed)
                             : run_program($cc, @SANITIZERS, '-pthread', @extra, @$objs, @libs, '-o', $exe);
    return $exe if ok($status == 0, "compile $name with $cc and sanitizers");
    diag("$cc @flags " . join ' ', map { "$ROOT/$_" } @sources);
    diag($out . $err);
    done_testing();
    exit;
}

# build_threaded($name, [files]): as build, under ThreadSanitizer; skips
# the rest of the test file where the compiler or the kernel cannot run it.
sub build_threaded {
    my ($name, $files) = @_;
    local @SANITIZERS = TSAN;
    my $cc = find_cc() or NarwhalTest::missing_all('no C compiler found');
    unless (sanitizers_work($cc)) {
        Test::More::note("$cc cannot build or run a program with ThreadSanitizer here");
        return undef;
    }
    return build("$name-tsan", $files);
}

sub _cache_dir {
    my $dir = -d "$ROOT/blib" ? "$ROOT/blib/ctest-objs" : File::Spec->catdir(_dir(), 'objs');
    mkdir $dir unless -d $dir;
    return $dir;
}

# A digest of every header of the tree (a change to any of them changes
# every object's name).
my $HEADERS;
sub _headers_digest {
    return $HEADERS //= do {
        my $d = Digest::SHA->new(1);
        for my $h (sort map { glob "$ROOT/$_/*.h" } (NarwhalLink::SRC_DIRS(), qw(t/c fuzz))) {
            $d->add($h, "\0");
            $d->addfile($h);
        }
        $d->hexdigest;
    };
}

# Compile each source to an object (in the cache); returns ([objects],
# undef) or (undef, the compiler's messages).
sub _compile_all {
    my ($cc, $flags, @sources) = @_;
    require Digest::SHA;
    require Fcntl;
    require POSIX;
    my $cache = _cache_dir();
    my (@objs, @todo);
    for my $src (@sources) {
        my $d = Digest::SHA->new(1);
        $d->add(join("\0", $cc, @$flags, $src, _headers_digest()), "\0");
        $d->addfile("$ROOT/$src");
        (my $base = $src) =~ s{.*/}{};
        $base =~ s/\.c\z//;
        my $obj = File::Spec->catfile($cache, "$base-" . $d->hexdigest . '.o');
        push @objs, $obj;
        push @todo, [ $src, $obj ] unless -e $obj;
    }
    my (%running, @errors);
    my $reap = sub {
        my $pid = waitpid(-1, 0);
        my $job = delete $running{$pid} or return;
        push @errors, _slurp("$job->[1].err") || "$job->[0]: compiler exit status $?" if $?;
        unlink "$job->[1].err";
    };
    for my $job (@todo) {
        $reap->() while keys %running >= 2;
        my ($src, $obj) = @$job;
        my $pid = fork // die "fork: $!";
        if (!$pid) {
            # (under the lock: another test file may be compiling it)
            open(my $lock, '>>', "$obj.lock") or POSIX::_exit(1);
            flock($lock, Fcntl::LOCK_EX()) or POSIX::_exit(1);
            POSIX::_exit(0) if -e $obj;
            open(STDERR, '>', "$obj.err") or POSIX::_exit(1);
            open(STDOUT, '>&', \*STDERR);
            my $st = system($cc, @$flags, '-c', "$ROOT/$src", '-o', "$obj.$$");
            POSIX::_exit(1) if $st != 0;
            rename("$obj.$$", $obj) or POSIX::_exit(1);
            POSIX::_exit(0);
        }
        $running{$pid} = $job;
    }
    $reap->() while keys %running;
    return @errors ? (undef, join '', @errors) : (\@objs, undef);
}

sub _slurp { open(my $fh, '<', $_[0]) or return ''; local $/; return <$fh> // '' }

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
