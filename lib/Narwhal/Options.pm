package Narwhal::Options;
use strict;
use warnings;

# One table of options drives the command line, the Plack handler's
# arguments, defaults and validation. Keys are snake_case; the command line
# takes the same words in kebab-case.

use constant DEFAULTS => {
    max_workers        => 4,
    max_reqs_per_child => 10000,
    min_reqs_per_child => undef,
    spawn_interval     => 0,
    timeout            => 300,
    read_timeout       => 60,
    keepalive_timeout  => 5,
    max_keepalive_reqs => 1000,
    disable_keepalive  => 0,
    backlog            => 1024,
    preload_app        => 1,
    graceful_timeout   => 30,
    max_request_body   => 0,
    body_in_memory     => 1024 * 1024,
    max_request_line   => 8192,
    max_header_bytes   => 65536,
    max_headers        => 100,
    manager            => 1,
    max_connections    => 10000,
    keepalive_wait     => 0.05,
    worker_quantum     => 5,
};

# name => [ Getopt::Long type and aliases, validation kind ]
use constant SPEC => {
    listen             => [ 'listen|l=s@',                   'list' ],
    host               => [ 'host|o=s',                      'string' ],
    port               => [ 'port|p=s',                      'port' ],
    socket             => [ 'socket|S=s@',                   'list' ],
    max_workers        => [ 'max-workers|workers=s',         'count' ],
    max_reqs_per_child => [ 'max-reqs-per-child|max-requests=s', 'count' ],
    min_reqs_per_child => [ 'min-reqs-per-child=s',          'count' ],
    spawn_interval     => [ 'spawn-interval=s',              'seconds' ],
    timeout            => [ 'timeout=s',                     'seconds' ],
    read_timeout       => [ 'read-timeout=s',                'seconds' ],
    keepalive_timeout  => [ 'keepalive-timeout=s',           'seconds' ],
    max_keepalive_reqs => [ 'max-keepalive-reqs=s',          'count' ],
    disable_keepalive  => [ 'disable-keepalive!',            'bool' ],
    backlog            => [ 'backlog=s',                     'count' ],
    preload_app        => [ 'preload-app!',                  'bool' ],
    loader             => [ 'loader|L=s',                    'string' ],
    child_exit         => [ 'child-exit=s',                  'code' ],
    graceful_timeout   => [ 'graceful-timeout=s',            'seconds' ],
    pid                => [ 'pid|pid-file=s',                'string' ],
    error_log          => [ 'error-log=s',                   'string' ],
    user               => [ 'user=s',                        'string' ],
    group              => [ 'group=s',                       'string' ],
    max_request_body   => [ 'max-request-body=s',            'size' ],
    body_in_memory     => [ 'body-in-memory=s',              'size' ],
    max_request_line   => [ 'max-request-line=s',            'size' ],
    max_header_bytes   => [ 'max-header-bytes=s',            'size' ],
    max_headers        => [ 'max-headers=s',                 'count' ],
    manager            => [ 'manager!',                      'bool' ],
    max_connections    => [ 'max-connections=s',             'count' ],
    keepalive_wait     => [ 'keepalive-wait=s',              'seconds' ],
    worker_quantum     => [ 'worker-quantum=s',              'count' ],
};

use constant ALIASES => {
    workers       => 'max_workers',
    max_requests  => 'max_reqs_per_child',
    pid_file      => 'pid',
    keepalive     => undef,    # accepted from plackup configs, see normalize
};

my %CHECK = (
    list    => sub { 1 },
    string  => sub { defined $_[0] && length $_[0] },
    code    => sub { ref $_[0] eq 'CODE' || (defined $_[0] && length $_[0]) },
    bool    => sub { 1 },
    port    => sub { defined $_[0] && $_[0] =~ /^\d+$/ && $_[0] <= 65535 },
    count   => sub { defined $_[0] && $_[0] =~ /^\d+$/ },
    size    => sub { defined $_[0] && $_[0] =~ /^\d+$/ },
    seconds => sub { defined $_[0] && $_[0] =~ /^(?:\d+(?:\.\d*)?|\.\d+)$/ },
);

