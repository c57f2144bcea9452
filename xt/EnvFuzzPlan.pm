package EnvFuzzPlan;
use strict;
use warnings;

# The random plan of one /mutate?seed=N request: a pure function of N, shared
# by the app (which performs it) and the client (which prints it and knows
# whether a deliberate 500 is coming). Plain data only.

our @TEMPLATE = qw(SCRIPT_NAME SERVER_NAME SERVER_PORT psgi.version psgi.url_scheme
    psgi.errors psgi.input psgi.multithread psgi.multiprocess psgi.run_once
    psgi.nonblocking psgi.streaming psgix.input.buffered psgix.harakiri psgix.cleanup
    psgix.informational);
our @FIXED = qw(REQUEST_METHOD REQUEST_URI PATH_INFO QUERY_STRING SERVER_PROTOCOL
    REMOTE_ADDR REMOTE_PORT psgix.cleanup.handlers psgix.io);
our @HEADER = qw(HTTP_HOST HTTP_X_FIXED_A HTTP_X_FIXED_B CONTENT_TYPE CONTENT_LENGTH
    HTTP_X_FUZZ_1 HTTP_X_FUZZ_2 HTTP_TRANSFER_ENCODING HTTP_X_DUP);
our @NEW = ('my.key', 'app.stuff', 'HTTP_X_APP', 'HTTP_', 'http_x_fixed_a', "\xe9key",
    "U\x{263a}key", 'UTF8:REQUEST_URI', 'UTF8:HTTP_X_FIXED_A', 'LONG', 'CONTENT_LENGTH',
    'HTTP_X_FUZZ_3');

our @VALUES = qw(str empty zero long big bigshrink iv nv uv neg undef aref href cref
    glob_out glob_err globref io_glob io_ref obj obj2 dualvar true false utf8 latin1up
    vstring qr regexp_sv ref_other self cow_copy weak_obj numstr nan inf);

our @OPS = (
    [ set => 30 ], [ delete => 8 ], [ bless_slot => 4 ], [ weaken_val => 3 ],
    [ weak_slot => 4 ], [ keep_slot => 3 ], [ tie_slot => 3 ], [ untie_slot => 1 ],
    [ readonly => 3 ], [ lock_value => 2 ], [ unlock_value => 1 ], [ lock_keys_cycle => 2 ],
    [ lock_hash_leave => 1 ], [ lock_keys_leave => 1 ], [ upgrade => 3 ], [ decode => 2 ],
    [ encode => 2 ], [ local_nested => 4 ], [ delete_local_nested => 2 ], [ read_io => 3 ],
    [ io_into => 2 ], [ push_cleanup => 5 ], [ vivify_for => 2 ], [ vivify_ref => 2 ],
    [ vivify_defor => 1 ], [ each_partial => 2 ], [ keys_prealloc => 1 ], [ reassign_all => 1 ],
    [ copy_all => 1 ], [ clear_all => 1 ], [ undef_all => 1 ], [ keep_env => 1 ],
    [ weak_env => 1 ], [ cycle_env => 1 ], [ bless_env => 1 ], [ pos_magic => 2 ],
    [ numify => 3 ], [ stringify => 2 ], [ substr_lv => 2 ], [ append => 2 ], [ chop_front => 2 ],
    [ refalias => 2 ], [ utf8_key_swap => 2 ], [ many_keys => 1 ], [ handlers_mess => 2 ],
    [ length_utf8 => 2 ], [ die => 1 ], [ drop_keeps => 1 ], [ set_sv_alias => 1 ],
    [ dualvar_flags => 1 ], [ shrink_big => 1 ], [ tie_die => 1 ], [ tie_env => 1 ],
);
my $OPS_TOTAL = 0;
$OPS_TOTAL += $_->[1] for @OPS;

sub rng {
    my ($seed) = @_;
    my $s = ($seed * 2654435761 + 12345) % 2147483647 || 1;
    return sub {
        my ($n) = @_;
        $s = ($s * 48271) % 2147483647;
        return $s % $n;
    };
}

sub pick_key {
    my ($r) = @_;
    my $c = $r->(10);
    my $set = $c < 3 ? \@TEMPLATE : $c < 6 ? \@FIXED : $c < 8 ? \@HEADER : \@NEW;
    return $set->[ $r->(scalar @$set) ];
}

sub pick_value { my ($r) = @_; my $v = $VALUES[ $r->(scalar @VALUES) ]; return $v eq 'ref_other' || $v eq 'cow_copy' ? "$v:" . pick_key($r) : $v }

sub pick_op {
    my ($r) = @_;
    my $x = $r->($OPS_TOTAL);
    for (@OPS) { return $_->[0] if ($x -= $_->[1]) < 0 }
    return 'set';
}

sub ops {
    my ($r, $n, $depth) = @_;
    my @ops;
    for (1 .. $n) {
        my $op = pick_op($r);
        $op = 'set' if $depth && $op =~ /^(?:die|drop_keeps)$/;
        my $o = { op => $op, key => pick_key($r), value => pick_value($r), n => $r->(40) };
        if ($op =~ /^(?:local_nested|delete_local_nested)$/) {
            $o->{sub} = $depth < 2 ? ops($r, 1 + $r->(3), $depth + 1) : [];
        } elsif ($op eq 'push_cleanup') {
            $o->{kind} = (qw(noop log mutate capture_env hold_obj die))[ $r->(6) ];
            $o->{sub} = $o->{kind} eq 'mutate' && $depth < 2 ? ops($r, 1 + $r->(3), $depth + 1) : [];
        } elsif ($op eq 'handlers_mess') {
            $o->{kind} = (qw(readonly bless tie hashref extend_shrink undef_elem strref))[ $r->(7) ];
        }
        push @ops, $o;
    }
    return \@ops;
}

sub plan {
    my ($seed) = @_;
    my $r = rng($seed);
    my $ops = ops($r, 1 + $r->(10), 0);
    my $resp = (qw(array array array stream3 stream2 bodyobj fh))[ $r->(7) ];
    my $dies = grep { $_->{op} eq 'die' } @$ops;
    return { seed => $seed, ops => $ops, resp => $resp, dies => $dies ? 1 : 0 };
}

sub describe_ops {
    my ($ops, $indent) = @_;
    $indent //= '';
    my @l;
    for my $o (@$ops) {
        my $k = $o->{key}; $k =~ s/([^\x20-\x7e])/sprintf '\\x{%x}', ord $1/ge;
        my $v = $o->{value}; $v =~ s/([^\x20-\x7e])/sprintf '\\x{%x}', ord $1/ge;
        my $s = "$indent$o->{op}(key=$k, value=$v, n=$o->{n}" . ($o->{kind} ? ", kind=$o->{kind}" : '') . ')';
        push @l, $s;
        push @l, describe_ops($o->{sub}, "$indent    ") if $o->{sub} && @{ $o->{sub} };
    }
    return @l;
}

1;
