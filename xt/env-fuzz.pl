#!/usr/bin/perl
# Randomized test of the reused $env ("The $env (worker)" in docs/DESIGN.md).
#
#   perl xt/env-fuzz.pl --port 6200 --iters 3000 [--seed 1] [--valgrind] [--no-spawn]
#
# Starts `perl -Mblib bin/narwhal --max-workers 1 xt/env-fuzz-app.psgi`
# (under valgrind with --valgrind), takes a reference /dump from the fresh
# $env of the first request, then loops: /mutate?seed=N (random extra
# headers, methods, bodies, sometimes Connection: close or a new
# connection), then /dump with the reference's fixed headers, compared with
# the reference. Findings go to stdout and --out (default
# $FUZZ_DIR/findings-PORT.txt). The plan of seed N:
#   perl -Ixt -MEnvFuzzPlan -e 'print "$_\n" for EnvFuzzPlan::describe_ops(EnvFuzzPlan::plan(N)->{ops})'
use strict;
use File::Path ();
our $FUZZ_DIR = $ENV{FUZZ_DIR} // '/tmp/narwhal-env-fuzz';    # logs and findings
File::Path::make_path($FUZZ_DIR);
use warnings;
use FindBin ();
use lib "$FindBin::Bin", "$FindBin::Bin/../t/lib";
use Getopt::Long;
use IO::Socket::INET;
use POSIX ();
use Time::HiRes qw(time sleep);
use EnvFuzzPlan ();
use NarwhalTest qw(read_response read_until_close);

my %o = (port => 6200, iters => 1000, seed => 1, out => undef, timeout => 10);
GetOptions(\%o, 'vglog=s', 'port=i', 'iters=i', 'seed=i', 'valgrind!', 'spawn!', 'out=s', 'timeout=f',
           'verbose!', 'rand=i') or die "bad options\n";
$o{spawn} //= 1;
$o{timeout} = 60 if $o{valgrind} && $o{timeout} == 10;
my $root = "$FindBin::Bin/..";
my $out = $o{out} // "$FUZZ_DIR/findings-$o{port}.txt";
my $dlog = "$FUZZ_DIR/destroy-$o{port}.log";
my $slog = "$FUZZ_DIR/server-$o{port}.log";
unlink $dlog, $slog;
open my $OUT, '>', $out or die "$out: $!";
$OUT->autoflush(1);
$SIG{PIPE} = 'IGNORE';
srand($o{rand} // $o{seed});

my $server_pid;
if ($o{spawn}) {
    my @cmd = ($^X, "-I$root/blib/lib", "-I$root/blib/arch", "-I$FindBin::Bin", "$root/bin/narwhal",
               '--listen', "127.0.0.1:$o{port}", '--max-workers', 1, '--max-reqs-per-child', 0,
               '--body-in-memory', 4096, "$FindBin::Bin/env-fuzz-app.psgi");
    unshift @cmd, 'valgrind', '--trace-children=yes', '--error-limit=no',
        "--log-file=" . ($o{vglog} // "$FUZZ_DIR/vg.%p.log") if $o{valgrind};
    $server_pid = fork // die;
    if (!$server_pid) {
        $ENV{FUZZ_LOG} = $dlog;
        open STDOUT, '>>', $slog; open STDERR, '>>', $slog;
        chdir $root;
        exec @cmd or POSIX::_exit(127);
    }
    my $end = time + ($o{valgrind} ? 120 : 20);
    until (IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $o{port})) {
        die "server did not start\n" if time > $end;
        sleep 0.2;
    }
    sleep($o{valgrind} ? 5 : 0.5);
}
END { if ($server_pid) { kill TERM => $server_pid; waitpid($server_pid, 0) } }

my ($findings, $iters_done, %sig) = (0, 0);
sub finding {
    my ($sig, $text) = @_;
    $findings++;
    my $first = !$sig{$sig}++;
    print $OUT "=== FINDING ($sig)", ($first ? '' : " [repeat $sig{$sig}]"), "\n$text\n\n";
    print "FINDING: $sig\n" if $first;
}

sub connect_ {
    for my $try (1 .. 3) {
        my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $o{port}, Timeout => 5);
        return $s if $s;
        finding("connect failed: $!", "attempt $try: $!");
        sleep 1;
    }
    return undef;
}

