package Narwhal;
use strict;
use warnings;

our $VERSION = '0.02';

require XSLoader;
XSLoader::load('Narwhal', $VERSION);

# A constant the test suite would otherwise have to outwait can be set for
# tests by NARWHAL_TEST_<NAME> in the environment (seconds, read once as
# the module that uses it loads). For tests only: not an option, not for
# operators (docs/DESIGN.md, "Limits and timeouts").
sub for_tests {
    my ($name, $default) = @_;
    my $v = $ENV{"NARWHAL_TEST_$name"};
    return defined $v && $v =~ /\A\d+(?:\.\d+)?\z/ && $v > 0 ? $v + 0 : $default;
}

# Logging helpers shared by the master and the workers.

# Narwhal's own error-log lines: "TIME narwhal[PID] ROLE LEVEL: text", one
# line per line of text, formatted by the C side's one formatter
# (src/shared/nw_log.c, which the manager uses too). Levels: error, warn, info.
# The app's own lines (warn, psgi.errors) are never passed through here.
sub log_line {
    my ($level, $text) = @_;
    print STDERR Narwhal::Log::format($level, $text);
}

# This process's role in those lines: master, worker or manager.
sub log_role { Narwhal::Log::set_role($_[0]) }

sub open_error_log {
    my ($o) = @_;
    my $file = $o->{error_log} or return;
    open(STDERR, '>>', $file) or die "cannot open error log $file: $!\n";
    STDERR->autoflush(1);
}

# The connection manager program, built next to the XS module.
sub manager_path {
    return $ENV{NARWHAL_MANAGER} if $ENV{NARWHAL_MANAGER};
    for my $dir (@INC) {
        next if ref $dir;
        my $bin = "$dir/auto/Narwhal/narwhal-manager";
        return $bin if -x $bin;
    }
    return;
}

# Returns true when the log was reopened (or there is none); on failure
# stderr still goes where it went, and $! says why.
sub reopen_error_log {
    my ($o) = @_;
    my $file = $o->{error_log} or return 1;
    open(my $new, '>>', $file) or return 0;
    open(STDERR, '>&', $new) or return 0;
    STDERR->autoflush(1);
    return 1;
}

1;
__END__

=head1 NAME

Narwhal - a fast prefork PSGI server with a C hot path

=head1 SYNOPSIS

  narwhal --listen :5000 --max-workers 8 app.psgi
  plackup -s Narwhal --max-workers 8 app.psgi
  start_server --port 5000 -- narwhal app.psgi

=head1 DESCRIPTION

Narwhal is a preforking PSGI/Plack server. A Perl master opens the
listeners, loads the app and forks the workers; each worker accepts its own
connections with C<accept4> (no accept lock) and serves requests through a C
core that parses HTTP/1.1, builds C<$env> and writes responses with
C<writev> and C<sendfile>. Keep-alive is on by default.

  master (Perl) --fork--> worker (Perl app + C core) x N
        |                    ^  accept4 on the listeners
        | fork+exec          |  SCM_RIGHTS over a unix socket
        v                    v
  manager (C, epoll): idle keep-alive connections and slow request heads

=head1 OPTIONS

Command-line names are kebab-case (C<--max-workers>); the same names in
snake_case (C<max_workers>) are accepted by C<< Plack::Handler::Narwhal->new >>.
Both C<--opt=value> and C<--opt value> work.

The items below are the option table of L<Narwhal::Options>, the one that
C<narwhal --help> prints and C<Plack::Handler::Narwhal> checks.

=for comment options: written by dev/gen-options from lib/Narwhal/Options.pm

=head2 Listening

=over 4

=item --listen ADDR, -l ADDR

C<host:port>, C<:port>, C<[::1]:port>, or a unix socket path
(C</path/to.sock>, C<unix:/path>, or, as in Starman, any value without a
colon that is not a port: C<app.sock> is F<app.sock> in the working
directory); repeatable. A TCP address with C<:ssl> after it (Starman's
C<HOST:PORT:ssl>) is a TLS listener: HTTPS, with C<--tls-cert> and
C<--tls-key>. Without it, C<--host> and C<--port> make one listener
(C<0.0.0.0:5000> when neither is given).

