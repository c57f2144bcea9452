use strict;
use warnings;
use Test::More;
use lib 't/lib';
use NarwhalTest qw(root perl_cmd run_cmd);
use Narwhal ();
use Narwhal::Options ();
use Plack::Handler::Narwhal ();

# The option table (lib/Narwhal/Options.pm) is the one source of every
# option's name, aliases, default, bounds and help: --help, docs/OPTIONS.md,
# the README's short table, the POD, the C configuration and the manager's
# arguments must agree with it.

my $ROOT = root();
my @table = Narwhal::Options::table();
my @documented = grep { $_->{doc} // 1 } @table;

# Each place an operator reads about options says, for every option of the
# table, its name, its aliases and its default; and names no option the
# table does not have. Parsed here independently of dev/gen-options, so a
# hand edit, a stale generated section or a generator bug all fail.
sub short_aliases { return grep { length == 1 } @{ $_[0]{alias} || [] } }
sub long_aliases  { return grep { length > 1 } @{ $_[0]{alias} || [] } }
sub default_shown { return Narwhal::Options::default_text($_[0]) }

# --help: one line per option (two when the flag is long).
my $r = run_cmd([ perl_cmd(), "$ROOT/bin/narwhal", '--help' ]);
is($r->{code}, 0, '--help exits 0');
my %help_line;
while ($r->{out} =~ /^  (?:-(\w), |    )(--\[?[\w-]+\]?[\w-]*)(?: [A-Z]+)?(?: +|\n {29})(.*)$/mg) {
    $help_line{$2} = { short => $1, text => $3 };
}
for my $o (@documented) {
    my $flag = Narwhal::Options::flag_name($o);
    my $line = delete $help_line{$flag} or do { fail("--help has a line for $flag"); next };
    is($line->{short}, (short_aliases($o))[0], "--help: ${flag}'s short alias");
    like($line->{text}, qr/\Q--$_\E\b/, "--help: ${flag}'s alias --$_") for long_aliases($o);
    my $default = $o->{type} eq 'bool' ? undef : $o->{default};
    my ($shown) = $line->{text} =~ /\(default ([^)]+)\)$/;
    is($shown, $default, "--help: ${flag}'s default");
}
delete @help_line{qw(--env --app --help)};
is_deeply([ sort keys %help_line ], [], '--help names no option the table lacks');

# docs/OPTIONS.md's table: one row per option.
my $options_md = slurp("$ROOT/docs/OPTIONS.md");
my %row;
while ($options_md =~ /^\| `(--[^` ]+)(?: [A-Z]+)?` \| ([^|]*) \| ([^|]*) \| /mg) {
    $row{$1} = { alias => $2, default => $3 };
}
for my $o (@documented) {
    my $flag = Narwhal::Options::flag_name($o);
    my $row = delete $row{$flag} or do { fail("docs/OPTIONS.md has a row for $flag"); next };
    my @aliases = ((map { "-$_" } short_aliases($o)), (map { "--$_" } long_aliases($o)),
                   @{ $o->{negated} || [] });
    is_deeply([ $row->{alias} =~ /`([^`]+)`/g ], \@aliases, "docs/OPTIONS.md: ${flag}'s aliases");
    is($row->{default}, default_shown($o), "docs/OPTIONS.md: ${flag}'s default");
}
is_deeply([ sort keys %row ], [], 'docs/OPTIONS.md names no option the table lacks');