my @FIXED = ('Host: fuzz', 'X-Fixed-A: 1', 'X-Fixed-B: two', 'Content-Type: text/x-fixed');
sub dump_req { "GET /dump?q=1 HTTP/1.1\r\n" . join('', map { "$_\r\n" } @FIXED) . "\r\n" }

sub ask {
    my ($c, $bytes, $is_head) = @_;
    defined syswrite($c, $bytes) or return undef;
    return read_response($c, $o{timeout}, $is_head);
}

sub plan_text { my ($seed) = @_; join "\n", map { "    $_" } EnvFuzzPlan::describe_ops(EnvFuzzPlan::plan($seed)->{ops}) }

my $log_pos = 0;
my %log_seen;
sub server_log_check {
    my ($ctx) = @_;
    open my $f, '<', $slog or return;
    seek $f, $log_pos, 0;
    while (my $l = <$f>) {
        $log_pos = tell $f;
        next if $l =~ /deliberate|cleanup handler died: (?:cleanup die|Can't use an undefined value as a subroutine)/;
        next if $l =~ /^==\d+==/;    # valgrind
        (my $norm = $l) =~ s/\d+/N/g;
        my $bad = $l =~ /killed by signal|exited with status|panic|Attempt to free|freed value|Bizarre|corrupt|double free|Assertion|Segmentation/i;
        finding("server log: $norm", "$ctx\nserver log: $l") if $bad;
        print "server log (new kind): $l" if !$bad && !$log_seen{$norm}++;
    }
}

# the reference: the first request of the worker, a fresh $env
my $c = connect_() or die "connect: $!";
my $ref = ask($c, dump_req()) or die "no reference dump\n";
die "reference: status $ref->{status}\n$ref->{body}" unless $ref->{status} == 200;
my ($ref_main, $ref_types) = split /\n==TYPES==\n/, $ref->{body};
# the CHECK lines are compared with what they must say, not with the reference
my $CHECKS = "CHECK weak slots alive (not kept): 0\nCHECK weak env alive (not kept): 0\nCHECK leaked objects: \nCHECK kept changed: ";
sub fix_checks { my ($m) = @_; $m =~ s/\nCHECK .*\z//s; return "$m\n$CHECKS" }
$ref_main = fix_checks($ref_main);
my $pid = $ref->{headers}{'x-pid'};
print "reference from worker $pid:\n$ref_main\n" if $o{verbose};
print $OUT "REFERENCE (fresh \$env, worker $pid):\n$ref_main\n\n";
my %type_diff;
# a new worker (after a crash) has a new template: the reference is taken again, from a fresh $env
# (a keep_env request first, so that the next request gets a fresh hash)
sub new_reference {
    my $k = connect_() or die;
    ask($k, "GET /ops?keep_env HTTP/1.1\r\nHost: fuzz\r\n\r\n");
    my $r = ask($k, dump_req()) or die "no new reference\n";
    close $k;
    my ($m) = split /\n==TYPES==\n/, $r->{body};
    $m = fix_checks($m);
    print $OUT "NEW REFERENCE (worker $r->{headers}{'x-pid'}):\n$m\n\n";
    return $m;
}

sub diff_text {
    my ($a, $b) = @_;
    my %a = map { $_ => 1 } split /\n/, $a;
    my %b = map { $_ => 1 } split /\n/, $b;
    return join "\n", (map { "- $_" } grep { !$b{$_} } split /\n/, $a), (map { "+ $_" } grep { !$a{$_} } split /\n/, $b);
}

my $t0 = time;
my $seed = $o{seed} - 1;
my @history;    # the last few requests on this connection, for reproduction
for my $iter (1 .. $o{iters}) {
    $seed++;
    my $plan = EnvFuzzPlan::plan($seed);
    # the /mutate request (Connection: close ones on a new connection: only their own plan may hold it open)
    my $close = rand() < 0.05;
    my $http10 = rand() < 0.05;
    my $will_close = $close || $plan->{dies} || ($http10 && $plan->{resp} !~ /^(?:array|stream3)$/);
    if (!$c || $will_close || rand() < 0.05) { close $c if $c; $c = connect_() or die "connect: $!"; @history = () }
    my $method = rand() < 0.7 ? 'GET' : rand() < 0.75 ? 'POST' : 'HEAD';
    my @h = ('Host: ' . (rand() < 0.8 ? 'fuzz' : 'other.example:81'));
    my $nh = rand() < 0.1 ? 30 + int(rand(40)) : int(rand(6));
    for (1 .. $nh) {
        my $name = ('X-Fuzz-1', 'X-Fuzz-2', 'X-Fixed-A', 'X-Fixed-B', 'X-Dup', 'Content-Type', 'X-App',
                    'X-Fuzz-' . int(rand(100)), 'Transfer-Encoding-Not', 'X-Long')[ int rand 10 ];
        my $len = rand() < 0.1 ? 1000 + int(rand(3000)) : int(rand(20));
        push @h, "$name: " . join('', map { ('a' .. 'z', 0 .. 9, ' ', '-')[ rand 38 ] } 1 .. $len) . 'z';
    }
    my $body = '';
    if ($method eq 'POST') {
        my $blen = (0, 5, 100, 5000, 20000)[ int rand 5 ];
        $body = 'b' x $blen;
        if (rand() < 0.3 && !$http10) {
            push @h, 'Transfer-Encoding: chunked';
            $body = $blen ? sprintf("%x\r\n%s\r\n0\r\n\r\n", $blen, $body) : "0\r\n\r\n";
        } else {
            push @h, "Content-Length: $blen";
        }
    }
    push @h, 'Connection: close' if $close;
    push @h, 'Connection: keep-alive' if $http10 && !$close;
    my $path = rand() < 0.8 ? "/mutate?seed=$seed" : "/mutate%C3%A9/x%20y?seed=$seed&a=%FF";
    my $req = "$method $path HTTP/1.$http10\r\n" . join('', map { "$_\r\n" } @h) . "\r\n" . $body;
    $req =~ s{HTTP/1\.1\r}{HTTP/1.0\r} if $http10;
    $req =~ s{HTTP/1\.\r}{HTTP/1.1\r};
    push @history, "mutate seed=$seed: " . (split /\r\n/, $req)[0] . ' [' . join(' | ', map { length > 60 ? substr($_, 0, 57) . '...' : $_ } @h[1 .. $#h]) . ']' . ($body ? ' body ' . length($body) . ' bytes' : '');
    my $ctx = sub { "seed=$seed iter=$iter resp=$plan->{resp} dies=$plan->{dies}\nplan:\n" . plan_text($seed)
                    . "\nrequests on this connection (oldest first):\n  " . join("\n  ", @history[ ($#history > 8 ? $#history - 8 : 0) .. $#history ]) };
    my $late_fin;
    my $sent = time;
    my $res = ask($c, $req, $method eq 'HEAD');
    if (!$res) {
        finding('mutate: no response (dropped connection)', $ctx->());
        server_log_check($ctx->());
        undef $c;
        next;
    }
    my $want = $plan->{dies} ? 500 : 200;
    if ($res->{status} != $want) {
        finding("mutate: status $res->{status}, want $want", $ctx->() . "\nbody: $res->{body}");
    }
    if (length($res->{headers}{'x-pid'} // '') && $res->{headers}{'x-pid'} ne $pid) {
        finding('worker pid changed', $ctx->() . "\nwas $pid, now $res->{headers}{'x-pid'}");
        $pid = $res->{headers}{'x-pid'};
        $ref_main = new_reference();
    }
    my $conn_h = lc($res->{headers}{connection} // '');
    my $closed_expected = $close || $plan->{dies} || $conn_h =~ /close/ || ($http10 && $conn_h !~ /keep-alive/);
    if ($closed_expected) {
        my $t = time;
        my $rest = read_until_close($c, 3);
        my $took = time - $t;
        $late_fin = sprintf('%.2f', $took) if $took > ($o{valgrind} ? 5 : 1);
        if (0) {
            my %k;
            for (flat($plan->{ops})) {
                $k{ $_->{op} } = 1 if $_->{op} =~ /^(?:keep_env|keep_slot|cycle_env|refalias)$/;
                $k{capture_env} = 1 if ($_->{kind} // '') eq 'capture_env';
                $k{'value self'} = 1 if $_->{value} eq 'self' && $_->{op} =~ /^(?:set|local_nested|set_sv_alias)$/;
                $k{'value ref_other'} = 1 if $_->{value} =~ /^ref_other/ && $_->{op} =~ /^(?:set|local_nested|set_sv_alias)$/;
            }
            my $keeps = join ',', sort keys %k;
            finding('Connection: close: no prompt FIN' . ($keeps ? " (plan keeps: $keeps)" : ''),
                    $ctx->() . sprintf("\nFIN after %.2f s", $took));
        }
        undef $c;
    }
    # the /dump request: same connection, or a new one
    if (!$c || rand() < 0.15) { close $c if $c; $c = connect_() or die "connect: $!"; @history = () }
    push @history, 'dump (fixed headers)';
    my $d = ask($c, dump_req());
    if (!$d) {
        finding('dump: no response (dropped connection)', $ctx->());
        server_log_check($ctx->());
        undef $c;
        next;
    }
    my ($main, $types) = split /\n==TYPES==\n/, $d->{body} // '';
    if (length($d->{headers}{'x-pid'} // '') && $d->{headers}{'x-pid'} ne $pid) {
        finding('worker pid changed', $ctx->() . "\nwas $pid, now $d->{headers}{'x-pid'}");
        $pid = $d->{headers}{'x-pid'};
        $main = $ref_main = new_reference();    # (a new worker: new template referents)
        $types = $ref_types;
    }
    if ($d->{status} != 200) {
        finding("dump: status $d->{status}", $ctx->() . "\n$d->{body}");
    } elsif ($main ne $ref_main) {
        my $diff = diff_text($ref_main, $main);
        (my $sig = join(' / ', map { (split / => |: /)[0] } split /\n/, $diff)) =~ s/\d+/N/g;
        finding("dump differs: $sig", $ctx->() . "\ndiff (- reference, + now):\n$diff");
    }
    if (($types // '') ne $ref_types) {
        my $diff = diff_text($ref_types, $types // '');
        $type_diff{$diff}++;
    }
    if ($late_fin) {
        my %k;
        for (flat($plan->{ops})) {
            $k{ $_->{op} } = 1 if $_->{op} =~ /^(?:keep_env|keep_slot|cycle_env|refalias)$/;
            $k{capture_env} = 1 if ($_->{kind} // '') eq 'capture_env';
            $k{'value self'} = 1 if $_->{value} eq 'self' && $_->{op} =~ /^(?:set|local_nested|set_sv_alias)$/;
        }
        my $holders = $d->{headers}{'x-holders'} // '?';
        finding('Connection: close: no prompt FIN' . (%k ? ' (plan keeps: ' . join(',', sort keys %k) . ')' : '')
                . ($holders ? " (kept things hold $holders io/conn refs)" : ' (NOTHING KEPT HOLDS IT)'),
                $ctx->() . "\nFIN after $late_fin s");
    }
    if (my @dead = grep { length } split /,/, $d->{headers}{'x-dead'} // '') {
        open my $f, '<', $dlog; my %logged = map { /^D (\S+)/ ? ($1 => 1) : () } <$f>;
        my @missing = grep { !$logged{$_} } @dead;
        finding('DESTROY not in the log when /dump answered', $ctx->() . "\nids: @missing") if @missing;
    }
    server_log_check($ctx->());
    $iters_done++;
    printf "%d iterations, %d findings, %.0f s\n", $iter, $findings, time - $t0 if $iter % 200 == 0;
}

sub flat { map { ($_, $_->{sub} ? flat($_->{sub}) : ()) } @{ $_[0] } }

# the DESTROY log: every object the app made and that went away was logged
print $OUT "SV type-only differences (B class, not visible to an app):\n",
    map { "  [$type_diff{$_}x] $_\n" } sort keys %type_diff;
printf "done: %d iterations (seeds %d..%d), %d findings (%d kinds), %.0f s; details in %s\n",
    $iters_done, $o{seed}, $seed, $findings, scalar(keys %sig), time - $t0, $out;