my %WANT = (
    port => 'a port number (0-65535)', count => 'a whole number',
    size => 'a number of bytes', seconds => 'a number of seconds',
    string => 'a value', code => 'Perl code',
);

# Getopt::Long specs for the command line.
sub getopt_specs {
    my $spec = SPEC;
    return map { $spec->{$_}[0] } sort keys %$spec;
}

# The first (long) name of an option, kebab-case, for messages.
sub cli_name {
    my ($key) = @_;
    my $s = SPEC->{$key} or return $key;
    my ($name) = $s->[0] =~ /^([\w-]+)/;
    return "--$name";
}

# Turn handler arguments or parsed command-line values into the canonical
# hash: aliases resolved, kebab-case folded, defaults filled, values checked.
# Dies with a one-line message on a bad value.
sub normalize {
    my (%args) = @_;
    my %o;
    for my $k (keys %args) {
        my $key = $k;
        $key =~ tr/-/_/;
        $key = ALIASES->{$key} if exists ALIASES->{$key};
        next unless defined $key;
        $o{$key} = $args{$k};
    }
    _apply_loader(\%o);
    for my $key (keys %o) {
        my $s = SPEC->{$key} or next;
        next if !defined $o{$key} && $s->[1] ne 'string';
        next if !defined $o{$key};
        $CHECK{ $s->[1] }->($o{$key})
            or die cli_name($key) . " wants $WANT{$s->[1]}, not '$o{$key}'\n";
    }
    my $d = DEFAULTS;
    exists $o{$_} && defined $o{$_} or $o{$_} = $d->{$_} for keys %$d;
    _check_relations(\%o);
    $o{listen} = [ @{ $o{listen} || [] }, @{ delete $o{socket} || [] } ];
    $o{child_exit} = _compile_code($o{child_exit}) if defined $o{child_exit};
    return \%o;
}

sub _apply_loader {
    my ($o) = @_;
    my $loader = delete $o->{loader};
    return unless defined $loader;
    if ($loader eq 'Delayed') {
        $o->{preload_app} = 0;
    } elsif ($loader ne 'Plack::Loader' && $loader ne 'Default') {
        die "loader '$loader' is not supported (use Delayed, or --no-preload-app)\n";
    }
}

sub _check_relations {
    my ($o) = @_;
    die "--max-workers must be at least 1\n" if $o->{max_workers} < 1;
    die "--max-headers must be between 1 and 1024\n"
        if $o->{max_headers} < 1 || $o->{max_headers} > 1024;
    die "--max-request-line must be at least 64\n" if $o->{max_request_line} < 64;
    die "--max-header-bytes must be at most 131072\n" if $o->{max_header_bytes} > 131072;
    die "--max-connections must be at least 1\n" if $o->{max_connections} < 1;
    die "--worker-quantum must be at least 1\n" if $o->{worker_quantum} < 1;
    die "--keepalive-wait must be 0 or more\n" if $o->{keepalive_wait} < 0;
    die "--max-header-bytes must be at least --max-request-line\n"
        if $o->{max_header_bytes} < $o->{max_request_line};
    die "--min-reqs-per-child must not exceed --max-reqs-per-child\n"
        if defined $o->{min_reqs_per_child} && $o->{max_reqs_per_child}
        && $o->{min_reqs_per_child} > $o->{max_reqs_per_child};
    for my $t (qw(timeout read_timeout keepalive_timeout)) {
        die cli_name($t) . " must be more than 0\n" unless $o->{$t} > 0;
    }
}

sub _compile_code {
    my ($code) = @_;
    return $code if ref $code eq 'CODE';
    my $sub = eval $code;    ## no critic (ProhibitStringyEval)
    die "--child-exit does not compile: " . ($@ =~ s/\n.*//sr) . "\n" if $@;
    die "--child-exit must be a sub { ... }\n" unless ref $sub eq 'CODE';
    return $sub;
}

1;
__END__

=head1 NAME

Narwhal::Options - option names, defaults and checks for Narwhal

=head1 DESCRIPTION

The single table behind the C<narwhal> command line and
C<< Plack::Handler::Narwhal->new(%options) >>. See L<Narwhal/OPTIONS>.

=cut
