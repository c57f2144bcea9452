# The app of xt/env-fuzz.pl: /mutate?seed=N does random things to $env
# (plan: xt/EnvFuzzPlan.pm), /dump describes $env canonically plus checks
# on what earlier requests left behind. FUZZ_LOG: the DESTROY log file.
package EnvFuzzApp;
use strict;
use warnings;
no warnings 'once';
use B ();
use Scalar::Util qw(weaken blessed reftype refaddr dualvar);
use Hash::Util ();
use Tie::Array ();
use File::Basename ();
use lib File::Basename::dirname(__FILE__);
use EnvFuzzPlan ();

my $LOG = $ENV{FUZZ_LOG} // ($ENV{FUZZ_DIR} // '/tmp/narwhal-env-fuzz') . '/destroy.log';
our (%DEAD, %BORN_AT, %REPORTED, %SLOT_ID, %AV_ID, %ENV_ID, @WEAK, @WEAKENV, @KEEPV, @KEEPENV,
     @CYCLE, $GLOBAL_SV, %SNAP, $CUR_SEED, $NEXT_ID, @ERRORS);
$NEXT_ID = 0;
sub note_ { open my $f, '>>', $LOG or return; print $f "$_[0]\n"; close $f }
sub new_id { my $id = "$$-" . ($CUR_SEED // 'x') . '-' . ++$NEXT_ID; $BORN_AT{$id} = $CUR_SEED; return $id }
sub died { my ($id) = @_; return unless defined $id; $DEAD{$id} = 1; note_("D $id") }

package Tracked { sub new { bless { id => EnvFuzzApp::new_id() }, $_[0] } sub DESTROY { EnvFuzzApp::died($_[0]{id}) } }
package BlessedS { sub DESTROY { EnvFuzzApp::died(delete $EnvFuzzApp::SLOT_ID{ Scalar::Util::refaddr($_[0]) }) } }
package BlessedAV { sub DESTROY { EnvFuzzApp::died(delete $EnvFuzzApp::AV_ID{ Scalar::Util::refaddr($_[0]) }) } }
package BlessedEnv { sub DESTROY { EnvFuzzApp::died(delete $EnvFuzzApp::ENV_ID{ Scalar::Util::refaddr($_[0]) }) } }
package TiedS {
    sub TIESCALAR { my ($c, $v) = @_; bless { id => EnvFuzzApp::new_id(), v => $v }, $c }
    sub FETCH { $_[0]{v} } sub STORE { $_[0]{v} = $_[1] }
    sub DESTROY { EnvFuzzApp::died($_[0]{id}) }
}
package DieFetch { sub TIESCALAR { bless { id => EnvFuzzApp::new_id() }, shift } sub FETCH { die "fetch died\n" } sub STORE {}
    sub DESTROY { EnvFuzzApp::died($_[0]{id}) } }
package BodyObj { sub new { my $n = 0; bless { n => 0, id => EnvFuzzApp::new_id() }, shift }
    sub getline { $_[0]{n}++ < 2 ? "line$_[0]{n}\n" : undef } sub close {} sub DESTROY { EnvFuzzApp::died($_[0]{id}) } }

sub push_weak { my ($list, $r) = @_; push @$list, $r; weaken($list->[-1]) }

sub real_key {
    my ($k) = @_;
    return 'L' x 300 if $k eq 'LONG';
    if ($k =~ /^UTF8:(.*)/) { my $u = $1; utf8::upgrade($u); return $u }
    return $k;
}

sub make_value {
    my ($e, $kind, $n) = @_;
    return "fuzz-$n" if $kind eq 'str';
    return '' if $kind eq 'empty';
    return '0' if $kind eq 'zero';
    return 'y' x 2000 if $kind eq 'long';
    return 'x' x 70000 if $kind eq 'big' || $kind eq 'bigshrink';
    return 42 + $n if $kind eq 'iv';
    return 1.5 + $n if $kind eq 'nv';
    return ~0 if $kind eq 'uv';
    return -7 if $kind eq 'neg';
    return undef if $kind eq 'undef';
    return [ 1, $n ] if $kind eq 'aref';
    return { a => $n } if $kind eq 'href';
    return sub { $n } if $kind eq 'cref';
    return *STDOUT if $kind eq 'glob_out';
    return *STDERR if $kind eq 'glob_err';
    return \*STDOUT if $kind eq 'globref';
    return *{ $e->{'psgix.io'} } if $kind eq 'io_glob';
    return $e->{'psgix.io'} if $kind eq 'io_ref';
    return Tracked->new if $kind eq 'obj' || $kind eq 'weak_obj';
    return [ Tracked->new, $n ] if $kind eq 'obj2';
    return dualvar(5, 'five') if $kind eq 'dualvar';
    return !!1 if $kind eq 'true';
    return !!0 if $kind eq 'false';
    return "\x{263a}caf\x{e9}" if $kind eq 'utf8';
    if ($kind eq 'latin1up') { my $s = "caf\xe9"; utf8::upgrade($s); return $s }
    return v1.2.3 if $kind eq 'vstring';
    return qr/x$n/ if $kind eq 'qr';
    return ${ qr/y$n/ } if $kind eq 'regexp_sv';
    if ($kind =~ /^ref_other:(.*)/s) {
        my $k2 = real_key($1);
        my $r = \$e->{$k2};
        push_weak(\@CYCLE, $r);     # a possible cycle: a root for the leak check
        return $r;
    }
    if ($kind eq 'self') { push_weak(\@CYCLE, $e); return $e }
    if ($kind =~ /^cow_copy:(.*)/s) {
        my $k2 = real_key($1);
        # (not the template's own arrays: an op pushing into them would change every later request, fresh or not)
        return [ 1, 1 ] if grep { $_ eq $k2 } qw(psgi.version psgi.input);
        return $e->{$k2};
    }
    if ($kind eq 'numstr') { my $s = '42'; no warnings; my $x = $s + 0; return $s }
    return 9**9**9 / 9**9**9 if $kind eq 'nan';
    return 9**9**9 if $kind eq 'inf';
    return "?$kind";
}

sub set_value {
    my ($e, $k, $kind, $n) = @_;
    $e->{$k} = make_value($e, $kind, $n);
    weaken($e->{$k}) if $kind eq 'weak_obj' && ref $e->{$k};
    substr($e->{$k}, 2) = '' if $kind eq 'bigshrink';
}

sub run_ops {
    my ($e, $ops) = @_;
    for my $o (@$ops) {
        my $ok = eval { one_op($e, $o); 1 };
        die $@ if !$ok && $@ eq "deliberate\n";
        push @ERRORS, "$o->{op}: $@" if !$ok;
    }
}

sub one_op {
    my ($e, $o) = @_;
    my ($op, $k, $v, $n) = ($o->{op}, real_key($o->{key}), $o->{value}, $o->{n});
    no warnings;
    if    ($op eq 'set')        { set_value($e, $k, $v, $n) }
    elsif ($op eq 'delete')     { delete $e->{$k} }
    elsif ($op eq 'bless_slot') { my $r = \$e->{$k}; bless $r, 'BlessedS'; $SLOT_ID{ refaddr $r } //= new_id() }
    elsif ($op eq 'weaken_val') { weaken($e->{$k}) if ref $e->{$k} }
    elsif ($op eq 'weak_slot')  { push_weak(\@WEAK, \$e->{$k}) }
    elsif ($op eq 'keep_slot')  { push @KEEPV, \$e->{$k} }
    elsif ($op eq 'tie_slot')   { my $cur = $e->{$k}; tie $e->{$k}, 'TiedS', $cur }
    elsif ($op eq 'untie_slot') { untie $e->{$k} }
    elsif ($op eq 'readonly')   { Internals::SvREADONLY($e->{$k}, 1) }
    elsif ($op eq 'lock_value') { Hash::Util::lock_value(%$e, $k) }
    elsif ($op eq 'unlock_value') { Hash::Util::unlock_value(%$e, $k) }
    elsif ($op eq 'lock_keys_cycle') { Hash::Util::lock_keys_plus(%$e, $k); delete $e->{$k}; Hash::Util::unlock_keys(%$e) }
    elsif ($op eq 'lock_hash_leave') { Hash::Util::lock_hash(%$e) }
    elsif ($op eq 'lock_keys_leave') { Hash::Util::lock_keys(%$e) }
    elsif ($op eq 'upgrade')    { utf8::upgrade($e->{$k}) }
    elsif ($op eq 'decode')     { utf8::decode($e->{$k}) }
    elsif ($op eq 'encode')     { utf8::encode($e->{$k}) }
    # (a restore that croaks on a hash locked meanwhile leaks the hash in plain Perl too: a root then)
    elsif ($op eq 'local_nested') { local $e->{$k} = make_value($e, $v, $n); run_ops($e, $o->{sub}); push_weak(\@CYCLE, $e) if Internals::SvREADONLY(%$e) }
    elsif ($op eq 'delete_local_nested') { delete local $e->{$k}; run_ops($e, $o->{sub}); push_weak(\@CYCLE, $e) if Internals::SvREADONLY(%$e) }
    elsif ($op eq 'read_io')    { my $io = $e->{'psgix.io'}; my $fd = fileno($io) }
    elsif ($op eq 'io_into')    { my $io = $e->{'psgix.io'}; $e->{$k} = $n % 2 ? *$io : $io }
    elsif ($op eq 'push_cleanup') {
        my $kind = $o->{kind};
        my $h;
        if    ($kind eq 'noop')  { $h = sub { 1 } }
        elsif ($kind eq 'log')   { my $s = $CUR_SEED; $h = sub { note_("cleanup $s") } }
        elsif ($kind eq 'mutate') { my $sub = $o->{sub}; $h = sub { run_ops($_[0], $sub) } }
        elsif ($kind eq 'capture_env') { my $env = $e; push_weak(\@CYCLE, $e); $h = sub { $env } }
        elsif ($kind eq 'hold_obj') { my $obj = Tracked->new; $h = sub { $obj } }
        elsif ($kind eq 'die')   { $h = sub { die "cleanup die\n" } }
        push @{ $e->{'psgix.cleanup.handlers'} }, $h;
    }
    elsif ($op eq 'vivify_for') { for ($e->{$k}) {} }
    elsif ($op eq 'vivify_ref') { my $r = \$e->{$k} }
    elsif ($op eq 'vivify_defor') { $e->{$k} //= 'dflt' }
    elsif ($op eq 'each_partial') { my $i = 0; keys %$e; while (my ($kk) = each %$e) { last if ++$i > $n % 10 } }
    elsif ($op eq 'keys_prealloc') { keys(%$e) = 64 + $n * 10 }
    elsif ($op eq 'reassign_all') { %$e = %$e }
    elsif ($op eq 'copy_all')   { my %c = %$e }
    elsif ($op eq 'clear_all')  { %$e = () }
    elsif ($op eq 'undef_all')  { undef %$e }
    elsif ($op eq 'keep_env')   { push @KEEPENV, $e }
    elsif ($op eq 'weak_env')   { push_weak(\@WEAKENV, $e) }
    elsif ($op eq 'cycle_env')  { $e->{'my.self'} = $e; push_weak(\@CYCLE, $e) }
    elsif ($op eq 'bless_env')  { bless $e, 'BlessedEnv'; $ENV_ID{ refaddr $e } //= new_id() }
    elsif ($op eq 'pos_magic')  { my $x = $e->{$k} =~ /./g if defined $e->{$k} && !ref $e->{$k} }
    elsif ($op eq 'numify')     { my $x = $e->{$k} + 0 }
    elsif ($op eq 'stringify')  { my $x = "$e->{$k}" }
    elsif ($op eq 'substr_lv')  { substr($e->{$k}, 0, 1) = 'Z' if defined $e->{$k} && length $e->{$k} }
    elsif ($op eq 'append')     { $e->{$k} .= 'app' }
    elsif ($op eq 'chop_front') { $e->{$k} =~ s/^.//s if defined $e->{$k} }
    elsif ($op eq 'refalias') {
        use feature 'refaliasing'; no warnings 'experimental::refaliasing';
        if    ($n % 3 == 0) { \$e->{$k} = \$e->{PATH_INFO} }
        elsif ($n % 3 == 1) { \$e->{$k} = \my $x }
        else                { \$e->{$k} = \$GLOBAL_SV }
    }
    elsif ($op eq 'utf8_key_swap') { my $val = delete $e->{$k}; my $u = $k; utf8::upgrade($u); $e->{$u} = $val }
    elsif ($op eq 'many_keys')  { $e->{"many.$_"} = $_ for 1 .. 200 + $n * 3 }
    elsif ($op eq 'handlers_mess') {
        my $kind = $o->{kind};
        my $h = $e->{'psgix.cleanup.handlers'};
        if    ($kind eq 'readonly') { Internals::SvREADONLY(@$h, 1) }
        elsif ($kind eq 'bless')    { die "not a plain array\n" if ref $h ne 'ARRAY'; bless $h, 'BlessedAV'; $AV_ID{ refaddr $h } //= new_id() }
        elsif ($kind eq 'tie')      { tie @$h, 'Tie::StdArray' }
        elsif ($kind eq 'hashref')  { $e->{'psgix.cleanup.handlers'} = { a => Tracked->new } }
        elsif ($kind eq 'extend_shrink') { $#$h = 100_000; $#$h = -1 }
        elsif ($kind eq 'undef_elem') { push @$h, undef }
        elsif ($kind eq 'strref')   { $e->{'psgix.cleanup.handlers'} = \'x' }
    }
    elsif ($op eq 'length_utf8') { my $l = length $e->{$k} }
    elsif ($op eq 'die')        { die "deliberate\n" }
    elsif ($op eq 'drop_keeps') { @KEEPV = (); @KEEPENV = (); %SNAP = () }
    elsif ($op eq 'set_sv_alias') { for my $alias ($e->{$k}) { $alias = make_value($e, $v, $n) } }
    elsif ($op eq 'dualvar_flags') { $e->{$k} = dualvar(0, ''); my $x = $e->{$k} + 0.5 }
    elsif ($op eq 'tie_die')    { tie $e->{$k}, 'DieFetch' }
    elsif ($op eq 'tie_env')    { require Tie::Hash; my %copy = %$e; tie %$e, 'Tie::StdHash'; %$e = %copy; push_weak(\@CYCLE, $e) }   # (refaliasing into a tied hash leaks in plain Perl)
    elsif ($op eq 'shrink_big') { $e->{$k} = 'x' x 70000; substr($e->{$k}, 2) = '' }
}

# ---- description ----
my @FLAGS = (
    [ IOK => B::SVf_IOK ], [ NOK => B::SVf_NOK ], [ POK => B::SVf_POK ], [ ROK => B::SVf_ROK ],
    [ pIOK => B::SVp_IOK ], [ pNOK => B::SVp_NOK ], [ pPOK => B::SVp_POK ], [ UTF8 => B::SVf_UTF8 ],
    [ RO => B::SVf_READONLY ], [ PROTECT => B::SVf_PROTECT ], [ IsUV => B::SVf_IVisUV ],
    [ OBJ => B::SVs_OBJECT ], [ GMG => B::SVs_GMG ], [ SMG => B::SVs_SMG ], [ RMG => B::SVs_RMG ],
);
sub esc { my ($s) = @_; $s =~ s/([^\x20-\x7e])/sprintf '\\x{%x}', ord $1/ge; return $s }
sub sv_meta {
    my ($ref) = @_;
    my $b = B::svref_2object($ref);
    my $f = $b->FLAGS;
    my @m;
    if ($f & (B::SVs_GMG | B::SVs_SMG | B::SVs_RMG) && $b->can('MAGIC')) { push @m, $_->TYPE for $b->MAGIC }
    return ('flags=' . join(',', map { $f & $_->[1] ? $_->[0] : () } @FLAGS),
            'refcnt=' . ($b->REFCNT - 1), 'magic=' . join(',', @m), 'class=' . B::class($b));
}
sub describe_slot {
    my ($ref, $key, $kept) = @_;
    my ($flags, $refcnt, $magic, $class) = sv_meta($ref);
    my @d = ($flags, $kept ? () : $refcnt, $magic);
    push @d, 'blessed=' . (blessed($ref) // '');
    return ([ @d, 'psgix.io:not-read' ], $class)
        if (defined $key && $key eq 'psgix.io') || $magic =~ /~/;
    return ([ 'element of a tied hash' ], $class) if $kept && $magic =~ /p/;
    my $v = eval { $$ref };
    return ([ @d, 'FETCH died' ], $class) if $@;
    { no warnings; push @d, 'bool=' . (eval { builtin::is_bool($$ref) } ? 1 : 0) }
    if (ref \$v eq 'GLOB') {
        push @d, "glob=" . esc("$v") . ' fileno=' . (fileno($v) // 'undef');
    } elsif (!defined $v) {
        push @d, 'undef';
    } elsif (ref $v) {
        my $rt = reftype($v);
        my $tmpl = defined $key && grep { $_ eq $key } @EnvFuzzPlan::TEMPLATE;
        my $s = "ref=$rt blessed=" . (blessed($v) // '') . ' addr=' . ($tmpl ? refaddr($v) : '(per-request)');
        $s .= ' [' . join(',', map { defined $_ ? esc("$_") : 'undef' } @$v) . ']' if $rt eq 'ARRAY' && !blessed $v;
        $s .= ' obj=[' . join(',', map { defined $_ ? esc("$_") : 'undef' } @$v) . ']' if $rt eq 'ARRAY' && blessed($v) && blessed($v) eq 'Narwhal::Input';
        push @d, $s;
    } else {
        my $c = $v;
        push @d, "str=" . ($key && $key eq 'REMOTE_PORT' ? '(port)' : esc("$c"));
    }
    return (\@d, $class);
}
sub describe_env {
    my ($e, $types, $skip_io) = @_;
    my $b = B::svref_2object($e);
    my $each = 0;
    if (!$skip_io) { $each++ while defined(my $x = each %$e) }   # a half-way iterator shows here
    my @hidden = Hash::Util::hidden_ref_keys($e);
    my @l = ('ENV refcnt=' . ($skip_io ? '-' : $b->REFCNT) . ' flags=' . join(',', map { $b->FLAGS & $_->[1] ? $_->[0] : () } grep { $_->[0] =~ /^(?:RO|OBJ|GMG|SMG|RMG)$/ } @FLAGS)
             . ' tied=' . (tied(%$e) ? 1 : 0) . ' blessed=' . (blessed($e) // '') . ' count=' . scalar(keys %$e)
             . " each=$each hidden=[" . join(',', map { esc($_) } sort @hidden) . ']');
    for my $k (sort keys %$e) {
        next if $skip_io && $k eq 'psgix.io';
        my ($d, $class) = describe_slot(\$e->{$k}, $k, $skip_io);
        push @l, esc($k) . (utf8::is_utf8($k) ? ' (utf8 key)' : '') . ' => ' . join(' ', @$d);
        $types->{$k} = $class if $types;
    }
    return join "\n", @l;
}

# ---- reachability from what the app deliberately keeps ----
sub walk {
    my (@roots) = @_;
    my (%seen, %ids);
    my @todo = @roots;
    while (@todo) {
        my $r = shift @todo;
        next unless ref $r;
        my $a = refaddr $r;
        next if $seen{$a}++;
        my $rt = reftype $r;
        $ids{'#holders'}++ if $rt eq 'GLOB' || $rt eq 'IO';
        if ($rt eq 'SCALAR' || $rt eq 'REF' || $rt eq 'VSTRING' || $rt eq 'LVALUE') {
            my $b = B::svref_2object($r);
            $ids{'#holders'}++ if $b->FLAGS & (B::SVs_GMG | B::SVs_SMG | B::SVs_RMG) && $b->can('MAGIC') && grep { $_->TYPE eq '~' } $b->MAGIC;
            $ids{'#holders'}++ if B::class($b) eq 'GV';
        }
        if (my $cls = blessed $r) {
            $ids{ $r->{id} } = 1 if $cls eq 'Tracked' || $cls eq 'TiedS' || $cls eq 'BodyObj' || $cls eq 'DieFetch';
            $ids{ $SLOT_ID{$a} } = 1 if $SLOT_ID{$a};
            $ids{ $AV_ID{$a} } = 1 if $AV_ID{$a};
            $ids{ $ENV_ID{$a} } = 1 if $ENV_ID{$a};
        }
        if ($rt eq 'SCALAR' || $rt eq 'REF' || $rt eq 'VSTRING' || $rt eq 'LVALUE' || $rt eq 'GLOB') {
            my $b = B::svref_2object($r);
            if ($b->FLAGS & (B::SVs_GMG | B::SVs_SMG | B::SVs_RMG) && $b->can('MAGIC')) {
                # a tie's object, also on a glob-valued scalar ('q'); a kept element of
                # a tied hash or array ('p', \$h{k}) holds its aggregate's tie object
                for my $mg ($b->MAGIC) {
                    next unless $mg->TYPE eq 'q' || $mg->TYPE eq 'p';
                    my $o = eval { $mg->OBJ->object_2svref };
                    push @todo, $o if $o;
                }
            }
            push @todo, $b->RV->object_2svref if $b->FLAGS & B::SVf_ROK;
            if (B::class($b) eq 'GV' && $b->NAME !~ /::$/) {    # a glob's own scalar and array
                push @todo, grep { defined } map { *{$r}{$_} } qw(SCALAR ARRAY);
            }
        } elsif ($rt eq 'ARRAY') {
            push @todo, tied(@$r) if tied @$r;
            eval { push @todo, \$_ for @$r };
        } elsif ($rt eq 'HASH') {
            push @todo, tied(%$r) if tied %$r;
            eval { push @todo, \$r->{$_} for keys %$r };
        } elsif ($rt eq 'CODE') {
            my $cv = B::svref_2object($r);
            my $pl = eval { $cv->PADLIST } or next;
            next unless $pl->can('ARRAYelt');
            my $pad = $pl->ARRAYelt(1) or next;
            for my $sv (eval { $pad->ARRAY }) {
                next unless $sv && ref($sv) ne 'B::SPECIAL';
                my $o = eval { $sv->object_2svref } or next;
                push @todo, $o;
            }
        }
    }
    return (\%seen, \%ids);
}

sub roots { (\@KEEPV, \@KEEPENV, (grep { defined } @CYCLE), \$GLOBAL_SV) }

sub checks {
    my ($seen, $ids) = walk(roots());
    our $HOLDERS = $ids->{'#holders'} // 0;
    my @l;
    my @weak_alive = map { defined $_ && !$seen->{ refaddr $_ } ? 1 : () } @WEAK;
    { my @keep = grep { defined $_ && $seen->{ refaddr $_ } } @WEAK; @WEAK = (); push_weak(\@WEAK, $_) for @keep }
    push @l, 'CHECK weak slots alive (not kept): ' . scalar(@weak_alive);
    my $wenv = grep { defined $_ && !$seen->{ refaddr $_ } } @WEAKENV;
    { my @keep = grep { defined } @WEAKENV; @WEAKENV = (); push_weak(\@WEAKENV, $_) for @keep }
    push @l, "CHECK weak env alive (not kept): $wenv";
    my @leaked;
    for my $id (sort keys %BORN_AT) {
        next if $DEAD{$id} || $ids->{$id} || $REPORTED{$id};
        push @leaked, "$id(seed $BORN_AT{$id})";
        $REPORTED{$id} = 1;
    }
    our @NEWLY_DEAD = grep { $DEAD{$_} } keys %BORN_AT;
    delete @BORN_AT{@NEWLY_DEAD};
    delete @DEAD{ grep { !$BORN_AT{$_} } keys %DEAD };
    push @l, 'CHECK leaked objects: ' . join(',', @leaked);
    my @changed;
    for my $a (sort keys %SNAP) {
        my ($r, $snap) = @{ $SNAP{$a} };
        my $now = ref $r eq 'HASH' || reftype($r) eq 'HASH' ? describe_env($r, undef, 1) : join(' ', @{ (describe_slot($r, undef, 1))[0] });
        push @changed, "kept thing changed:\n--- was\n$snap\n--- now\n$now" if $now ne $snap;
        $SNAP{$a}[1] = $now;
    }
    push @l, 'CHECK kept changed: ' . join("\n", @changed);
    return @l;
}

sub snapshot {
    for my $r (@KEEPV) { $SNAP{ refaddr $r } ||= [ $r, join(' ', @{ (describe_slot($r, undef, 1))[0] }) ] }
    for my $r (@KEEPENV) { $SNAP{ refaddr $r } ||= [ $r, describe_env($r, undef, 1) ] }
}

my $count = 0;
sub {
    my $env = shift;
    my $path = $env->{PATH_INFO};
    if ($path =~ m{^/dump}) {
        my %types;
        my $d = describe_env($env, \%types);
        my @c = checks();
        my $t = join "\n", map { esc($_) . "=$types{$_}" } sort keys %types;
        return [ 200, [ 'Content-Type' => 'text/plain', 'X-Pid' => $$, 'X-Dead' => join(',', our @NEWLY_DEAD), 'X-Holders' => our $HOLDERS ], [ "$d\n" . join("\n", @c) . "\n==TYPES==\n$t\n" ] ];
    }
    if ($path =~ m{^/mutate}) {
        my ($seed) = $env->{QUERY_STRING} =~ /seed=(\d+)/;
        local $CUR_SEED = $seed;
        my $plan = EnvFuzzPlan::plan($seed);
        @ERRORS = ();
        run_ops($env, $plan->{ops});
        # snapshots of what is kept, once the cleanup handlers have run
        my $snapped = eval { push @{ $env->{'psgix.cleanup.handlers'} }, \&snapshot; 1 };
        snapshot() unless $snapped && ref $env->{'psgix.cleanup.handlers'} eq 'ARRAY';
        my @h = ('Content-Type' => 'text/plain', 'X-Pid' => $$, 'X-Errors' => scalar(@ERRORS));
        my $r = $plan->{resp};
        return [ 200, \@h, [ "ok $seed\n" ] ] if $r eq 'array';
        return [ 200, \@h, BodyObj->new ] if $r eq 'bodyobj';
        if ($r eq 'fh') { open my $fh, '<', \"fh body\n"; return [ 200, \@h, $fh ] }
        return sub { $_[0]->([ 200, \@h, [ "ok $seed\n" ] ]) } if $r eq 'stream3';
        return sub { my $w = $_[0]->([ 200, \@h ]); $w->write("ok "); $w->write("$seed\n"); $w->close };
    }
    if ($path =~ m{^/plan}) {    # POST a Data::Dumper plan (xt/env-fuzz-min.pl)
        my $in = $env->{"psgi.input"}; my $src = ""; while ($in->read(my $buf, 65536)) { $src .= $buf }
        my $plan = eval "no strict; $src" or return [500, [], ["bad plan: $@"]];
        local $CUR_SEED = "plan"; @ERRORS = ();
        run_ops($env, $plan);
        my $snapped = eval { push @{ $env->{"psgix.cleanup.handlers"} }, \&snapshot; 1 };
        snapshot() unless $snapped && ref $env->{"psgix.cleanup.handlers"} eq "ARRAY";
        return [200, ["X-Errors" => scalar @ERRORS], ["plan done: @ERRORS\n"]];
    }
    if ($path =~ m{^/ops}) {    # /ops?op:key:value:n,op:key... (for minimising a plan by hand)
        my ($q) = $env->{QUERY_STRING} =~ /^(.*)$/; local $CUR_SEED = "ops"; @ERRORS = ();
        my @ops = map { my ($op, $k, $v, $n, $kind) = split /:/; $k =~ s/%(..)/chr hex $1/ge if defined $k; +{ op => $op, key => $k // "", value => $v // "str", n => $n // 0, kind => $kind, sub => [] } } split /,/, $q;
        run_ops($env, \@ops);
        return [200, ["X-Errors" => scalar @ERRORS], ["ops done: @ERRORS\n"]];
    }
    if ($path =~ m{^/debug}) { my $ok = open(my $f, ">>", $LOG) ? "ok" : "fail $!"; return [200, [], ["log=$LOG open=$ok dead=" . join(",", sort keys %DEAD) . " slot=" . join(",", %SLOT_ID) . "\n"]] }
    if ($path =~ m{^/drop}) { @KEEPV = (); @KEEPENV = (); %SNAP = (); @CYCLE = (); return [ 200, [], ['dropped'] ] }
    return [ 404, [], ['?'] ];
};
