use strict;
use warnings;
use Test::More;
use Time::HiRes ();
use lib 't/lib';
use NarwhalTest qw(spawn_server raw_connect read_response read_until_close tmpdir wait_until);

# Hostile things an app can do to its $env, which the reused hash ("The $env"
# in docs/DESIGN.md) must survive. Each case: a request that does it, then a
# request on the same connection (same worker, same spare) that must be
# answered and see a fresh $env. Found in review: the first version of the
# reuse crashed the worker on several of these.

my $dir = tmpdir();
my $log = "$dir/events.log";

my $app = <<"APP";
use strict; use warnings;
use Scalar::Util ();
use Hash::Util ();
my \$log = '$log';
sub Probe::note_ { open my \$f, '>>', \$log or die; print \$f "\$_[0]\\n"; close \$f }
package DiesOnFetch { sub TIESCALAR { bless [], shift } sub FETCH { die "fetch died\n" } sub STORE {} }
package Tag { sub DESTROY { Probe::note_("DESTROY \${\$_[0]}") } }
package Body { sub new { my \$n = 0; bless \\\$n, shift } sub getline { \${\$_[0]}++ ? undef : 'body' }
               sub close {} sub DESTROY { Probe::note_('body DESTROY') } }
our (\@keep);
my %r = (
    ok          => sub { [200, [], ['ok']] },
    rss         => sub { open my \$f, '<', "/proc/\$\$/status"; my (\$l) = grep /^VmRSS/, <\$f>; \$l =~ /(\\d+)/; [200, [], [\$1]] },
    # an absent header key left undef (SVt_NULL): for (\$env->{X}) {} vivifies one too
    undef_hdr   => sub { \$_[0]{HTTP_X_NEW} = undef; [200, [], ['ok']] },
    vivify_hdr  => sub { for (\$_[0]{HTTP_X_VIV}) {} [200, [], ['ok']] },
    # psgix.io deleted, or its scalar kept / weakly referenced
    del_io      => sub { delete \$_[0]{'psgix.io'}; [200, [], ['ok']] },
    keep_io_ref => sub { push \@keep, \\\$_[0]{'psgix.io'}; [200, [], ['ok']] },
    # a value blessed in place: freed (DESTROY) at the end of the request, never seen again
    bless_tmpl  => sub { \$_[0]{SCRIPT_NAME} = 'tmpl'; bless \\\$_[0]{SCRIPT_NAME}, 'Tag'; [200, [], ['ok']] },
    bless_fixed => sub { \$_[0]{QUERY_STRING} = 'fixed'; bless \\\$_[0]{QUERY_STRING}, 'Tag'; [200, [], ['ok']] },
    blessed     => sub { my \$e = shift; [200, [], [join ',', map { Scalar::Util::blessed(\\\$e->{\$_}) // '-' } qw(SCRIPT_NAME QUERY_STRING)]] },
    # the socket's glob left in a per-request key
    io_glob     => sub { my \$io = \$_[0]{'psgix.io'}; \$_[0]{QUERY_STRING} = *\$io; [200, [], ['ok']] },
    # psgix.io's slot aliased to undef itself (an SV without a body)
    alias_io    => sub { use feature 'refaliasing'; no warnings 'experimental::refaliasing';
                         \\\$_[0]{'psgix.io'} = \\undef; [200, [], ['ok']] },
    # all at once: a locked \$env without its handlers, a tied value that dies
    locked_bare => sub { require Hash::Util; delete \$_[0]{'psgix.cleanup.handlers'};
                         delete \$_[0]{REQUEST_METHOD}; Hash::Util::lock_keys(%{ \$_[0] }); [200, [], ['ok']] },
    locked_die  => sub { delete \$_[0]{REQUEST_METHOD}; Hash::Util::lock_keys(%{ \$_[0] }); die "after locking\n" },
    tied_dies   => sub { tie \$_[0]{'psgix.cleanup.handlers'}, 'DiesOnFetch'; [200, [], ['ok']] },
    empties     => sub { push \@{ \$_[0]{'psgix.cleanup.handlers'} }, sub { \@{ \$_[0]{'psgix.cleanup.handlers'} } = () },
                         sub { Probe::note_('second handler ran') }; [200, [], ['ok']] },
    big_io      => sub { my \$n = 100_000_000 + length(\$_[0]{QUERY_STRING}); \$_[0]{'psgix.io'} = 'x' x \$n; [200, [], ['ok']] },
    many_keys   => sub { keys(%{ \$_[0] }) = 2**16; [200, [], ['ok']] },
    buckets     => sub { [200, [], [scalar(%{ \$_[0] }) ? Hash::Util::bucket_ratio(%{ \$_[0] }) : '']] },
    locked      => sub { require Hash::Util; Hash::Util::lock_hashref(\$_[0]); [200, [], ['ok']] },
    no_handlers => sub { delete \$_[0]{'psgix.cleanup.handlers'}; [200, [], ['ok']] },
    ro_handlers => sub { Internals::SvREADONLY(\@{ \$_[0]{'psgix.cleanup.handlers'} }, 1); [200, [], ['ok']] },
    big_fixed   => sub { \$_[0]{QUERY_STRING} = 'x' x 100_000_000; [200, [], ['ok']] },
    big_tmpl    => sub { \$_[0]{SCRIPT_NAME} = 'x' x 100_000_000; [200, [], ['ok']] },
    # response body freed before the cleanup handlers run (as before e89e16d)
    order       => sub { push \@{ \$_[0]{'psgix.cleanup.handlers'} }, sub { Probe::note_('cleanup') }; [200, [], Body->new] },
    not_bool    => sub { no warnings; my \$x = Scalar::Util::dualvar(0, ''); my \$n = \$x + 0.5; \$_[0]{'psgi.run_once'} = \$x; [200, [], ['ok']] },
    is_bool     => sub { no warnings; [200, [], [builtin::is_bool(\$_[0]{'psgi.run_once'}) ? 'bool' : 'not bool']] },
    utf8_key    => sub { my \$k = 'REQUEST_URI'; utf8::upgrade(\$k); my \$v = delete \$_[0]{REQUEST_URI}; \$_[0]{\$k} = \$v; [200, [], ['ok']] },
    key_flags   => sub { [200, [], [join ',', map { utf8::is_utf8(\$_) ? \$_ : () } keys %{\$_[0]}]] },
);
sub { my \$env = shift; my (\$p) = \$env->{PATH_INFO} =~ m{^/(\\w+)}; (\$r{\$p // ''} || sub { [404, [], ['?']] })->(\$env) };
APP

my $srv = spawn_server(app => $app, args => ['--max-workers' => 1]);
my $port = $srv->port;

sub ask {
    my ($sock, $path, @headers) = @_;
    syswrite($sock, "GET $path HTTP/1.1\r\nHost: t\r\n" . join('', map { "$_\r\n" } @headers) . "\r\n") or return undef;
    my $res = read_response($sock, 5) or return undef;
    return $res->{body};
}
sub events { open my $f, '<', $log or return ''; local $/; my $e = <$f>; unlink $log; return $e }
# what the worker noted once $re shows up (it writes after the response), or all it noted in 1 s
sub events_when { my ($re) = @_; wait_until(sub { open my $f, '<', $log or return 0; local $/; <$f> =~ $re }, 1); events() }

# 1. Worker crashes (SIGSEGV) in the recycler
for my $case (['undef_hdr', 'an absent header key set to undef (env_stale_header: SvLEN of a bodyless SV)'],
              ['vivify_hdr', 'for ($env->{HTTP_X}) {} (same)'],
              ['del_io', 'psgix.io deleted (env_lazy_io_again: mg_findext on a new SV)'],
              ['keep_io_ref', 'a reference to psgix.io kept (same)'],
              ['ro_handlers', 'a read-only psgix.cleanup.handlers array (av_clear croaks)'],
              ['alias_io', 'psgix.io aliased to undef (env_lazy_io_release: SvMAGIC of an SV without a body)'],
              ['locked_bare', 'a locked $env without its handlers or REQUEST_METHOD'],
              ['tied_dies', 'the handlers slot tied to something that dies on FETCH'],
              ['locked', 'the app locked $env (Hash::Util::lock_hash)'],
              ['no_handlers', 'the app deleted psgix.cleanup.handlers']) {
    my ($path, $what) = @$case;
    my $c = raw_connect($port) or die;
    is(ask($c, "/$path"), 'ok', "$path answered");
    is(ask($c, '/ok'), 'ok', "the next request is answered too: $what");
}

{   # the error log reads REQUEST_METHOD from a locked $env that lacks it
    my $c = raw_connect($port) or die;
    like(ask($c, '/locked_die') // '', qr/Internal Server Error/, 'an app that locks $env and dies gets a 500');
    my $c2 = raw_connect($port) or die;
    is(ask($c2, '/ok'), 'ok', 'and the worker goes on');
    unlike($srv->log_text, qr/exited with status|killed by signal/, 'no worker died in all of the above');
}

# 2. Values blessed in place
events();
my $c = raw_connect($port) or die;
ask($c, '/bless_tmpl');
ask($c, '/bless_fixed');
is(ask($c, '/blessed'), '-,-', 'a value the app blessed in place is not in the next request');
like(events_when(qr/DESTROY fixed/), qr/DESTROY tmpl.*DESTROY fixed/s, 'and was freed (DESTROY) at the end of its request');

# 3. The socket's glob in a per-request key keeps the socket open
close $c;    # with --no-manager the one worker would wait on it for --keepalive-timeout
{
    my $s = raw_connect($port) or die;
    syswrite($s, "GET /io_glob HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
    my $t0 = Time::HiRes::time();
    my $got = read_until_close($s, 3);
    like($got, qr{^HTTP/1.1 200}, 'io_glob answered');
    cmp_ok(Time::HiRes::time() - $t0, '<', 2, 'and the connection closed right after (the spare does not hold the socket)');
}

# 4. A large string left in a per-request or template key is freed
$c = raw_connect($port) or die;
my $base = ask($c, '/rss');
ask($c, '/big_fixed');
ask($c, '/big_tmpl');
my $after = ask($c, '/rss');
cmp_ok($after - $base, '<', 50_000, "large strings the app left in \$env are freed (RSS $base -> $after kB)");

# 5. Order: response body freed before the cleanup handlers, as before
events();
ask($c, '/order');
like(events_when(qr/body DESTROY.*cleanup|cleanup.*body DESTROY/s), qr/body DESTROY.*cleanup/s, 'the response body is freed before the cleanup handlers run');

# 5c. What would make every later request slow or the worker big
$base = ask($c, '/rss');
ask($c, '/big_io');
$after = ask($c, '/rss');
cmp_ok($after - $base, '<', 50_000, "a large string left in psgix.io is freed (RSS $base -> $after kB)");
ask($c, '/many_keys');
my ($used, $buckets) = split m{/}, ask($c, '/buckets') // '';
cmp_ok($buckets // 1e9, '<=', 256, "a hash grown to 65536 buckets is not reused ($buckets buckets after)");

# 5b. A handler that empties the handlers' array: the others still run
events();
is(ask($c, '/empties'), 'ok', 'a cleanup handler empties the array of handlers');
like(events_when(qr/second handler ran/), qr/second handler ran/, 'the handlers after it still run');
is(ask($c, '/ok'), 'ok', 'and the worker goes on');

# 6. Small tells
ask($c, '/not_bool');
is(ask($c, '/is_bool'), 'bool', 'psgi.run_once is a boolean again after the app replaced it');
ask($c, '/utf8_key');
is(ask($c, '/key_flags'), '', 'no utf8-flagged key left from the request before');

done_testing;