=item --host HOST, -o HOST

With C<--port>, another way to say one TCP listener (when there is no
C<--listen>).

=item --port PORT, -p PORT

The port of that listener.

=item --socket PATH, -S PATH

A unix socket listener.

=item --socket-mode OCTAL

The mode of unix socket listeners (octal, e.g. C<0660>), set between C<bind>
and C<listen>: no client can connect before it is in place. Without it, the
process's umask decides (usually C<0755>: only root can connect). With
C<--socket-group www-data>, C<0660> lets nginx's workers in and nobody else.
It covers every unix socket Narwhal listens on: the app's (C<--listen>,
C<--socket>) and the status pages' (C<--status-listen>), so that a scraper in
the group can read them; sockets inherited from Server::Starter or systemd
keep their own.

=item --socket-group GROUP

The group of unix socket listeners (a name or a gid): the app's (C<--listen>,
C<--socket>) and the status pages' (C<--status-listen>). With
C<--socket-mode> (C<0660>), that group's processes may connect.

=item --reuse-port

Set C<SO_REUSEPORT> on TCP listeners, so that a new instance can listen on
the same port while the old one drains (a hand-over without Server::Starter).
The kernel spreads new connections over every listener on the port; a
connection still in the old instance's accept queue when its last worker
closes the listener is reset, so stop the old one with C<--drain-delay> long
enough for the new one to be up, or set C<net.ipv4.tcp_migrate_req=1> (Linux
5.14+), which moves those connections to the new listener. Default: C<off>.

=item --backlog N

Length of the listen queue: connections the kernel completes and holds until
a worker accepts them. By default the kernel's C<net.core.somaxconn> (which
also caps any larger value), and at least 1024: a burst of new connections
beyond it is answered with SYN cookies or, when the queue of completed
connections overflows, dropped (the client retries after a second). Each of
an address's C<--listen-queues> sockets has a queue this long. See "Bursts of
new connections" in F<docs/PERFORMANCE.md>. At least C<1>.

=item --listen-queues N

How many sockets each TCP address Narwhal binds gets, on the same port with
C<SO_REUSEPORT>: the kernel spreads new connections over them and each has
its own queue of C<--backlog>, so a burst of new clients has that many times
the room before the kernel drops any. Every accepting worker watches every
one of them. By default the number of accepting workers (the whole pool when
every worker accepts; never more than C<--max-workers>), at most 4, and 1
when the connection manager does not run (C<--no-manager>, or
C<--disable-keepalive> without C<--status-listen> or C<--max-queue-wait>): a
worker that epoll tells of two queues serves one client, and only the manager
passes on the other, which would otherwise wait for that worker while another
is idle. 1: one socket per address. Without C<--reuse-port> the port is still
refused when something else listens on it. Sockets from Server::Starter or
systemd and unix sockets keep one queue each. See "Listen queues" in
F<docs/DESIGN.md>. At least C<1>. At most C<63>.

=item --proxy-protocol

