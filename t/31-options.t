use strict;
use warnings;
use Test::More;
use lib 't/lib';
use NarwhalTest qw(root perl_cmd run_cmd);
use Narwhal ();
use Narwhal::Options ();
use Plack::Handler::Narwhal ();

# The option table (lib/Narwhal/Options.pm) is the one source of every
# option's name, aliases, default, bounds and help: --help, the README, the
# POD, the C configuration and the manager's arguments must agree with it.

my $ROOT = root();
my @table = Narwhal::Options::table();
my @documented = grep { $_->{doc} // 1 } @table;

# --help lists every option with its aliases and default.
my $r = run_cmd([ perl_cmd(), "$ROOT/bin/narwhal", '--help' ]);
is($r->{code}, 0, '--help exits 0');
my $help = $r->{out};
for my $o (@documented) {
    my $flag = Narwhal::Options::flag_name($o);
    like($help, qr/\Q$flag\E/, "--help names $flag");
    like($help, qr/\Q$flag\E.*\(default \Q$o->{default}\E\)/s, "--help gives the default of $flag, $o->{default}")
        if defined $o->{default} && $o->{type} ne 'bool';
    for my $alias (grep { length > 1 } @{ $o->{alias} || [] }) {
        like($help, qr/--\Q$alias\E\b/, "--help names the alias --$alias");
    }
}

# The README's table is what dev/gen-options writes from the table.
is(run_cmd([ $^X, "$ROOT/dev/gen-options", '--check' ])->{code}, 0, 'README options table is the one dev/gen-options writes (run it after changing the table)');

# The POD: every option is described, and any default it states is the table's.
open(my $fh, '<', "$ROOT/lib/Narwhal.pm") or die $!;
my $pod = do { local $/; <$fh> };
my ($options_pod) = $pod =~ /^=head1 OPTIONS\n(.*?)^=head1 SIGNALS/ms;
ok($options_pod, 'the POD has OPTIONS and LIMITS sections');
for my $o (@documented) {
    (my $name = $o->{name}) =~ tr/_/-/;
    like($options_pod, qr/--(?:no-)?\Q$name\E\b/, "the POD describes --$name");
}
my %stated;
for my $item (split /^=item /m, $options_pod) {
    my ($head, $body) = split /\n/, $item, 2;
    next unless defined $body;
    my @names = $head =~ /--(?:no-)?([a-z][\w-]*)/g;
    my ($default) = $body =~ /\(default ([^)\s]+)\)/;
    $stated{$names[0]} = $default if @names && defined $default;
}
while ($options_pod =~ /^\s+--([a-z][\w-]+)\s+(\d+)\s/mg) {    # the LIMITS list
    $stated{$1} = $2;
}
ok(scalar(keys %stated) >= 10, 'the POD states defaults (' . scalar(keys %stated) . ')');
for my $name (sort keys %stated) {
    (my $key = $name) =~ tr/-/_/;
    my $o = Narwhal::Options::option($key) or do { fail("the POD states a default for unknown --$name"); next };
    is($stated{$name}, $o->{default}, "the POD's default for --$name is the table's");
}

# Bounds that come from C are C's.
is(Narwhal::Options::option('max_headers')->{max}, Narwhal::Limits::MAX_HEADERS_HARD(),
   '--max-headers bound from src/nw_limits.h');
is(Narwhal::Options::option('max_header_bytes')->{max}, Narwhal::Limits::MAX_HEADER_BYTES_HARD(),
   '--max-header-bytes bound from the frame size');
is(Narwhal::Options::option('max_request_line')->{default}, Narwhal::Limits::DEFAULT_MAX_REQUEST_LINE(),
   '--max-request-line default from src/nw_limits.h');

# The C side's fields are all C options in the table, and the typed
# configuration is built from it.
my @fields = Narwhal::Acceptor::config_fields();
ok(scalar @fields >= 8, 'the C side names its configuration fields');
for my $f (@fields) {
    ok(Narwhal::Options::option($f) && Narwhal::Options::option($f)->{c}, "C field $f is a C option in the table");
}
my $o = Narwhal::Options::normalize(max_headers => 7, timeout => 2.5);
is_deeply(Narwhal::Options::c_config($o)->[ (grep { $fields[$_] eq 'max_headers' } 0 .. $#fields)[0] ], 7,
          'c_config puts each value in the field the C side named');

# The manager's arguments are built from the table, and the manager takes
# exactly those.
my $musage = run_cmd([ "$ROOT/blib/arch/auto/Narwhal/narwhal-manager", '--help' ])->{out};
my %takes = map { $_ => 1 } grep { $_ ne 'help' } $musage =~ /^\s+--([a-z-]+)/mg;
my %passed = map { /^--(.+)/ ? ($1 => 1) : () } Narwhal::Options::manager_argv(Narwhal::Options::normalize());
is_deeply(\%passed, \%takes, 'the master passes the manager exactly the options the manager takes');

# A handler argument Narwhal does not know is named, not dropped silently.
my @warned;
Narwhal::Options::normalize(foo => 1, max_wokers => 3, max_workers => 2,
                            -on_unknown => sub { push @warned, $_[0] });
is_deeply([ sort @warned ], [qw(foo max_wokers)], 'unknown handler options are reported');
eval { Narwhal::Options::normalize(foo => 1) };
like($@, qr/^unknown option --foo$/m, 'and are an error where nobody listens for them');
is(Narwhal::Options::normalize(keepalive => 0)->{disable_keepalive}, 1,
   "plackup's --disable-keepalive (keepalive => 0) turns keep-alive off");
is(Narwhal::Options::normalize(no_manager => 1)->{manager}, 0,
   "plackup's --no-manager=1 turns the manager off");
{
    my $err = '';
    open(my $save, '>&', \*STDERR); close STDERR; open(STDERR, '>', \$err);
    my $o = Narwhal::Options::normalize(no_manager => 'app.psgi');
    open(STDERR, '>&', $save);
    is($o->{manager}, 0, "plackup's '--no-manager app.psgi' still turns the manager off");
    like($err, qr/took 'app\.psgi' as the value of --no-manager/, 'and says what plackup did');
}

# Bad values: one line naming the flag.
for my $case ([ max_headers => 5000, qr/^--max-headers must be at most 1024$/ ],
              [ max_request_line => 10, qr/^--max-request-line must be at least 64$/ ],
              [ max_header_bytes => 200000, qr/^--max-header-bytes must be at most 131072$/ ],
              [ timeout => 0, qr/^--timeout must be more than 0$/ ],
              [ max_workers => 'x', qr/^--max-workers wants a whole number, not 'x'$/ ]) {
    my ($k, $v, $re) = @$case;
    eval { Narwhal::Options::normalize($k => $v) };
    like($@, $re, "$k => $v is refused in one line");
}

done_testing;
