package Narwhal::Listener;
use strict;
use warnings;
use Carp ();
use IO::Socket::IP;
use IO::Socket::UNIX;
use Narwhal ();
use Socket qw(IPPROTO_TCP TCP_NODELAY SOL_SOCKET SOCK_STREAM AF_INET AF_INET6
              AF_UNIX SO_TYPE sockaddr_family unpack_sockaddr_in
              unpack_sockaddr_in6 unpack_sockaddr_un inet_ntop);

# Where the server listens when no --listen, --host or --port says
# (Narwhal::Options writes it into the help; --backlog's default is there).
use constant DEFAULT_HOST    => '0.0.0.0';
use constant DEFAULT_PORT    => 5000;
use constant DEFER_ACCEPT_SECONDS => 1;
# --backlog's default: the kernel's net.core.somaxconn (the cap listen()
# applies anyway), and never less than this.
use constant MIN_DEFAULT_BACKLOG => 1024;
# What a TLS option Narwhal does not take is told: refused, never ignored
# (a client certificate asked for and not checked would be worse than none).
use constant TLS_ONLY => 'Narwhal\'s TLS takes a certificate chain and its key (--tls-cert, '
    . '--tls-key) and nothing else: no client certificates, no other TLS settings';
use constant SOMAXCONN_FILE => '/proc/sys/net/core/somaxconn';

# A listener is a hash: { fd, is_tcp, host, port, path, handle, spec },
# sibling => 1 on a TCP address's second and later sockets, and tls => 1
# on a TLS listener (HOST:PORT:ssl, or every TCP one with --enable-ssl):
# the connection manager's alone, which relays its connections to the
# workers (docs/DESIGN.md, "HTTPS").
# The master opens them (or inherits them from Server::Starter or systemd)
# before forking; workers only see the fds.

# Parse one --listen value: "host:port", ":port", "port", "[v6]:port",
# "/path/to.sock" or "unix:/path", and a TCP one with ":ssl" after it
# (Starman's form: a TLS listener). Dies with a one-line message.
sub parse_spec {
    my ($spec) = @_;
    die "empty --listen value\n" unless defined $spec && length $spec;
    if ($spec =~ /^(.+):(?:ssl|tls|https)$/i) {
        my $plain = parse_spec($1);
        die "--listen '$spec': TLS listeners are TCP ones (HOST:PORT:ssl), not unix sockets\n"
            if $plain->{path};
        return { %$plain, tls => 1 };
    }
    return { path => $1 } if $spec =~ m{^unix:(.+)$};
    return { path => $spec } if $spec =~ m{/};
    # (Starman's rule: no colon is a unix socket; digits alone are a port)
    return { path => $spec } if $spec !~ /[:\[\]]/ && $spec !~ /^\d+$/;
    if ($spec =~ /^\[([0-9A-Fa-f:.]+)\]:(\d+)$/) {
        return { host => $1, port => _port($2, $spec) };
    }
    if ($spec =~ /^(?:([^:\[\]]*):)?(\d+)$/) {
        my $host = defined $1 && length $1 ? $1 : DEFAULT_HOST;
        return { host => $host, port => _port($2, $spec) };
    }
    die "cannot parse --listen '$spec' (want host:port, :port, [::1]:port or /path/to.sock)\n";
}

sub _port {
    my ($port, $spec) = @_;
    die "port out of range in '$spec'\n" if $port < 0 || $port > 65535;
    return $port + 0;
}