Every listener requires a PROXY protocol header (version 1 or 2, as HAProxy's
C<send-proxy> and C<send-proxy-v2> send) before the HTTP request;
C<REMOTE_ADDR> and C<REMOTE_PORT> come from it, and C<SERVER_PORT> from its
destination port (a C<LOCAL> header, a balancer's health check, keeps the
socket's own). A connection without a valid header is closed without an
answer: the server never guesses; it is counted in
C<narwhal_proxy_rejected_total{reason="bad_header"}> and logged with its peer
(the first at once, the rest summed up every 10 s). Only for listeners that
nothing but the balancer can reach, or with C<--proxy-from>; without it,
Narwhal warns at start. On a TLS listener the header comes before the TLS
handshake (a TCP balancer passing TLS through, as HAProxy's C<mode tcp> with
C<send-proxy-v2> does), and the connection manager reads it there. Default:
C<off>.

=item --tls-cert FILE, --ssl-cert FILE

The certificate chain of the TLS listeners (C<HOST:PORT:ssl>, or every TCP
one with C<--enable-ssl>): PEM, the server's certificate first. Read by the
connection manager, which does TLS for every worker (F<docs/DESIGN.md>,
"HTTPS"); checked at start (a missing, unreadable or mismatched file: one
line, and no start) and read again on HUP. TLS 1.2 and 1.3 only; Starman's
C<--ssl-cert> is the same.

=item --tls-key FILE, --ssl-key FILE

The private key of C<--tls-cert> (PEM, without a passphrase), read as it is.
Starman's C<--ssl-key> is the same.

=item --enable-ssl, --ssl

Every TCP listener is a TLS listener, as if each had C<:ssl> after it
(Starman's C<--enable-ssl>). Default: C<off>.

=item --proxy-from CIDR

With C<--proxy-protocol>, connections from any other address are closed at
once (C<10.0.0.0/8>, C<fd00::/8>, or an address; repeatable; IPv4-mapped IPv6
peers match IPv4 entries; unix-socket peers are local processes and always
allowed), counted in C<narwhal_proxy_rejected_total{reason="not_allowed"}>
and logged as a bad header is.

=back

=head2 Workers

=over 4

=item --max-workers N, --workers N

Worker processes (with --min-workers: at most). Default: C<4>. At least C<1>.

=item --accepting-workers N

How many workers always take new clients from the listeners. The others,
standby workers, serve what the connection manager gives them (new clients it
takes when every accepting worker has been on its request for 20 ms, and
kept-alive ones whose worker is held up) and take new clients themselves
while their requests block. A worker whose requests spend most of their time
asleep (a database, a sleep: measured per worker from the kernel's accounting
of its thread) also sends its kept-alive clients through the manager, where
any free worker takes their next request. So a CPU-bound app keeps as many
workers runnable as there are CPUs (fewer context switches and a lower tail
latency than every worker contending), and a blocking app gets every worker.
By default the number of CPUs the server may run on (its affinity mask:
C<taskset> and cpusets count; and the CPU quota of its cgroup, rounded up,
when that is fewer), never more than the pool; 0: every worker accepts.
Without the connection manager every worker accepts. A replacement of an
accepting worker accepts; the elastic pool's added workers are standby, and
standby workers are the first to go when it shrinks or on TTOU. See
"Accepting workers" and "Requests that block" in F<docs/DESIGN.md>. At least
C<0>.

=item --min-workers N

An elastic pool: start this many workers; add one when requests have waited
longer than 10 ms for a worker (50 ms while some workers stand by and none of
them is idle: C<--accepting-workers>; 1 ms while the workers' requests block,
when another worker costs the CPUs nothing; at least 1% of those that began
since the last look, measured as C<narwhal_request_queue_seconds> is: in the
manager's queue, parked in a busy worker or in the listen queue) or when
every worker has been on its request for 20 ms, up to C<--max-workers>, at
most one per C<--spawn-interval> (0.1 s when that is 0); retire a worker idle
for C<--worker-idle-timeout>, down to this many, handing its kept-alive
connections to the others as a recycled worker does, but never while requests
wait. Counted in C<narwhal_pool_changes_total{reason}>. Without it the pool
is fixed at C<--max-workers>. TTIN and TTOU move C<--max-workers>. At least
C<1>.

=item --worker-idle-timeout SECS

With C<--min-workers>: a worker that has served no request for this many
seconds is retired while the pool is above C<--min-workers>, one at a time.
Default: C<60>. More than C<0>. At most C<2000000>.

=item --max-reqs-per-child N, --max-requests N

Requests (not connections) a worker serves before it is replaced (0 means
never). A worker that is replaced hands its kept-alive connections to the
other workers (or the manager), so its clients do not notice; that costs a
little per connection it holds (up to a few hundred under heavy keep-alive
load), which is why the default is higher than the 1000 of other prefork
servers. With the connection manager, its replacement is started when a
twentieth of its requests are left (with 20 or more), so that it is ready
when the old worker leaves: for that moment there is one worker more than
C<--max-workers> (never more than one: workers that reach their counts
together are replaced one after the other, and one whose replacement is still
starting serves on, 2 s at most). A worker that does not reach its count
within 10 s of that (under 50 requests a second at the default) is retired
then, once the other workers are ready. Default: C<10000>.

=item --min-worker-lifetime SECS

When C<--max-reqs-per-child> (or C<--max-requests>) is given and this is not,
it is 0: a count the operator chose is kept, whatever the workers' age. A
worker that reaches C<--max-reqs-per-child> (or, with the connection manager,
the point where it asks for its replacement) before it is this many seconds
old is given that many requests again (its own count, drawn, with
C<--min-reqs-per-child>), as often as it takes, and is replaced at the end of
the first count it finishes older than this. So the count guards against an
app that leaks a little per request without replacing workers several times a
second under heavy load: at 20,000 requests a second a worker reaches the
default count in half a second, and each replacement moves its kept-alive
clients (F<docs/PERFORMANCE.md>, thirteenth round). C<--max-worker-rss> is
the guard for memory itself. 0 replaces a worker at its count however young
it is. Default: C<10>. At most C<2000000>.

=item --min-reqs-per-child N

With it, each worker is replaced after a random count between this and
C<--max-reqs-per-child>, so workers do not all restart at once.

=item --max-worker-lifetime SECS

A worker older than this many seconds is replaced as one that reached
C<--max-reqs-per-child> is, also on a quiet server: its successor is started
first, and once it is ready the old worker finishes its request and hands its
kept-alive connections to the others (with the manager; without it, idle ones
are closed). Each worker's limit is drawn once between SECS and SECS + 10%,
and one worker is replaced at a time, so workers started together do not
leave together. Counted in
C<narwhal_worker_restarts_total{reason="lifetime"}>. 0 (the default): no
limit. Default: C<0>. At most C<2000000>.

=item --worker-slice SECS

The CPU time slice a worker asks Linux's scheduler for (a custom slice: Linux
6.12 and later; older kernels ignore it). When more processes are runnable
than there are cores, a worker with a shorter slice than the kernel's default
(1.4 ms on two cores, more on more) runs sooner when a request wakes it and
hands the CPU on sooner, which shortens the wait of the connections it holds.
The kernel keeps it between 0.1 and 100 ms; 0 leaves the kernel's default.
See "Worker time slices" in F<docs/DESIGN.md>. Default: C<0.0003>. At most
C<0.1>.

=item --spawn-interval SECS

Space out replacement and added workers. Default: C<0>.

=item --[no-]preload-app

Load the app in the master before forking, or with C<--no-preload-app> (or
C<-L Delayed>, for plackup users) in each worker; then HUP reloads the app.
Default: C<on>. The Plack handler also takes C<no_preload_app>, its opposite
(plackup turns C<--disable-X> into C<< X => 0 >>).

=item --child-exit CODE

C<sub { ... }>, run in a worker just before it exits.

=item --user USER

Workers (and the manager) switch to this user after the listeners are open.

=item --group GROUP

Workers (and the manager) switch to this group after the listeners are open.

=back

=head2 Connections

=over 4

=item --timeout SECS

Deadline for one read or write that makes no progress, in a worker and in the
manager (which finishes responses for slow readers: C<--max-offload-bytes>).
Default: C<300>. More than C<0>. At most C<2000000>.

=item --read-timeout SECS

Deadline for a whole request head from its first byte: a slow client gets 408
and cannot hold a worker longer. While the head arrives at least
--min-head-rate bytes a second, the deadline moves on, up to
--read-timeout-max. Default: C<20>. More than C<0>. At most C<2000000>.

=item --read-timeout-max SECS

A head arriving fast enough gets up to this (never less than --read-timeout).
Default: C<60>. More than C<0>. At most C<2000000>.

=item --min-head-rate BYTES

A head that has brought N bytes may take N / BYTES seconds from its first
byte when that is more than --read-timeout (never more than
--read-timeout-max): one arriving at least this many bytes a second keeps
going, a slower one has --read-timeout. Default: C<500>.

=item --keepalive-timeout SECS

Idle time allowed between requests, counted from when the last response has
left the server: a client still reading it (its bytes still in the socket) is
not idle. See "Slow readers" in F<docs/DESIGN.md>. Default: C<5>. More than
C<0>. At most C<2000000>.

=item --max-keepalive-reqs N

Requests served on one connection; the last one is answered with
C<Connection: close>. Default: C<1000>.

=item --disable-keepalive

Close after every response. Default: C<off>. The Plack handler also takes
C<keepalive>, its opposite (plackup turns C<--disable-X> into C<< X => 0 >>).

=item --[no-]manager

Hold idle keep-alive connections and slow request heads in the connection
manager. With C<--no-manager>, idle connections stay in a worker until
C<--keepalive-timeout>, as in other prefork servers. Default: C<on>. The
Plack handler also takes C<no_manager>, its opposite (plackup turns
C<--disable-X> into C<< X => 0 >>).

=item --max-connections N

Connections the manager holds at once; when full, the longest-idle one is
closed. By default, as many as its open-file limit allows (it raises its soft
limit to the hard one and keeps 256 descriptors for itself). A TLS connection
counts from its accept, and once parked counts twice (its encrypted side and
its plain one); with none idle, new clients wait in the listen queue. At
least C<1>.

=item --[no-]custody

The connection manager holds a copy of every connection parked in a worker,
so that a worker killed with KILL (the kernel's OOM killer) or ended by the
app's C<exit> loses only the request it was serving: the manager takes the
others over. It costs nothing per request and about 10 us of CPU per
keep-alive connection that lives longer than 10 ms (a descriptor passed,
watched and closed); a shorter one and C<Connection: close> traffic never pay
it. C<--no-custody> saves that where connections carry a few requests each.
See F<docs/DESIGN.md>, "Custody of parked connections". Default: C<on>. The
Plack handler also takes C<no_custody>, its opposite (plackup turns
C<--disable-X> into C<< X => 0 >>).

=item --keepalive-wait SECS

How long a worker keeps a connection it has just served parked, watching for
its next request while it serves other clients, before handing it to the
manager. A client that comes back within this time is served by the same
worker with no hand-off; 0 hands every quiet connection to the manager at
once. The default covers a busy machine, where a client's next request can
take tens of milliseconds to come back: a shorter wait sends such clients
through the manager on every request. Never longer than
C<--keepalive-timeout>: a connection idle that long is closed. A worker parks
up to 4096 connections. When a request has run for 50 ms, a thread in the
worker hands the connections parked there to the manager, where any free
worker takes them, so a parked connection does not wait behind another's slow
request. With an often slow app (a second such request within 5 seconds of
the last) parking pauses for 5 seconds, so quiet connections go to the
manager at once (see "Parking" in F<docs/DESIGN.md>). Default: C<0.5>.

=item --worker-quantum N

Requests a worker serves in a row on one connection before it parks it and
looks at the other connections that are waiting. Default: C<5>. At least
C<1>.

=back

=head2 Limits

=over 4

=item --max-request-body BYTES

Larger bodies get 413, without being read. A limit by default, so that no
client can make a worker spool gigabytes to C<$TMPDIR>; 0 means none: raise
it for uploads. Default: C<67108864>.

=item --max-offload-bytes BYTES

When a client does not read a response as fast as it is written, the worker
does not wait: it gives the connection and what is left of the response to
the connection manager, which writes it as the client reads, and goes back to
work. For an in-memory body (an array), the unsent bytes are copied into
anonymous memory (a memfd); a rest larger than this stays with the worker,
which waits as it always did. A file body's rest costs no memory (the manager
C<sendfile>s the rest of the file) and is not limited by it. Streaming bodies
(C<getline> objects that are not files, C<psgi.streaming> writers) always
keep their worker. Needs the manager. 0 turns in-memory offload off. See
"Slow readers" in F<docs/DESIGN.md>. Default: C<16777216>.

=item --max-offload-total BYTES

All in-memory rests the manager holds, together (beyond: the worker waits).
Default: C<268435456>.

=item --body-in-memory BYTES

Larger bodies go to an unlinked temp file. Default: C<1048576>.

=item --max-request-line BYTES

A longer request line (method, target, version) gets 414. Default: C<8192>.
At least C<64>.

=item --max-header-bytes BYTES

A longer request head (request line and header fields) gets 431. A head the
manager holds must fit in one frame to a worker, hence the upper bound.
Default: C<65536>. At most C<131072>.

=item --max-headers N

A request with more header fields gets 431. Default: C<100>. At least C<1>.
At most C<1024>.

=back

=head2 Operations

=over 4

=item --status-listen ADDR

Serve the status pages on this address (C<host:port>, C<:port> or a unix
socket path): C</status> (HTML), C</status.json>, C</metrics> (Prometheus
text format) and C</health> (200; 503 while the app loads and once a stop or
drain has begun). Never one of the app's listeners. The connection manager
answers them, from C, even when every worker is busy or stuck, so it needs
the manager (not C<--no-manager>). Off by default; it shows request lines, so
bind it to loopback or a private socket. A unix socket gets C<--socket-mode>
and C<--socket-group>, as the app's do.

=item --request-timeout SECS

A request that has run longer than this is ended: its worker logs where the
app is (a Perl backtrace with file and line; a worker stuck in C code says
so), answers C<504 Gateway Timeout> if no response byte was sent yet (else
the connection is closed), and is replaced. Checked twice a second, so a
request may run up to half a second more. 0 (the default) means no limit.
Default: C<0>. At most C<2000000>.

=item --max-worker-rss MB

A worker whose resident size passes this many MiB after a request finishes
that request, hands its kept-alive connections to the other workers (or the
manager) and is replaced; the error log says how large it was. Checked after
every request with one C<getrusage> (the peak size); C</proc> is read only
once the peak is over. 0 (the default) means no limit. Default: C<0>.

=item --crash-backoff SECS

A worker that dies while serving a request (a crash signal or an exit; not a
KILL or TERM from outside) is charged to the request's method and path (the
query left out). When the same route has killed three workers within 10
seconds, and at least half the requests to it since its first death, the
workers answer it C<503 Service Unavailable> with C<Retry-After: 1> without
running the app, for this many seconds; then it is tried again, and if it
kills a worker again within twice that time the wait doubles (up to 5
minutes), else it starts over. The master logs each back-off once, with the
route and the count; answers are counted in C<narwhal_crash_refused_total>.
Every crash is a fork: without this, four clients on a URL that crashes its
worker cut everyone else's throughput by about 80 times. 0 turns it off.
Default: C<1>. At most C<2000000>.

=item --max-queue-wait MS

When every worker is busy, a complete request that has waited longer than
this many milliseconds in the connection manager is answered C<503 Service
Unavailable> with C<Retry-After: 1> and closed (counted in
C<narwhal_shed_total>), instead of the queue growing without bound. New
clients are included: while every worker has been on its request for 20 ms,
the manager takes new connections from the listeners itself, so they wait in
its queue rather than unseen in the listen queue. Needs the manager. 0 (the
default) means no limit. Default: C<0>. At most C<2000000000>.

=item --access-log PATH

Append one line per request to this file (C<-> for standard error), written
in C by the worker after the response: the client's address, the time, the
request line, the status, the body bytes sent, the referer and user agent,
the duration in microseconds and the worker's pid (and, in JSON, the
response's C<X-Request-Id>). Lines are buffered and written at least once a
second, and when the worker is idle or leaves; USR1 reopens the file (the
master creates it and gives it to C<--user>). See "The access log" in
F<docs/DESIGN.md> for the layouts.

=item --access-log-format FORMAT

Combined (with duration and pid at the end) or json, one object per line.
Default: C<combined>.

=item --access-log-client WHO

Who the access log's client field names. C<peer> (the default): the
connection's C<REMOTE_ADDR> (the PROXY header's source under
C<--proxy-protocol>; C<-> on a unix socket). C<forwarded>: the last address
of C<X-Forwarded-For> when the request came from a proxy Narwhal trusts, a
unix-socket peer (nginx on the same host; the socket's mode decides who may
connect) or an address in C<--forwarded-from>; else, or when that is not an
address, the peer as with C<peer>. Only the log changes: the app's
C<REMOTE_ADDR> stays the peer's. Default: C<peer>.

