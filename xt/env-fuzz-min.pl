#!/usr/bin/perl
# Minimise a failing plan of xt/env-fuzz.pl: each attempt starts a fresh
# server, takes the reference /dump, POSTs the plan to /plan (with the fixed
# headers), then /dump again; the plan "fails" when that dump differs from
# the reference in a line matching --match (default: any line).
#   perl xt/env-fuzz-min.pl --port 6250 --seed 39 [--match 'CHECK leaked'] [--extra 'X-Foo: 1']
use strict;
use File::Path ();
our $FUZZ_DIR = $ENV{FUZZ_DIR} // '/tmp/narwhal-env-fuzz';    # logs and findings
File::Path::make_path($FUZZ_DIR);
use warnings;
use FindBin ();
use lib "$FindBin::Bin", "$FindBin::Bin/../t/lib";
use Getopt::Long;
use Data::Dumper;
use IO::Socket::INET;
use Time::HiRes qw(time sleep);
use EnvFuzzPlan ();
use NarwhalTest qw(read_response);

my %o = (port => 6250, match => '.', requests => 1);
GetOptions(\%o, "plan=s", "once!", 'port=i', 'seed=i', 'match=s', 'extra=s@', 'requests=i', 'show!') or die;
$SIG{PIPE} = 'IGNORE';
my $root = "$FindBin::Bin/..";
my @FIXED = ('Host: fuzz', 'X-Fixed-A: 1', 'X-Fixed-B: two', 'Content-Type: text/x-fixed');

sub attempt {
    my ($plan) = @_;
    my $pid = fork // die;
    if (!$pid) {
        open STDOUT, '>>', "$FUZZ_DIR/min-server-$o{port}.log"; open STDERR, '>&', \*STDOUT;
        $ENV{FUZZ_LOG} = "$FUZZ_DIR/min-destroy-$o{port}.log";
        exec $^X, "-I$root/blib/lib", "-I$root/blib/arch", "-I$FindBin::Bin", "$root/bin/narwhal", '--listen', "127.0.0.1:$o{port}",
            '--max-workers', 1, '--max-reqs-per-child', 0, "$FindBin::Bin/env-fuzz-app.psgi";
        exit 127;
    }
    my $c;
    for (1 .. 100) { $c = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $o{port}) and last; sleep 0.1 }
    my $ask = sub {
        my ($req) = @_;
        syswrite $c, $req;
        my $r = read_response($c, 5);
        return $r;
    };
    my $dump = "GET /dump HTTP/1.1\r\n" . join('', map { "$_\r\n" } @FIXED) . "\r\n";
    my $ref = $ask->($dump);
    local $Data::Dumper::Indent = 0; local $Data::Dumper::Terse = 1; local $Data::Dumper::Useqq = 1;
    my $body = Dumper($plan);
    my @h = (@FIXED, @{ $o{extra} || [] });
    my ($res, $d);
    for (1 .. $o{requests}) {
        $res = $ask->("POST /plan HTTP/1.1\r\n" . join('', map { "$_\r\n" } @h) . "Content-Length: " . length($body) . "\r\n\r\n$body");
        $d = $ask->($dump);
    }
    kill TERM => $pid; waitpid $pid, 0;
    return ('no response to /plan', $res) unless $res && $d;
    my %r = map { $_ => 1 } split /\n/, (split /\n==TYPES==\n/, $ref->{body})[0];
    my @diff = grep { !$r{$_} && /$o{match}/ } split /\n/, (split /\n==TYPES==\n/, $d->{body})[0];
    return (@diff ? join("\n", @diff) : undef, $res);
}

my $plan = $o{plan} ? eval($o{plan}) || die($@) : EnvFuzzPlan::plan($o{seed})->{ops};
if ($o{plan} && $o{once}) { my ($f) = attempt($plan); print $f ? "FAILS:\n$f\n" : "passes\n"; exit }
my ($fail) = attempt($plan);
die "seed $o{seed} does not reproduce with the fixed headers\n" unless $fail;
print "reproduces:\n$fail\n";
# delta: remove single ops (depth first) while it still fails
my $changed = 1;
while ($changed) {
    $changed = 0;
    my @paths;
    my $walk; $walk = sub { my ($ops, @p) = @_; for my $i (reverse 0 .. $#$ops) { push @paths, [ @p, $i ]; $walk->($ops->[$i]{sub}, @p, $i) if $ops->[$i]{sub} } };
    $walk->($plan);
    for my $p (@paths) {
        my $copy = eval Dumper($plan); no strict; $copy = eval do { local $Data::Dumper::Terse = 1; Dumper($plan) };
        my $ops = $copy;
        $ops = $ops->[$_]{sub} for @$p[ 0 .. $#$p - 1 ];
        next unless $ops && $p->[-1] <= $#$ops;
        splice @$ops, $p->[-1], 1;
        my ($f) = attempt($copy);
        if ($f) { $plan = $copy; $changed = 1; $fail = $f; print "  removed one op; still fails\n"; last }
    }
}
print "minimal plan:\n", map { "  $_\n" } EnvFuzzPlan::describe_ops($plan);
print "diff:\n$fail\n";
local $Data::Dumper::Indent = 1; local $Data::Dumper::Terse = 1;
print Dumper($plan) if $o{show};