# All listeners for the options: inherited ones win over --listen. A TCP
# address this server binds is $queues sockets (default 1): listen_queues.
sub open_all {
    my ($opts, $queues) = @_;
    my @inherited = inherited();
    if (@inherited) {
        Narwhal::log_line(warn => "--listen-queues does not apply to sockets from Server::Starter "
                                  . "or systemd: each stays one queue")
            if defined $opts->{listen_queues};
        $_->{tls} = 1 for grep { $opts->{enable_ssl} && $_->{is_tcp} } @inherited;
        return @inherited;
    }
    my @specs = @{ $opts->{listen} || [] };
    @specs = (($opts->{host} // DEFAULT_HOST) . ':' . ($opts->{port} // DEFAULT_PORT))
        unless @specs;
    my @parsed = map { parse_spec($_) } @specs;
    $_->{tls} ||= $opts->{enable_ssl} for @parsed;
    die "--enable-ssl: TLS listeners are TCP ones, and unix:$_->{path} is a unix socket\n"
        for grep { $_->{tls} && $_->{path} } @parsed;
    $queues = listen_queues(\@parsed, $queues // 1, defined $opts->{listen_queues});
    return map { open_address($_, $opts, $queues) } @parsed;
}

# Whether the options ask for a TLS listener.
sub wants_tls {
    my ($opts) = @_;
    return 1 if $opts->{enable_ssl};
    return scalar grep { /:(?:ssl|tls|https)$/i } @{ $opts->{listen} || [] };
}

# Sockets per TCP address: the count asked for, fewer by default when the
# addresses would pass what a worker can watch (NW_MAX_LISTENERS); asked
# for explicitly, that is a one-line error.
sub listen_queues {
    my ($parsed, $queues, $explicit) = @_;
    my $max = Narwhal::Limits::MAX_LISTENERS();
    my $tcp = grep { !$_->{path} } @$parsed;
    my $unix = @$parsed - $tcp;
    my $room = $tcp ? int(($max - $unix) / $tcp) : $queues;
    die "--listen: " . @$parsed . " addresses are more than the $max listeners a worker watches\n"
        if $unix + $tcp > $max;
    die "--listen-queues $queues: $tcp TCP addresses with $queues sockets each and $unix unix "
        . "sockets are more than the $max listeners a worker watches\n"
        if $explicit && $queues > $room;
    return $queues < $room ? $queues : $room;
}

# One address: a unix socket, or a TCP address as $queues sockets on one
# port with SO_REUSEPORT, each with its own accept queue (DESIGN.md, "Listen
# queues"); all but the first are marked as its siblings. Unless
# --reuse-port asks to share the port, the first is bound without
# SO_REUSEPORT, so that a port something listens on is refused, and gets it
# only then, for its siblings: in one bind, which a second server starting
# at the same instant cannot slip between (a probe bound and closed first
# could be, and both would share the port).
sub open_address {
    my ($spec, $opts, $queues) = @_;
    return open_one($spec, $opts) if $spec->{path} || $queues <= 1;
    my $first = open_one($spec, { %$opts, reuse_port => $opts->{reuse_port} ? 1 : 'after_bind' });
    my $shared = { %$opts, reuse_port => 1 };
    my @siblings = map { open_one({ %$spec, port => $first->{port} }, $shared) } 2 .. $queues;
    $_->{sibling} = 1 for @siblings;
    return ($first, @siblings);
}

# The addresses, once each (a TCP address's sibling queues are not named).
sub addresses {
    my (@listeners) = @_;
    return map { describe($_) } grep { !$_->{sibling} } @listeners;
}

# The listen queue length when --backlog is not given.
sub default_backlog {
    my $somaxconn = 0;
    if (open my $fh, '<', SOMAXCONN_FILE) {
        ($somaxconn) = (<$fh> // '') =~ /^(\d+)/;
    }
    return ($somaxconn // 0) > MIN_DEFAULT_BACKLOG ? $somaxconn + 0 : MIN_DEFAULT_BACKLOG;
}

# The same listener, however it was spelled: ":5000" and "0.0.0.0:5000",
# "unix:/p" and "/p". (Different addresses stay different: "localhost"
# and "127.0.0.1" are two names.)
sub canonical {
    my ($text) = @_;
    my $spec = parse_spec($text);
    return $spec->{path} ? "unix:$spec->{path}"
                         : lc($spec->{host}) . ":$spec->{port}" . ($spec->{tls} ? ':ssl' : '');
}

# reuse_port in $opts: SO_REUSEPORT before the bind (1: join whoever
# listens on the port with it), or 'after_bind' (bound alone, then open to
# this server's further sockets: open_address).
sub open_one {
    my ($spec, $opts) = @_;
    my $backlog = $opts->{backlog} // default_backlog();
    return _open_unix($spec, $backlog, $opts) if $spec->{path};
    return { %{ open_one({ %$spec, tls => 0 }, $opts) }, tls => 1 } if $spec->{tls};
    my $late = ($opts->{reuse_port} // '') eq 'after_bind';
    my $sock = IO::Socket::IP->new(
        LocalHost => $spec->{host}, LocalPort => $spec->{port},
        ($late ? (Type => SOCK_STREAM) : (Listen => $backlog)), ReuseAddr => 1, Proto => 'tcp',
        ($opts->{reuse_port} && !$late ? (ReusePort => 1) : ()),
        ($spec->{host} =~ /:/ ? (V6Only => 1) : ()),
    ) or die "cannot listen on $spec->{host}:$spec->{port}: $@\n";
    if ($late) {
        setsockopt($sock, SOL_SOCKET, Socket::SO_REUSEPORT(), 1) && listen($sock, $backlog)
            or die "cannot listen on $spec->{host}:$spec->{port}: $!\n";
    }
    return _tcp_listener($sock, "$spec->{host}:$spec->{port}");
}

# A unix socket gets its mode and group (--socket-mode, --socket-group)
# between bind and listen: the file is made under a umask that lets nobody
# else in, changed, and only then does listen make it connectable.
sub _open_unix {
    my ($spec, $backlog, $opts) = @_;
    my $path = $spec->{path};
    if (-S $path) {
        my $probe = IO::Socket::UNIX->new(Peer => $path, Type => SOCK_STREAM);
        die "cannot listen on $path: another server is listening there\n" if $probe;
        unlink $path;
    }
    my $sock = IO::Socket::UNIX->new(Type => SOCK_STREAM)
        or die "cannot listen on $path: $!\n";
    my $old = umask(0177);
    my $bound = bind($sock, Socket::pack_sockaddr_un($path));
    my $err = $!;
    umask($old);
    die "cannot listen on $path: $err\n" unless $bound;
    _socket_permissions($path, $opts, $old);
    listen($sock, $backlog) or die "cannot listen on $path: $!\n";
    return { fd => fileno($sock), is_tcp => 0, path => $path, handle => $sock,
             spec => $path, owned_path => _file_id($path) };
}

# The file a path names now, as "device:inode" (undef when there is none):
# a server removes its socket file at exit only while the path still names
# the file it bound, not one a server started after it has made there.
sub _file_id {
    my @st = stat shift;
    return @st ? "$st[0]:$st[1]" : undef;
}

sub remove_owned_path {
    my $l = shift;
    return unless $l->{owned_path};
    my $now = _file_id($l->{path});
    unlink $l->{path} if defined $now && $now eq $l->{owned_path};
}

sub _socket_permissions {
    my ($path, $opts, $umask) = @_;
    my $mode = defined $opts->{socket_mode} ? oct($opts->{socket_mode}) : 0777 & ~$umask;
    chmod($mode, $path) or die "cannot set the mode of $path: $!\n";
    return unless defined $opts->{socket_group};
    my $gid = $opts->{socket_group} =~ /^\d+$/ ? $opts->{socket_group} : getgrnam($opts->{socket_group});
    die "--socket-group: no group '$opts->{socket_group}'\n" unless defined $gid;
    chown(-1, $gid, $path) or die "cannot give $path to group $opts->{socket_group}: $!\n";
}

sub _tcp_listener {
    my ($sock, $spec) = @_;
    tune_tcp($sock);
    my ($host, $port) = _sock_host_port($sock);
    return { fd => fileno($sock), is_tcp => 1, host => $host, port => $port,
             handle => $sock, spec => $spec };
}

# TCP_DEFER_ACCEPT: a worker is woken only when the request has arrived.
# SO_TIMESTAMPNS: the kernel stamps what arrives with its receive time, so
# that a request's wait in the listen queue or parked in a busy worker is
# in narwhal_request_queue_seconds (accepted sockets inherit both).
sub tune_tcp {
    my ($sock) = @_;
    setsockopt($sock, IPPROTO_TCP, TCP_NODELAY, 1);
    if ($^O eq 'linux') {
        setsockopt($sock, IPPROTO_TCP, Socket::TCP_DEFER_ACCEPT(), DEFER_ACCEPT_SECONDS);
        stamp_arrivals(fileno $sock);
    }
}

sub _sock_host_port {
    my ($sock) = @_;
    my $name = getsockname($sock) or return;
    my $family = sockaddr_family($name);
    if ($family == AF_INET) {
        my ($port, $addr) = unpack_sockaddr_in($name);
        return (inet_ntop(AF_INET, $addr), $port);
    }
    if ($family == AF_INET6) {
        my ($port, $addr) = unpack_sockaddr_in6($name);
        return (inet_ntop(AF_INET6, $addr), $port);
    }
    return;
}

# Sockets handed down by Server::Starter (SERVER_STARTER_PORT) or systemd
# (LISTEN_FDS / LISTEN_PID).
sub inherited {
    if (defined(my $ports = $ENV{SERVER_STARTER_PORT})) {
        return map { _from_starter($_) } grep { length } split /;/, $ports;
    }
    if (defined $ENV{LISTEN_FDS} && defined $ENV{LISTEN_PID} && $ENV{LISTEN_PID} == $$) {
        my $n = $ENV{LISTEN_FDS};
        die "bad LISTEN_FDS '$n'\n" unless $n =~ /^\d+$/ && $n > 0;
        delete @ENV{qw(LISTEN_FDS LISTEN_PID LISTEN_FDNAMES)};
        return map { from_fd($_, "systemd fd $_") } 3 .. 3 + $n - 1;
    }
    return;
}

sub _from_starter {
    my ($item) = @_;
    my ($addr, $fd) = $item =~ /^(.+)=(\d+)$/
        or die "bad SERVER_STARTER_PORT entry '$item'\n";
    return from_fd($fd, $addr);
}

sub from_fd {
    my ($fd, $label) = @_;
    open(my $fh, '+<&=', $fd) or die "cannot use inherited socket $label (fd $fd): $!\n";
    bless $fh, 'IO::Socket';
    my $name = getsockname($fh) or die "inherited fd $fd ($label) is not a socket\n";
    if (sockaddr_family($name) == AF_UNIX) {
        my $path = unpack_sockaddr_un($name);
        return { fd => $fd, is_tcp => 0, path => $path, handle => $fh, spec => $label,
                 inherited => 1 };
    }
    return { %{ _tcp_listener($fh, $label) }, inherited => 1 };
}

# On a stop: a listener this server opened takes no new connection from
# now on, while its workers accept what is queued (the C side's
# nw_io_refuse_new_connections: TCP drops new SYNs, a unix socket refuses
# connect). An inherited one is left alone: it lives on for the next
# instance, with its queue. Returns 1, or 0 with $!. Where the kernel
# refuses socket filters to an unprivileged process, a TCP listener's
# queue is shortened instead: said once, since a client arriving in the
# stop's last instant may then be reset.
my $said_shortened;
sub refuse_new {
    my ($l) = @_;
    return 1 if $l->{inherited} || !$l->{handle};
    my $how = refuse_new_connections(fileno $l->{handle});
    Narwhal::log_line(warn => "this kernel refuses socket filters to this user: on "
                              . describe($l) . " the listen queue was shortened instead, and a "
                              . "client that connects in the stop's last instant may be reset "
                              . "(perldoc Narwhal, SIGNALS)")
        if $how == 1 && !$said_shortened++;
    return $how >= 0;
}

# Whether two TCP listeners (or parsed specs) take the same clients: one
# port, and one address, or one of them is its family's any-address
# (0.0.0.0, ::) and the other of that family.
sub overlaps {
    my ($x, $y) = @_;
    return 0 if $x->{path} || $y->{path} || !$x->{port} || $x->{port} != ($y->{port} // 0);
    my ($hx, $hy) = map { lc $_->{host} } $x, $y;
    return 1 if $hx eq $hy;
    return 0 if ($hx =~ /:/) != ($hy =~ /:/);
    return scalar grep { $_ eq '0.0.0.0' || $_ eq '::' } $hx, $hy;
}

# The part of the PSGI $env that is the same for every request on it.
sub env_template {
    my ($l) = @_;
    return { SERVER_NAME => $l->{host}, SERVER_PORT => $l->{port},
             'psgi.url_scheme' => 'https', HTTPS => 'on' } if $l->{tls};
    return $l->{is_tcp}
        ? { SERVER_NAME => $l->{host}, SERVER_PORT => $l->{port} }
        : { SERVER_NAME => 'localhost', SERVER_PORT => 80 };
}

sub describe {
    my ($l) = @_;
    return $l->{path} ? "unix:$l->{path}"
         : $l->{host} =~ /:/ ? "[$l->{host}]:$l->{port}" : "$l->{host}:$l->{port}";
}

1;
__END__

=head1 NAME

Narwhal::Listener - opening and inheriting listening sockets

=head1 DESCRIPTION

Parses C<--listen> values, opens TCP (IPv4, IPv6) and unix-domain listeners,
and picks up sockets passed by Server::Starter (C<SERVER_STARTER_PORT>) or
systemd socket activation (C<LISTEN_FDS>, C<LISTEN_PID>). TCP listeners get
C<TCP_NODELAY> and, on Linux, C<TCP_DEFER_ACCEPT>. A TCP address this
server binds itself is C<--listen-queues> sockets on one port with
C<SO_REUSEPORT>, the first bound alone so that a port in use is refused
(F<docs/DESIGN.md>, "Listen queues"); C<addresses> names each address once.

=cut