=item --forwarded-from CIDR

With --access-log-client forwarded, trust X-Forwarded-For from these TCP
peers too (repeatable).

=back

=head2 Process

=over 4

=item --drain-delay SECS

On a stop signal, C</health> (see C<--status-listen>) answers 503 at once
while the listeners and workers go on serving for this many seconds, so that
a load balancer or a Kubernetes readiness probe takes the instance out of its
pool before the graceful stop begins. A second stop signal begins it at once.
The signal must reach the master alone (systemd: C<KillMode=mixed>;
Kubernetes signals the container's first process): workers that get it
themselves stop at once. 0 (the default): no drain. Default: C<0>. At most
C<2000000>.

=item --graceful-timeout SECS

Stop: wait this long for requests in flight, then KILL. Default: C<30>.

=item --daemonize, -D

Run in the background, as Starman's and plackup's C<-D> do: the command
forks, the server goes on in a new session (C<setsid>), and the command
returns 0 once the listeners are open and the app is loaded (or, when the
server cannot start, says why in one line and returns non-zero). Standard
input and output go to F</dev/null>, and so does standard error unless
C<--error-log> is given; the working directory stays, so relative paths (the
app, C<--pid>, a unix socket) mean what they meant. With C<--pid>, the file
holds the server's pid. Default: C<off>.

=item --pid FILE, --pid-file FILE

Write the master's pid here.

=item --error-log FILE

Append stderr (and C<psgi.errors>) to this file instead of stderr; USR1
reopens it in the master, the connection manager and every worker. Narwhal's
own lines start with the time, C<narwhal[PID]>, the process's role and a
level (C<2026-11-26T13:40:01.123Z narwhal[1234] master info: ...>); the app's
lines are left as it wrote them.

=back

=for comment /options

=head1 LIMITS

The options in the Limits group above; each default is a named constant in
F<src/shared/nw_limits.h>, which the option table reads, and the bounds the C side
needs are C's too.

Malformed requests get 400 (501 for a transfer coding other than chunked,
505 for an HTTP version other than 1.0/1.1, 417 for an Expect other than
100-continue) and the connection is closed.

=head1 OPERATIONS

C<--status-listen ADDR> serves C</status> (HTML), C</status.json>,
C</metrics> (Prometheus text format 0.0.4) and C</health> (200; 503
while the app loads and once a stop has begun) from the connection
manager, which answers even when every worker is stuck. The metrics: C<narwhal_requests_total> by
status class, C<narwhal_request_duration_seconds> (histogram),
C<narwhal_workers> by state, C<narwhal_workers_wanted>,
C<narwhal_connections> by state (each open connection in one),
C<narwhal_requests_waiting> (in the manager, on the serve queue),
C<narwhal_refused_total> by reason (connections closed because they could
not be passed on or kept, answered 503 when they held a request, and
logged), C<narwhal_worker_restarts_total> by
reason (max-requests, crash, watchdog, memory, signal),
C<narwhal_handoffs_total> by direction (to_manager, to_worker, and
worker_to_worker: a leaving worker's connections taken by the others),
C<narwhal_listen_queue_length> and
C<narwhal_listen_queue_limit>, C<narwhal_shed_total>,
C<narwhal_worker_resident_bytes> per worker, C<narwhal_start_time_seconds>
and C<narwhal_up>.

C<--request-timeout SECS> ends a request that runs longer: a backtrace to
the error log, C<504 Gateway Timeout> (or a closed connection when the
response had begun), the worker replaced. C<--max-worker-rss MB> replaces
a worker that grew past the limit after its request, keeping its clients'
connections. C<--max-queue-wait MS> answers C<503> with C<Retry-After> to
requests that waited that long for a free worker. See "The operator layer"
in F<docs/DESIGN.md>.

=head1 SIGNALS

Master: TERM, INT and QUIT stop gracefully (listeners closed, requests in
flight finish, then exit; KILL after C<--graceful-timeout>). HUP starts a
new generation of workers and retires the old one (USR2: finish, then hand
idle connections to the manager). TTIN and TTOU add or retire a worker. USR1 reopens the error log (and tells the workers).
USR2 writes the connection manager's counts to the error log.
Workers: TERM, INT, QUIT finish the current request, serve (with
C<Connection: close>) what has already arrived (clients in the listen
queue, connections with a request waiting), close their idle connections
and exit; USR2 does the same but hands the idle connections to the
manager. A worker's signals never interrupt the app: they are blocked
while it runs and acted on between requests, so a C<sleep> or a blocking
call in the app is not cut short by a stop. Each signal to the master that
changes the server leaves a stamped line in the error log naming it and the
pid of the process that sent it, and so does every generation of workers
started and finished.

A stop makes the listeners Narwhal opened take no new connection before
it closes them: on TCP a socket filter drops new SYNs, and a unix socket
is shut for reading, so a client that comes now is refused before it
sends anything rather than accepted by the kernel and reset. Where the
kernel refuses socket filters to a master that is not root, the listen
queue is shortened to nothing instead, said once in the error log: a
client that connects in the stop's last instant may then be reset.

Every signal of every process, and the hot-upgrade steps: F<docs/SIGNALS.md>
(see L</SEE ALSO>).

=head1 PSGI ENVIRONMENT

All C<psgi.*> keys; C<psgi.streaming>, C<psgi.multiprocess> true;
C<psgi.nonblocking> false. Extensions: C<psgix.input.buffered> (the body is
read before the app runs), C<psgix.io> (the client socket, in blocking mode
as other PSGI servers hand it over: a plain C<sysread> after a 101 waits for
the client; the server makes the socket non-blocking again before it writes
a response or reads the next request on it), C<psgix.harakiri>
(set C<psgix.harakiri.commit> to end the worker after this response),
C<psgix.cleanup> (handlers in C<psgix.cleanup.handlers> run after the
response is sent), C<psgix.informational> (call it with a 1xx status and
headers, e.g. 103 Early Hints). C<REMOTE_ADDR> is empty for unix-socket
clients. A delayed response whose responder is never called is taken as the
app having taken over C<psgix.io>: the server writes nothing and closes its
side.

Responses: an array body or a file gets a C<Content-Length>; any other body
goes in chunks on HTTP/1.1 and ends with the connection on HTTP/1.0. An
app's own C<Transfer-Encoding: chunked> asks the server to chunk whatever
body it returns (not chunked yet, as under Starman), and no
C<Content-Length> goes with it, the app's included (RFC 9112 6.2); another
transfer coding as the last one ends the body with the connection. An
HTTP/1.0 client never gets a C<Transfer-Encoding> (RFC 9112 6.1): the app's
is dropped, and the body is framed as if there were none.

Each request gets a hash that looks exactly like a fresh one. To save the
cost of building and freeing it, a worker reuses the hash of the request
before when nothing else refers to it any more: at the end of a request it
deletes what the request added (so whatever an app or middleware stored in
C<$env> is freed then, as it would be with a new hash) and puts back the
values the app changed. A hash the app keeps (stored somewhere, captured by
a streaming response, weakly referenced) is never reused. So the only
difference an app could see is that C<refaddr($env)> repeats between
requests, which Perl's own memory reuse already does with fresh hashes: do
not key caches on it.

=head1 SEE ALSO

L<Plack::Handler::Narwhal> (C<plackup -s Narwhal>), L<Narwhal::Options>.

The F<docs/> and F<src/> files named above are in Narwhal's source: the
release tarball (C<Narwhal-VERSION.tar.gz>) and the repository,
L<https://github.com/narwhal-psgi/Narwhal>. An install copies only the
modules, this documentation and C<narwhal>. F<docs/DESIGN.md> says why
the code is the way it is, part by part; F<docs/SIGNALS.md> has every
signal and the hot upgrade; F<docs/DEPLOY.md> systemd, nginx, HAProxy,
Kubernetes and logrotate; F<docs/PERFORMANCE.md> every measured round;
F<docs/PROTOCOL.md> the frames between the workers and the manager.

=head1 LICENSE

Same terms as Perl itself.

=cut