# The README's short table (the options that matter most, written by
# hand): each row names an option of the table, with its default.
my $readme = slurp("$ROOT/README.md");
my %by_flag = map { (Narwhal::Options::flag_name($_) => $_) } @documented;
my @readme_rows = $readme =~ /^\| `(--[^` ]+)(?: [A-Z]+)?` \| ([^|]*?) \| /mg;
ok(@readme_rows >= 2 * 10, "the README's short table has rows");
while (my ($flag, $default) = splice(@readme_rows, 0, 2)) {
    my $o = $by_flag{$flag} or do { fail("README: $flag is an option of the table"); next };
    is($default, default_shown($o), "README: ${flag}'s default");
}

# The POD's OPTIONS: one =item per option, naming its spellings and default.
my ($options_pod) = slurp("$ROOT/lib/Narwhal.pm") =~ /^=head1 OPTIONS\n(.*?)^=head1 /ms;
ok($options_pod, 'the POD has an OPTIONS section');
my %item;
for my $item (split /^=item /m, $options_pod // '') {
    my ($head, $body) = split /\n/, $item, 2;
    my @names = $head =~ /(?:^|, )(--?[\[\]\w-]+)/g or next;
    $item{ $names[0] } = { names => [ @names[1 .. $#names] ], body => $body };
}
for my $o (@documented) {
    my $flag = Narwhal::Options::flag_name($o);
    my $item = delete $item{$flag} or do { fail("the POD has an item for $flag"); next };
    is_deeply($item->{names}, [ (map { "-$_" } short_aliases($o)), (map { "--$_" } long_aliases($o)) ],
              "POD: ${flag}'s aliases");
    like($item->{body}, qr/C<\Q$_\E>/, "POD: ${flag}'s handler alias $_") for @{ $o->{negated} || [] };
    my ($shown) = $item->{body} =~ /Default:\s+C<([^>]*)>/;   # (the POD wraps anywhere)
    is($shown // '', default_shown($o), "POD: ${flag}'s default");
}
is_deeply([ sort keys %item ], [], 'the POD names no option the table lacks');

# And both are exactly what dev/gen-options writes.
SKIP: {
    skip 'dev/gen-options is development material (a release tarball leaves dev/ out)', 1
        unless -f "$ROOT/dev/gen-options";
    my $gen = run_cmd([ $^X, "$ROOT/dev/gen-options", '--check' ]);
    is($gen->{code}, 0, 'docs/OPTIONS.md and POD options are what dev/gen-options writes (run it after changing the table)')
        or diag $gen->{out};
}

sub slurp {
    open(my $fh, '<', $_[0]) or die "$_[0]: $!";
    local $/;
    return <$fh>;
}

# Bounds that come from C are C's.
is(Narwhal::Options::option('max_headers')->{max}, Narwhal::Limits::MAX_HEADERS_HARD(),
   '--max-headers bound from src/shared/nw_limits.h');
is(Narwhal::Options::option('max_header_bytes')->{max}, Narwhal::Limits::MAX_HEADER_BYTES_HARD(),
   '--max-header-bytes bound from the frame size');
is(Narwhal::Options::option('max_request_line')->{min}, Narwhal::Limits::MIN_REQUEST_LINE(),
   '--max-request-line bound from src/shared/nw_limits.h');
# A default src/shared/nw_limits.h has (NW_DEFAULT_<NAME>, which the C unit tests
# and the manager run alone use) is the table's, for every option.
for my $o (@table) {
    my $c = Narwhal::Limits->can('DEFAULT_' . uc $o->{name}) or next;
    is($o->{default}, $c->(), "--$o->{name}'s default is NW_DEFAULT_\U$o->{name}");
}

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
# (the descriptors the master passes are listed apart: they are no options)
my ($options_part) = split /^Descriptors from the master:/m, $musage;
my %takes = map { $_ => 1 } grep { $_ ne 'help' } $options_part =~ /^\s+--([a-z-]+)/mg;
# (with every option that has no default set: those are passed only when given)
my %passed = map { /^--(.+)/ ? ($1 => 1) : () }
    Narwhal::Options::manager_argv(Narwhal::Options::normalize(max_connections => 100,
                                                                error_log => "/var/log/e.log",
                                                                listen => ['127.0.0.1:8443:ssl'],
                                                                tls_cert => 'c.pem', tls_key => 'k.pem',
                                                                proxy_protocol => 1, proxy_from => ['10.0.0.0/8']));
is_deeply(\%passed, \%takes, 'the master passes the manager exactly the options the manager takes');
# ... and the values the master passes, at the defaults and at the table's
# bounds, are ones it accepts (--help last: it exits 0 once the rest parsed).
for my $args ({}, { max_request_line => Narwhal::Limits::MIN_REQUEST_LINE(),
                    max_header_bytes => Narwhal::Limits::MAX_HEADER_BYTES_HARD(),
                    max_connections => 1, read_timeout => 0.001,
                    keepalive_timeout => Narwhal::Limits::MAX_SECONDS() }) {
    my @argv = Narwhal::Options::manager_argv(Narwhal::Options::normalize(%$args));
    my $m = run_cmd([ "$ROOT/blib/arch/auto/Narwhal/narwhal-manager", @argv, '--help' ]);
    is($m->{code}, 0, "narwhal-manager accepts @argv") or diag $m->{err};
}

# A timeout the manager would refuse is refused by the table first (else
# the manager exits at start on a value narwhal accepted).
for my $o (grep { $_->{manager} && $_->{type} eq 'seconds' } @table) {
    my $v = Narwhal::Limits::MAX_SECONDS() + 1;
    ok(!eval { Narwhal::Options::normalize($o->{name} => $v); 1 }, "--$o->{manager} $v is refused by the table")
        and isnt(run_cmd([ "$ROOT/blib/arch/auto/Narwhal/narwhal-manager", "--$o->{manager}", $v, '--help' ])->{code},
                 0, "... as the manager refuses it");
}

# The manager takes as many --proxy-from as it is given (it reads them
# for its TLS listeners; the workers' list grows as well).
{
    my @from = map { "10.0.$_.0/24" } 1 .. 200;
    is(run_cmd([ "$ROOT/blib/arch/auto/Narwhal/narwhal-manager", (map { ('--proxy-from', $_) } @from), '--help' ])->{code},
       0, 'the manager takes 200 --proxy-from');
    isnt(run_cmd([ "$ROOT/blib/arch/auto/Narwhal/narwhal-manager", '--proxy-from', '10.0.0.0/99', '--help' ])->{code},
         0, '... and refuses one that is no CIDR');
}

# A handler argument Narwhal does not know is refused, never dropped silently.
{
    eval { Plack::Handler::Narwhal->new(foo => 1, max_wokers => 3, port => 5000, host => undef,
                                        listen => [':5000'], socket => undef, server_ready => sub {}) };
    like($@, qr/^narwhal: unknown options --foo, --max-wokers: Narwhal does not know them/,
         'Plack::Handler::Narwhal->new refuses the options it does not know, in one line naming them');
    is(scalar(() = $@ =~ /\n/g), 1, '... one line');
    eval { Plack::Handler::Narwhal->new(max_workers => 'x') };
    is($@, "narwhal: --max-workers wants a whole number, not 'x'\n", 'and dies in one line on a bad value');
    ok(eval { Plack::Handler::Narwhal->new(port => 5000, host => undef, listen => [':5000'], socket => undef,
                                           ssl => '', server_ready => sub {}) },
       "plackup's --disable-ssl (ssl => ''): plain HTTP, as it is");
}
is_deeply(Narwhal::Options::normalize(listen => ['/tmp/n.sock'], socket => ['/tmp/n.sock'])->{listen},
          ['/tmp/n.sock'], 'plackup -S PATH (listen and socket both PATH) is one listener');
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
my ($hard, $min_line, $frame) = (Narwhal::Limits::MAX_HEADERS_HARD(), Narwhal::Limits::MIN_REQUEST_LINE(),
                                 Narwhal::Limits::MAX_HEADER_BYTES_HARD());
for my $case ([ max_headers => $hard + 1, qr/^--max-headers must be at most $hard$/ ],
              [ max_request_line => $min_line - 1, qr/^--max-request-line must be at least $min_line$/ ],
              [ max_header_bytes => $frame + 1, qr/^--max-header-bytes must be at most $frame$/ ],
              [ timeout => 0, qr/^--timeout must be more than 0$/ ],
              [ read_timeout => Narwhal::Limits::MAX_SECONDS() + 1,
                qr/^--read-timeout must be at most ${\ Narwhal::Limits::MAX_SECONDS()}$/ ],
              [ max_workers => 'x', qr/^--max-workers wants a whole number, not 'x'$/ ]) {
    my ($k, $v, $re) = @$case;
    eval { Narwhal::Options::normalize($k => $v) };
    like($@, $re, "$k => $v is refused in one line");
}

done_testing;
