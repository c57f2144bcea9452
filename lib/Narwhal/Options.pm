package Narwhal::Options;
use strict;
use warnings;
use Narwhal ();
use Narwhal::Listener ();

# The one table of options. Each option's name, aliases, type, default,
# bounds, help group, placeholder and one line of help live here, and
# everything else is derived from it: the command line's Getopt specs and
# --help, the defaults, the checks, the Plack handler's arguments, the C
# side's typed configuration and the manager's arguments. The table in
# docs/OPTIONS.md and the POD's OPTIONS items are written from it (dev/gen-options:
# run it after changing the table) and t/31-options.t checks docs/OPTIONS.md,
# the POD and --help against it. Limits that C enforces take their
# default and bounds from C (Narwhal::Limits, exported by the XS from
# src/shared/nw_limits.h), never retyped here.
#
# Keys: name (snake_case; the command line uses kebab-case), alias (other
# command-line names; one letter is a short option), type, default, min,
# max, group, arg (placeholder), help, c (the C configuration reads it),
# manager (the manager program's flag for it), negated (handler names that
# mean its opposite: plackup turns --disable-X into X => 0), doc (0: not an
# operator option: left out of --help, docs/OPTIONS.md and the POD), pod (the
# POD's longer text when the help line is not enough; POD markup allowed).

my $L = 'Narwhal::Limits';
sub _c { my ($name) = @_; return $L->can($name)->() }

use constant GROUPS => qw(Listening Workers Connections Limits Operations Process);

my @TABLE = (
    { name => 'listen', alias => ['l'], type => 'list', group => 'Listening', arg => 'ADDR',
      help => 'host:port, :port, [::1]:port or a unix socket path (repeatable; default '
          . Narwhal::Listener::DEFAULT_HOST() . ':' . Narwhal::Listener::DEFAULT_PORT() . ')',
      pod => 'C<host:port>, C<:port>, C<[::1]:port>, or a unix socket path (C</path/to.sock>, '
           . 'C<unix:/path>, or, as in Starman, any value without a colon that is not a port: '
           . 'C<app.sock> is F<app.sock> in the working directory); repeatable. A TCP address with '
           . 'C<:ssl> after it (Starman\'s C<HOST:PORT:ssl>) is a TLS listener: HTTPS, with '
           . 'C<--tls-cert> and C<--tls-key>. Without it, C<--host> and C<--port> make one listener '
           . '(C<' . Narwhal::Listener::DEFAULT_HOST() . ':' . Narwhal::Listener::DEFAULT_PORT()
           . '> when neither is given).' },
    { name => 'host', alias => ['o'], type => 'string', group => 'Listening', arg => 'HOST',
      help => 'another way to say one TCP listener, with --port',
      pod => 'With C<--port>, another way to say one TCP listener (when there is no C<--listen>).' },
    { name => 'port', alias => ['p'], type => 'port', group => 'Listening', arg => 'PORT',
      help => 'the port of that listener' },
    { name => 'socket', alias => ['S'], type => 'list', group => 'Listening', arg => 'PATH',
      help => 'a unix socket listener' },
    { name => 'socket_mode', type => 'string', group => 'Listening', arg => 'OCTAL',
      help => 'unix socket listeners (the app\'s and --status-listen\'s) get this mode (e.g. 0660), '
          . 'set before they accept',
      pod => 'The mode of unix socket listeners (octal, e.g. C<0660>), set between C<bind> and '
           . 'C<listen>: no client can connect before it is in place. Without it, the process\'s '
           . 'umask decides (usually C<0755>: only root can connect). With '
           . 'C<--socket-group www-data>, C<0660> lets nginx\'s workers in and nobody else. It '
           . 'covers every unix socket Narwhal listens on: the app\'s (C<--listen>, C<--socket>) '
           . 'and the status pages\' (C<--status-listen>), so that a scraper in the group can '
           . 'read them; sockets inherited from Server::Starter or systemd keep their own.' },
    { name => 'socket_group', type => 'string', group => 'Listening', arg => 'GROUP',
      help => 'unix socket listeners (the app\'s and --status-listen\'s) belong to this group '
          . '(a name or a gid)',
      pod => 'The group of unix socket listeners (a name or a gid): the app\'s (C<--listen>, '
           . 'C<--socket>) and the status pages\' (C<--status-listen>). With C<--socket-mode> '
           . '(C<0660>), that group\'s processes may connect.' },
    { name => 'reuse_port', type => 'bool', default => 0, group => 'Listening',
      help => 'SO_REUSEPORT on TCP listeners: another instance may listen on the same port',
      pod => 'Set C<SO_REUSEPORT> on TCP listeners, so that a new instance can listen on the '
           . 'same port while the old one drains (a hand-over without Server::Starter). The '
           . 'kernel spreads new connections over every listener on the port; a connection '
           . 'still in the old instance\'s accept queue when its last worker closes the '
           . 'listener is reset, so stop the old one with C<--drain-delay> long enough for '
           . 'the new one to be up, or set C<net.ipv4.tcp_migrate_req=1> (Linux 5.14+), which '
           . 'moves those connections to the new listener.' },
    { name => 'backlog', type => 'count', min => 1, group => 'Listening', arg => 'N',
      help => 'listen queue length (default: net.core.somaxconn, at least '
          . Narwhal::Listener::MIN_DEFAULT_BACKLOG() . ')',
      pod => 'Length of the listen queue: connections the kernel completes and holds until a '
           . 'worker accepts them. By default the kernel\'s C<net.core.somaxconn> (which also '
           . 'caps any larger value), and at least ' . Narwhal::Listener::MIN_DEFAULT_BACKLOG()
           . ': a burst of new connections beyond it is answered with SYN cookies or, when the '
           . 'queue of completed connections overflows, dropped (the client retries after a '
           . 'second). Each of an address\'s C<--listen-queues> sockets has a queue this long. See '
           . '"Bursts of new connections" in F<docs/PERFORMANCE.md>.' },
    { name => 'listen_queues', type => 'count', min => 1, max => _c('MAX_LISTENERS'),
      group => 'Listening', arg => 'N',
      help => 'sockets (accept queues) per TCP address (default: the accepting workers, at most '
          . _c('LISTEN_QUEUES_DEFAULT_MAX') . '; 1 without the connection manager)',
      pod => 'How many sockets each TCP address Narwhal binds gets, on the same port with '
           . 'C<SO_REUSEPORT>: the kernel spreads new connections over them and each has its own '
           . 'queue of C<--backlog>, so a burst of new clients has that many times the room '
           . 'before the kernel drops any. Every accepting worker watches every one of them. By '
           . 'default the number of accepting workers (the whole pool when every worker '
           . 'accepts; never more than C<--max-workers>), at most ' . _c('LISTEN_QUEUES_DEFAULT_MAX') . ', and 1 when the '
           . 'connection manager does not run (C<--no-manager>, or C<--disable-keepalive> without '
           . 'C<--status-listen> or C<--max-queue-wait>): a worker that epoll tells of two queues '
           . 'serves one client, and only the manager passes on the other, which would otherwise '
           . 'wait for that worker while another is idle. 1: one socket per '
           . 'address. Without C<--reuse-port> the port is still refused when something else '
           . 'listens on it. Sockets from Server::Starter or systemd and unix sockets keep one '
           . 'queue each. See "Listen queues" in F<docs/DESIGN.md>.' },

    { name => 'max_workers', alias => ['workers'], type => 'count', default => 4, min => 1,
      group => 'Workers', arg => 'N', help => 'worker processes (with --min-workers: at most)' },
    { name => 'accepting_workers', type => 'count', min => 0, group => 'Workers', arg => 'N',
      help => 'workers that always take new clients; the rest join in while requests block or '
          . 'those are stuck (default: the CPUs or the CPU quota; 0: all)',
      pod => 'How many workers always take new clients from the listeners. The others, standby '
           . 'workers, serve what the connection manager gives them (new clients it takes when '
           . 'every accepting worker has been on its request for ' . _c('POOL_STUCK_MS')
           . ' ms, and kept-alive ones whose worker is held up) and take new clients themselves '
           . 'while their requests block. A worker whose requests spend most of their time asleep '
           . '(a database, a sleep: measured per worker from the kernel\'s accounting of its thread) '
           . 'also sends its kept-alive clients through the manager, where any free worker takes '
           . 'their next request. So a CPU-bound app keeps as many workers runnable as there are '
           . 'CPUs (fewer context switches and a lower tail latency than every worker contending), '
           . 'and a blocking app gets every worker. By default the number of CPUs the server may '
           . 'run on (its affinity mask: C<taskset> and cpusets count; and the CPU quota of its '
           . 'cgroup, rounded up, when that is fewer), never more than the pool; 0: every worker '
           . 'accepts. Without the connection manager every worker accepts. A replacement of an '
           . 'accepting worker accepts; the elastic pool\'s added workers are standby, and standby '
           . 'workers are the first to go when it shrinks or on TTOU. See "Accepting workers" and '
           . '"Requests that block" in F<docs/DESIGN.md>.' },
    { name => 'min_workers', type => 'count', min => 1, group => 'Workers', arg => 'N',
      help => 'an elastic pool: start N, add workers when requests wait, up to --max-workers',
      pod => 'An elastic pool: start this many workers; add one when requests have waited '
           . 'longer than ' . _c('POOL_GROW_WAIT_MS') . ' ms for a worker (' . _c('POOL_GROW_STANDBY_WAIT_MS')
           . ' ms while some workers stand by and none of them is idle: C<--accepting-workers>; '
           . _c('POOL_GROW_BLOCKING_WAIT_MS') . ' ms while the workers\' requests block, when another '
           . 'worker costs the CPUs nothing; at least '
           . _c('POOL_GROW_SHARE') . '% of those that began since the last look, measured as '
           . 'C<narwhal_request_queue_seconds> is: in the manager\'s queue, parked in a busy worker '
           . 'or in the listen queue) or when every worker has been on its request for '
           . _c('POOL_STUCK_MS') . ' ms, up to C<--max-workers>, at most one per '
           . 'C<--spawn-interval> (0.1 s when that is 0); retire a worker idle for '
           . 'C<--worker-idle-timeout>, down to this many, handing its kept-alive connections '
           . 'to the others as a recycled worker does, but never while requests wait. Counted in '
           . 'C<narwhal_pool_changes_total{reason}>. Without it the pool is fixed at '
           . 'C<--max-workers>. TTIN and TTOU move C<--max-workers>.' },
    { name => 'worker_idle_timeout', type => 'seconds', default => 60, min_excl => 0,
      max => _c('MAX_SECONDS'), group => 'Workers', arg => 'SECS',
      help => 'with --min-workers: retire a worker idle this long',
      pod => 'With C<--min-workers>: a worker that has served no request for this many seconds '
           . 'is retired while the pool is above C<--min-workers>, one at a time.' },
    { name => 'max_reqs_per_child', alias => ['max-requests'], type => 'count', default => 10000,
      group => 'Workers', arg => 'N', help => 'requests before a worker is replaced (0: never)',
      pod => 'Requests (not connections) a worker serves before it is replaced (0 means never). '
           . 'A worker that is replaced hands its kept-alive connections to the other workers (or '
           . 'the manager), so its clients do not notice; that costs a little per connection it '
           . 'holds (up to a few hundred under heavy keep-alive load), which is why the default '
           . 'is higher than the 1000 of other prefork servers. With the connection manager, its '
           . 'replacement is started when a twentieth of its requests are left (with 20 or '
           . 'more), so that it is ready when the old worker leaves: for that moment there is '
           . 'one worker more than C<--max-workers> (never more than one: workers that reach '
           . 'their counts together are replaced one after the other, and one whose '
           . 'replacement is still starting serves on, ' . _c('RECYCLE_SUCCESSOR_WAIT_MS') / 1000
           . ' s at most). A worker that does '
           . 'not reach its count within 10 s of that (under 50 requests a second at the '
           . 'default) is retired then, once the other workers are ready.' },
    { name => 'min_worker_lifetime', type => 'seconds', default => 10, max => _c('MAX_SECONDS'),
      group => 'Workers', arg => 'SECS',
      help => 'a worker at --max-reqs-per-child younger than this serves that many again '
          . '(0: off; 0 unless given when --max-reqs-per-child is given)',
      pod => 'When C<--max-reqs-per-child> (or C<--max-requests>) is given and this is not, it '
           . 'is 0: a count the operator chose is kept, whatever the workers\' age. A worker that reaches C<--max-reqs-per-child> (or, with the connection manager, '
           . 'the point where it asks for its replacement) before it is this many seconds old '
           . 'is given that many requests again (its own count, drawn, with C<--min-reqs-per-child>), '
           . 'as often as it takes, and is replaced at the '
           . 'end of the first count it finishes older than this. So the count guards against '
           . 'an app that leaks a little per request without replacing workers several times a '
           . 'second under heavy load: at 20,000 requests a second a worker reaches the default '
           . 'count in half a second, and each replacement moves its kept-alive clients '
           . '(F<docs/PERFORMANCE.md>, thirteenth round). C<--max-worker-rss> is the guard for '
           . 'memory itself. 0 replaces a worker at its count however young it is.' },
    { name => 'min_reqs_per_child', type => 'count', group => 'Workers', arg => 'N',
      help => 'replace each worker at a random count in [N, max]',
      pod => 'With it, each worker is replaced after a random count between this and '
           . 'C<--max-reqs-per-child>, so workers do not all restart at once.' },
    { name => 'max_worker_lifetime', type => 'seconds', default => 0, max => _c('MAX_SECONDS'),
      group => 'Workers', arg => 'SECS',
      help => 'replace a worker older than this (plus up to 10%), busy or quiet (0: never)',
      pod => 'A worker older than this many seconds is replaced as one that reached '
           . 'C<--max-reqs-per-child> is, also on a quiet server: its successor is started first, '
           . 'and once it is ready the old worker finishes its request and hands its kept-alive '
           . 'connections to the others (with the manager; without it, idle ones are closed). '
           . 'Each worker\'s limit is drawn once between SECS and SECS + 10%, and one worker is '
           . 'replaced at a time, so workers started together do not leave together. Counted in '
           . 'C<narwhal_worker_restarts_total{reason="lifetime"}>. 0 (the default): no limit.' },
    { name => 'worker_slice', type => 'seconds', default => 0.0003, max => 0.1, c => 1,
      group => 'Workers', arg => 'SECS',
      help => 'CPU time slice a worker asks the kernel for (0: the kernel\'s default)',
      pod => 'The CPU time slice a worker asks Linux\'s scheduler for (a custom slice: Linux 6.12 '
           . 'and later; older kernels ignore it). When more processes are runnable than there '
           . 'are cores, a worker with a shorter slice than the kernel\'s default (1.4 ms on two '
           . 'cores, more on more) '
           . 'runs sooner when a request wakes it and hands the CPU on sooner, which shortens '
           . 'the wait of the connections it holds. The kernel keeps it between 0.1 and 100 ms; '
           . '0 leaves the kernel\'s default. See "Worker time slices" in F<docs/DESIGN.md>.' },
    { name => 'spawn_interval', type => 'seconds', default => 0, group => 'Workers', arg => 'SECS',
      help => 'space out replacement and added workers' },
    { name => 'preload_app', type => 'bool', default => 1, group => 'Workers',
      negated => ['no_preload_app'],
      help => 'load the app in the master (--no-preload-app, -L Delayed: in each worker; HUP reloads it)',
      pod => 'Load the app in the master before forking, or with C<--no-preload-app> (or '
           . 'C<-L Delayed>, for plackup users) in each worker; then HUP reloads the app.' },
    { name => 'loader', alias => ['L'], type => 'string', group => 'Workers', arg => 'NAME', doc => 0,
      help => 'Delayed is --no-preload-app (for plackup users)' },
    { name => 'child_exit', type => 'code', group => 'Workers', arg => 'CODE',
      help => 'sub { ... } run in a worker before it exits',
      pod => 'C<sub { ... }>, run in a worker just before it exits.' },
    { name => 'user', type => 'string', group => 'Workers', arg => 'USER',
      help => 'workers drop privileges to this user',
      pod => 'Workers (and the manager) switch to this user after the listeners are open.' },
    { name => 'group', type => 'string', group => 'Workers', arg => 'GROUP',
      help => 'and to this group',
      pod => 'Workers (and the manager) switch to this group after the listeners are open.' },

    { name => 'timeout', type => 'seconds', default => _c('DEFAULT_TIMEOUT'), min_excl => 0,
      max => _c('MAX_SECONDS'), c => 1, manager => 'timeout',
      group => 'Connections', arg => 'SECS', help => 'deadline for one read or write',
      pod => 'Deadline for one read or write that makes no progress, in a worker and in the '
           . 'manager (which finishes responses for slow readers: C<--max-offload-bytes>).' },
    { name => 'read_timeout', type => 'seconds', default => _c('DEFAULT_READ_TIMEOUT'), min_excl => 0,
      max => _c('MAX_SECONDS'), c => 1, manager => 'read-timeout', group => 'Connections', arg => 'SECS',
      help => 'deadline for a whole request head (then 408)',
      pod => 'Deadline for a whole request head from its first byte: a slow client gets 408 and '
           . 'cannot hold a worker longer. While the head arrives at least --min-head-rate bytes '
           . 'a second, the deadline moves on, up to --read-timeout-max.' },
    { name => 'read_timeout_max', type => 'seconds', default => _c('DEFAULT_READ_TIMEOUT_MAX'),
      min_excl => 0, max => _c('MAX_SECONDS'), c => 1, manager => 'read-timeout-max',
      group => 'Connections', arg => 'SECS',
      help => 'a head arriving fast enough gets up to this (never less than --read-timeout)' },
    { name => 'min_head_rate', type => 'count', default => _c('DEFAULT_MIN_HEAD_RATE'), c => 1,
      manager => 'min-head-rate', group => 'Connections', arg => 'BYTES',
      help => 'each this many bytes of a head buy it a second from its first byte, past --read-timeout (0: never)',
      pod => 'A head that has brought N bytes may take N / BYTES seconds from its first byte when '
           . 'that is more than --read-timeout (never more than --read-timeout-max): one arriving '
           . 'at least this many bytes a second keeps going, a slower one has --read-timeout.' },
    { name => 'keepalive_timeout', type => 'seconds', default => _c('DEFAULT_KEEPALIVE_TIMEOUT'),
      min_excl => 0, max => _c('MAX_SECONDS'), c => 1, manager => 'keepalive-timeout', group => 'Connections', arg => 'SECS',
      help => 'idle time allowed between requests',
      pod => 'Idle time allowed between requests, counted from when the last response has left '
           . 'the server: a client still reading it (its bytes still in the socket) is not idle. '
           . 'See "Slow readers" in F<docs/DESIGN.md>.' },
    { name => 'max_keepalive_reqs', type => 'count', default => _c('DEFAULT_MAX_KEEPALIVE_REQS'),
      c => 1, group => 'Connections', arg => 'N', help => 'requests on one connection',
      pod => 'Requests served on one connection; the last one is answered with '
           . 'C<Connection: close>.' },
    { name => 'disable_keepalive', type => 'bool', default => 0, group => 'Connections',
      negated => ['keepalive'], help => 'close after every response' },
    { name => 'manager', type => 'bool', default => 1, group => 'Connections',
      negated => ['no_manager'],
      help => 'hold idle connections in the connection manager (--no-manager: in the workers)',
      pod => 'Hold idle keep-alive connections and slow request heads in the connection manager. '
           . 'With C<--no-manager>, idle connections stay in a worker until '
           . 'C<--keepalive-timeout>, as in other prefork servers.' },
    { name => 'max_connections', type => 'count', min => 1,
      manager => 'max-connections', group => 'Connections', arg => 'N',
      help => 'connections the manager holds; beyond, the longest idle is closed '
          . '(default: what its open-file limit allows)',
      pod => 'Connections the manager holds at once; when full, the longest-idle one is closed. '
           . 'By default, as many as its open-file limit allows (it raises its soft limit to the '
           . 'hard one and keeps ' . _c('MANAGER_RESERVED_FDS') . ' descriptors for itself). '
           . 'A TLS connection counts from its accept, and once parked counts twice (its '
           . 'encrypted side and its plain one); with none idle, new clients wait in the '
           . 'listen queue.' },
    { name => 'custody', type => 'bool', default => 1, c => 1, group => 'Connections',
      negated => ['no_custody'],
      help => 'the manager holds a copy of each parked connection, so a killed worker loses '
          . 'only its request in flight (--no-custody: off)',
      pod => 'The connection manager holds a copy of every connection parked in a worker, so '
           . 'that a worker killed with KILL (the kernel\'s OOM killer) or ended by the app\'s '
           . 'C<exit> loses only the request it was serving: the manager takes the others over. '
           . 'It costs nothing per request and about 10 us of CPU per keep-alive connection that '
           . 'lives longer than ' . _c('CUSTODY_DELAY_MS') . ' ms (a descriptor passed, watched '
           . 'and closed); a shorter one and C<Connection: close> traffic never pay it. '
           . 'C<--no-custody> saves that where connections carry a few requests each. See '
           . 'F<docs/DESIGN.md>, "Custody of parked connections".' },
    { name => 'keepalive_wait', type => 'seconds', default => 0.5, c => 1, group => 'Connections',
      arg => 'SECS', help => 'how long a worker keeps a served connection parked before the manager takes it',
      pod => 'How long a worker keeps a connection it has just served parked, watching for its '
           . 'next request while it serves other clients, before handing it to the manager. A '
           . 'client that comes back within this time is served by the same worker with no '
           . 'hand-off; 0 hands every quiet connection to the manager at once. The default covers '
           . 'a busy machine, where a client\'s next request can take tens of milliseconds to come '
           . 'back: a shorter wait sends such clients through the manager on every request. Never '
           . 'longer than C<--keepalive-timeout>: a connection idle that long is closed. A worker parks up '
           . 'to ' . _c('MAX_PARKED') . ' connections. When a request has run for '
           . _c('PARK_SLOW_REQUEST_MS') . ' ms, a thread in the worker hands the connections '
           . 'parked there to the manager, where any free worker takes them, so a parked '
           . 'connection does not wait behind another\'s slow request. With an often slow app (a '
           . 'second such request within ' . _c('PARK_PAUSE_MS') / 1000 . ' seconds of the last) '
           . 'parking pauses for ' . _c('PARK_PAUSE_MS') / 1000 . ' seconds, so quiet connections '
           . 'go to the manager at once (see "Parking" in F<docs/DESIGN.md>).' },
    { name => 'worker_quantum', type => 'count', default => 5, min => 1, group => 'Connections',
      arg => 'N', help => 'requests served in a row on one connection while others wait',
      pod => 'Requests a worker serves in a row on one connection before it parks it and looks '
           . 'at the other connections that are waiting.' },

    { name => 'max_request_body', type => 'size', default => _c('DEFAULT_MAX_REQUEST_BODY'), c => 1,
      group => 'Limits', arg => 'BYTES', help => 'larger bodies get 413 (0: no limit)',
      pod => 'Larger bodies get 413, without being read. A limit by default, so that no client '
           . 'can make a worker spool gigabytes to C<$TMPDIR>; 0 means none: raise it for '
           . 'uploads.' },
    { name => 'max_offload_bytes', type => 'size', default => _c('DEFAULT_MAX_OFFLOAD_BYTES'), c => 1,
      group => 'Limits', arg => 'BYTES',
      help => 'a response the client is slow to read: up to this much of its rest goes to the manager (0: none)',
      pod => 'When a client does not read a response as fast as it is written, the worker does '
           . 'not wait: it gives the connection and what is left of the response to the '
           . 'connection manager, which writes it as the client reads, and goes back to work. '
           . 'For an in-memory body (an array), the unsent bytes are copied into anonymous memory '
           . '(a memfd); a rest larger than this stays with the worker, which waits as it always '
           . 'did. A file body\'s rest costs no memory (the manager C<sendfile>s the rest of the '
           . 'file) and is not limited by it. Streaming bodies (C<getline> objects that are not '
           . 'files, C<psgi.streaming> writers) always keep their worker. Needs the manager. '
           . '0 turns in-memory offload off. See "Slow readers" in F<docs/DESIGN.md>.' },
    { name => 'max_offload_total', type => 'size', default => _c('DEFAULT_MAX_OFFLOAD_TOTAL'), c => 1,
      group => 'Limits', arg => 'BYTES',
      help => 'all in-memory rests the manager holds, together (beyond: the worker waits)' },
    { name => 'body_in_memory', type => 'size', default => _c('DEFAULT_BODY_IN_MEMORY'), c => 1,
      group => 'Limits', arg => 'BYTES', help => 'larger bodies go to an unlinked temp file' },
    { name => 'max_request_line', type => 'size', default => _c('DEFAULT_MAX_REQUEST_LINE'),
      min => _c('MIN_REQUEST_LINE'), c => 1, manager => 'max-request-line', group => 'Limits',
      arg => 'BYTES', help => '414 beyond',
      pod => 'A longer request line (method, target, version) gets 414.' },
    { name => 'max_header_bytes', type => 'size', default => _c('DEFAULT_MAX_HEADER_BYTES'),
      max => _c('MAX_HEADER_BYTES_HARD'), c => 1, manager => 'max-header-bytes', group => 'Limits',
      arg => 'BYTES', help => '431 beyond (the whole head)',
      pod => 'A longer request head (request line and header fields) gets 431. A head the '
           . 'manager holds must fit in one frame to a worker, hence the upper bound.' },
    { name => 'max_headers', type => 'count', default => _c('DEFAULT_MAX_HEADERS'), min => 1,
      max => _c('MAX_HEADERS_HARD'), c => 1, group => 'Limits', arg => 'N', help => '431 beyond',
      pod => 'A request with more header fields gets 431.' },

    { name => 'proxy_protocol', type => 'bool', default => 0, c => 1, group => 'Listening',
      manager => 'proxy-protocol',
      help => 'every connection starts with a PROXY header (v1 or v2): REMOTE_ADDR from it',
      pod => 'Every listener requires a PROXY protocol header (version 1 or 2, as HAProxy\'s '
           . 'C<send-proxy> and C<send-proxy-v2> send) before the HTTP request; C<REMOTE_ADDR> '
           . 'and C<REMOTE_PORT> come from it, and C<SERVER_PORT> from its destination port (a '
           . 'C<LOCAL> header, a balancer\'s health check, '
           . 'keeps the socket\'s own). A connection without a valid header is closed without '
           . 'an answer: the server never guesses; it is counted in '
           . 'C<narwhal_proxy_rejected_total{reason="bad_header"}> and logged with its peer (the '
           . 'first at once, the rest summed up every 10 s). Only for listeners that nothing but '
           . 'the balancer can reach, or with C<--proxy-from>; without it, Narwhal warns at start. '
           . 'On a TLS listener the header comes before the TLS handshake (a TCP balancer passing '
           . 'TLS through, as HAProxy\'s C<mode tcp> with C<send-proxy-v2> does), and the '
           . 'connection manager reads it there.' },
    { name => 'tls_cert', alias => ['ssl-cert'], type => 'string', group => 'Listening', arg => 'FILE',
      manager => 'tls-cert',
      help => 'the TLS listeners\' certificate chain (PEM, the server\'s first)',
      pod => 'The certificate chain of the TLS listeners (C<HOST:PORT:ssl>, or every TCP one '
           . 'with C<--enable-ssl>): PEM, the server\'s certificate first. Read by the connection '
           . 'manager, which does TLS for every worker (F<docs/DESIGN.md>, "HTTPS"); checked at '
           . 'start (a missing, unreadable or mismatched file: one line, and no start) and read '
           . 'again on HUP. TLS 1.2 and 1.3 only; Starman\'s C<--ssl-cert> is the same.' },
    { name => 'tls_key', alias => ['ssl-key'], type => 'string', group => 'Listening', arg => 'FILE',
      manager => 'tls-key',
      help => 'its private key (PEM, not encrypted)',
      pod => 'The private key of C<--tls-cert> (PEM, without a passphrase), read as it is. '
           . 'Starman\'s C<--ssl-key> is the same.' },
    { name => 'enable_ssl', alias => ['ssl'], type => 'bool', default => 0, group => 'Listening',
      help => 'every TCP listener is a TLS one (Starman\'s form)',
      pod => 'Every TCP listener is a TLS listener, as if each had C<:ssl> after it '
           . '(Starman\'s C<--enable-ssl>).' },
    { name => 'proxy_from', type => 'list', group => 'Listening', arg => 'CIDR',
      manager => 'proxy-from',
      help => 'with --proxy-protocol, only these peers may connect (repeatable)',
      pod => 'With C<--proxy-protocol>, connections from any other address are closed at once '
           . '(C<10.0.0.0/8>, C<fd00::/8>, or an address; repeatable; IPv4-mapped IPv6 peers '
           . 'match IPv4 entries; unix-socket peers are local processes and always allowed), '
           . 'counted in C<narwhal_proxy_rejected_total{reason="not_allowed"}> and logged as a '
           . 'bad header is.' },
    { name => 'status_listen', type => 'string', group => 'Operations', arg => 'ADDR',
      help => 'serve /status, /status.json, /metrics and /health here (host:port or a path)',
      pod => 'Serve the status pages on this address (C<host:port>, C<:port> or a unix socket '
           . 'path): C</status> (HTML), C</status.json>, C</metrics> (Prometheus text format) and '
           . 'C</health> (200; 503 while the app loads and once a stop or drain has begun). Never one of the app\'s '
           . 'listeners. The connection manager answers them, from C, even when every worker is '
           . 'busy or stuck, so it needs the manager (not C<--no-manager>). Off by default; it '
           . 'shows request lines, so bind it to loopback or a private socket. A unix socket '
           . 'gets C<--socket-mode> and C<--socket-group>, as the app\'s do.' },
    { name => 'request_timeout', type => 'seconds', default => 0, max => _c('MAX_SECONDS'),
      group => 'Operations', arg => 'SECS',
      help => 'end a request running longer: backtrace to the log, 504, worker replaced (0: off)',
      pod => 'A request that has run longer than this is ended: its worker logs where the app '
           . 'is (a Perl backtrace with file and line; a worker stuck in C code says so), answers '
           . 'C<504 Gateway Timeout> if no response byte was sent yet (else the connection is '
           . 'closed), and is replaced. Checked twice a second, so a request may run up to half '
           . 'a second more. 0 (the default) means no limit.' },
    { name => 'max_worker_rss', type => 'count', default => 0, group => 'Operations', arg => 'MB',
      help => 'replace a worker whose resident size passes this, after its request (0: off)',
      pod => 'A worker whose resident size passes this many MiB after a request finishes that '
           . 'request, hands its kept-alive connections to the other workers (or the manager) and is '
           . 'replaced; the error log says how large it was. Checked after every request with one '
           . 'C<getrusage> (the peak size); C</proc> is read only once the peak is over. 0 (the '
           . 'default) means no limit.' },
    { name => 'crash_backoff', type => 'seconds', default => 1, max => _c('MAX_SECONDS'),
      group => 'Operations', arg => 'SECS',
      help => 'a route that killed 3 workers in 10 s (and half its requests) gets 503 for SECS, doubling (0: off)',
      pod => 'A worker that dies while serving a request (a crash signal or an exit; not a KILL or '
           . 'TERM from outside) is charged to the request\'s method and path (the query left out). '
           . 'When the same route has killed three workers within 10 seconds, and at least half '
           . 'the requests to it since its first death, the workers answer it C<503 Service '
           . 'Unavailable> with C<Retry-After: 1> without running the app, for this many seconds; '
           . 'then it is tried again, and if it kills a worker again within twice that time the '
           . 'wait doubles (up to 5 minutes), else it starts over. The master logs each back-off '
           . 'once, with the route and the count; answers are counted in '
           . 'C<narwhal_crash_refused_total>. Every crash is a fork: without this, four clients '
           . 'on a URL that crashes its worker cut everyone else\'s throughput by about 80 times. '
           . '0 turns it off.' },
    { name => 'max_queue_wait', type => 'count', default => 0, max => _c('MAX_SECONDS') * 1000,
      manager => 'max-queue-wait', group => 'Operations', arg => 'MS',
      help => 'a request waiting longer for a free worker gets 503 (0: off)',
      pod => 'When every worker is busy, a complete request that has waited longer than this '
           . 'many milliseconds in the connection manager is answered C<503 Service '
           . 'Unavailable> with C<Retry-After: 1> and closed (counted in C<narwhal_shed_total>), '
           . 'instead of the queue growing without bound. New clients are included: while every '
           . 'worker has been on its request for ' . _c('POOL_STUCK_MS') . ' ms, the manager '
           . 'takes new connections from the listeners itself, so they wait in its queue rather '
           . 'than unseen in the listen queue. Needs the manager. 0 (the default) means no limit.' },

    { name => 'access_log', type => 'string', group => 'Operations', arg => 'PATH',
      help => 'one line per request here (- : stderr), written by C, buffered (USR1 reopens it)',
      pod => 'Append one line per request to this file (C<-> for standard error), written in C by '
           . 'the worker after the response: the client\'s address, the time, the request line, '
           . 'the status, the body bytes sent, the referer and user agent, the duration in '
           . 'microseconds and the worker\'s pid (and, in JSON, the response\'s C<X-Request-Id>). '
           . 'Lines are buffered and written at least once a second, and when the worker is idle '
           . 'or leaves; USR1 reopens the file (the master creates it and gives it to '
           . 'C<--user>). See "The access log" in F<docs/DESIGN.md> for the layouts.' },
    { name => 'access_log_format', type => 'enum', values => [qw(combined json)], default => 'combined',
      group => 'Operations', arg => 'FORMAT',
      help => 'combined (with duration and pid at the end) or json, one object per line' },
    { name => 'access_log_client', type => 'enum', values => [qw(peer forwarded)], default => 'peer',
      group => 'Operations', arg => 'WHO',
      help => 'the access log\'s client: peer (REMOTE_ADDR) or forwarded (a trusted proxy\'s X-Forwarded-For)',
      pod => 'Who the access log\'s client field names. C<peer> (the default): the connection\'s '
           . 'C<REMOTE_ADDR> (the PROXY header\'s source under C<--proxy-protocol>; C<-> on a '
           . 'unix socket). C<forwarded>: the last address of C<X-Forwarded-For> when the request '
           . 'came from a proxy Narwhal trusts, a unix-socket peer (nginx on the same host; the '
           . 'socket\'s mode decides who may connect) or an address in C<--forwarded-from>; else, '
           . 'or when that is not an address, the peer as with C<peer>. Only the log changes: the '
           . 'app\'s C<REMOTE_ADDR> stays the peer\'s.' },
    { name => 'forwarded_from', type => 'list', group => 'Operations', arg => 'CIDR',
      help => 'with --access-log-client forwarded, trust X-Forwarded-For from these TCP peers too (repeatable)' },
    { name => 'drain_delay', type => 'seconds', default => 0, max => _c('MAX_SECONDS'),
      group => 'Process', arg => 'SECS',
      help => 'on TERM/INT/QUIT, /health says 503 and serving goes on this long, then the stop',
      pod => 'On a stop signal, C</health> (see C<--status-listen>) answers 503 at once while the '
           . 'listeners and workers go on serving for this many seconds, so that a load balancer '
           . 'or a Kubernetes readiness probe takes the instance out of its pool before the '
           . 'graceful stop begins. A second stop signal begins it at once. The signal must '
           . 'reach the master alone (systemd: C<KillMode=mixed>; Kubernetes signals the '
           . 'container\'s first process): workers that get it themselves stop at once. '
           . '0 (the default): no drain.' },
    { name => 'graceful_timeout', type => 'seconds', default => 30, group => 'Process', arg => 'SECS',
      help => 'stop: wait this long for requests in flight, then KILL' },
    { name => 'daemonize', alias => ['D'], type => 'bool', default => 0, group => 'Process',
      help => 'run in the background: the command returns (0) once the server listens',
      pod => 'Run in the background, as Starman\'s and plackup\'s C<-D> do: the command forks, '
           . 'the server goes on in a new session (C<setsid>), and the command returns 0 once '
           . 'the listeners are open and the app is loaded (or, when the server cannot start, '
           . 'says why in one line and returns non-zero). Standard input and output go to '
           . 'F</dev/null>, and so does standard error unless C<--error-log> is given; the '
           . 'working directory stays, so relative paths (the app, C<--pid>, a unix socket) '
           . 'mean what they meant. With C<--pid>, the file holds the server\'s pid.' },
    { name => 'pid', alias => ['pid-file'], type => 'string', group => 'Process', arg => 'FILE',
      help => 'write the master\'s pid here' },
    { name => 'error_log', type => 'string', group => 'Process', arg => 'FILE', manager => 'error-log',
      help => 'append errors here instead of stderr (USR1 reopens it, in every process)',
      pod => 'Append stderr (and C<psgi.errors>) to this file instead of stderr; USR1 reopens '
           . 'it in the master, the connection manager and every worker. Narwhal\'s own lines start with the time, C<narwhal[PID]>, the process\'s role '
           . 'and a level (C<2026-11-26T13:40:01.123Z narwhal[1234] master info: ...>); the '
           . 'app\'s lines are left as it wrote them.' },
);

my %BY_NAME = map { $_->{name} => $_ } @TABLE;

# The table, in order (for generators and tests).
sub table { return @TABLE }
sub option { return $BY_NAME{ $_[0] } }

# Names a handler argument may use for an option's opposite (plackup's
# --disable-keepalive arrives as keepalive => 0), from the table.
my %NEGATED = map { my $o = $_; map { $_ => $o->{name} } @{ $o->{negated} || [] } } @TABLE;

# plackup reads "--no-manager app.psgi" as the option with the value
# app.psgi (and then loads ./app.psgi): the switch still takes effect, and
# the user is told how to write it so that nothing is taken.
sub _warn_plackup_value {
    my ($key, $v) = @_;
    (my $flag = $key) =~ tr/_/-/;
    print STDERR "narwhal: plackup took '$v' as the value of --$flag; "
               . "write --$flag=1 before the app\n"
        if defined $v && $v !~ /^(?:0|1|)$/;
}

sub cli_name {
    my ($key) = @_;
    (my $n = $key) =~ tr/_/-/;
    return "--$n";
}

# An option's default as docs/OPTIONS.md and the POD show it.
sub default_text {
    my ($o) = @_;
    return '' unless defined $o->{default};
    return $o->{default} ? 'on' : 'off' if $o->{type} eq 'bool';
    return $o->{default};
}

# How the command line spells an option: a switch that is on by default is
# written --[no-]name.
sub flag_name {
    my ($o) = @_;
    my $name = cli_name($o->{name});
    return $o->{type} eq 'bool' && $o->{default} ? '--[no-]' . substr($name, 2) : $name;
}

# Getopt::Long specs for the command line, from the table.
sub getopt_specs {
    return map { _getopt_spec($_) } @TABLE;
}

sub _getopt_spec {
    my ($o) = @_;
    (my $name = $o->{name}) =~ tr/_/-/;
    my $names = join '|', $name, @{ $o->{alias} || [] };
    return "$names!" if $o->{type} eq 'bool';
    return "$names=s@" if $o->{type} eq 'list';
    return "$names=s";
}

my %CHECK = (
    list    => sub { 1 },
    string  => sub { defined $_[0] && length $_[0] },
    code    => sub { ref $_[0] eq 'CODE' || (defined $_[0] && length $_[0]) },
    bool    => sub { 1 },
    port    => sub { defined $_[0] && $_[0] =~ /^\d+$/ && $_[0] <= 65535 },
    count   => sub { defined $_[0] && $_[0] =~ /^\d+$/ },
    size    => sub { defined $_[0] && $_[0] =~ /^\d+$/ },
    seconds => sub { defined $_[0] && $_[0] =~ /^(?:\d+(?:\.\d*)?|\.\d+)$/ },
    enum    => sub { my ($v, $opt) = @_; defined $v && grep { $_ eq $v } @{ $opt->{values} } },
);

my %WANT = (
    port => 'a port number (0-65535)', count => 'a whole number',
    size => 'a number of bytes', seconds => 'a number of seconds',
    string => 'a value', code => 'Perl code',
);

sub _want {
    my ($opt) = @_;
    return $opt->{type} eq 'enum' ? 'one of ' . join(', ', @{ $opt->{values} }) : $WANT{ $opt->{type} };
}

# Turn handler arguments or parsed command-line values into the canonical
# hash: aliases resolved, kebab-case folded, defaults filled, values checked.
# Dies with a one-line message on a bad value. Unknown names die on the
# command line (Getopt has refused them already) and, for the Plack
# handler (on_unknown), are reported to it.
sub normalize {
    my (%args) = @_;
    my $on_unknown = delete $args{-on_unknown};
    my %o;
    for my $k (sort keys %args) {
        if (my $why = refused($k, $args{$k})) { die "$why\n" }
        next if lc $k eq 'ssl' && !$args{$k};    # (plackup's --disable-ssl: plain HTTP, as ever)
        my @pairs = _canonical($k, $args{$k});
        if (!@pairs) {
            $on_unknown ? $on_unknown->($k) : die "unknown option " . cli_name($k) . "\n";
            next;
        }
        while (my ($key, $value) = splice @pairs, 0, 2) {
            $o{$key} = $value;
        }
    }
    _apply_loader(\%o);
    for my $key (sort keys %o) {
        my $opt = $BY_NAME{$key} or next;
        next unless defined $o{$key};
        $CHECK{ $opt->{type} }->($o{$key}, $opt)
            or die cli_name($key) . ' wants ' . _want($opt) . ", not '$o{$key}'\n";
        _check_bounds($opt, $o{$key});
    }
    # --max-reqs-per-child given: the count is the operator's, and no
    # floor of age holds a worker past it unless asked for too.
    $o{min_worker_lifetime} //= 0 if defined $o{max_reqs_per_child};
    for my $opt (@TABLE) {
        $o{ $opt->{name} } //= $opt->{default} if exists $opt->{default};
    }
    _check_relations(\%o);
    $o{listen} = _listeners(\%o);
    $o{child_exit} = _compile_code($o{child_exit}) if defined $o{child_exit};
    return \%o;
}

# Options of the servers people come from (Starman, Starlet, plackup) that
# Narwhal does not do. Each is refused with its reason, in one line, under
# narwhal and plackup alike, never ignored: a server that ignored
# --enable-ssl would serve plain HTTP to a team that believes it is on
# HTTPS. Returns the reason, or nothing when the option is not one of
# these. $key as given (kebab- or snake_case; plackup's --enable-X and
# --disable-X arrive as X => 1 and X => ''), $value its value.
sub refused {
    my ($key, $value) = @_;
    (my $k = lc $key) =~ s/^-+//;
    $k =~ tr/-/_/;
    return if $BY_NAME{$k} || $NEGATED{$k} || _canonical($k, $value);
    if ($k =~ /^(enable|disable)_(.+)$/) {
        ($k, $value) = ($2, $1 eq 'enable' ? 1 : 0);
        return if $BY_NAME{$k};
    }
    return cli_name($k) . ': ' . Narwhal::Listener::TLS_ONLY() if $k =~ /^ssl_/ || $k =~ /^net_server_ssl/;
    return cli_name($k) . ": Narwhal is not built on Net::Server, and takes none of its arguments"
        if $k =~ /^net_server_/;
    return "--disable-proctitle: Narwhal always names its processes (narwhal master, worker, "
         . "manager: ps and the status page name them so)"
        if $k eq 'proctitle' && !$value;
    return;
}

# --listen and --socket together, each listener once however it is
# spelled: plackup passes a path as both, and ":5000" is "0.0.0.0:5000".
sub _listeners {
    my ($o) = @_;
    my %seen;
    return [ grep { !$seen{ Narwhal::Listener::canonical($_) }++ }
             @{ $o->{listen} || [] }, @{ delete $o->{socket} || [] } ];
}

# (name, value) pairs a given key and value stand for; () when unknown.
sub _canonical {
    my ($k, $v) = @_;
    (my $key = $k) =~ tr/-/_/;
    return ($key, $v) if $BY_NAME{$key};
    if ($NEGATED{$key}) {
        _warn_plackup_value($key, $v);
        return ($NEGATED{$key}, $v ? 0 : 1);
    }
    for my $opt (@TABLE) {
        for my $alias (@{ $opt->{alias} || [] }) {
            (my $a = $alias) =~ tr/-/_/;
            return ($opt->{name}, $v) if $a eq $key && length $alias > 1;
        }
    }
    return;
}

sub _check_bounds {
    my ($opt, $v) = @_;
    my $name = cli_name($opt->{name});
    die "$name must be at least $opt->{min}\n" if defined $opt->{min} && $v < $opt->{min};
    die "$name must be at most $opt->{max}\n" if defined $opt->{max} && $v > $opt->{max};
    die "$name must be more than $opt->{min_excl}\n"
        if defined $opt->{min_excl} && !($v > $opt->{min_excl});
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

# What no single option's bounds can say.
sub _check_relations {
    my ($o) = @_;
    die "--max-header-bytes must be at least --max-request-line\n"
        if $o->{max_header_bytes} < $o->{max_request_line};
    for my $needs (qw(status_listen max_queue_wait)) {
        die cli_name($needs) . " needs the connection manager (it answers while every worker "
            . "is busy): drop --no-manager\n" if $o->{$needs} && !$o->{manager};
    }
    die "--socket-mode wants an octal mode (at most 0777), not '$o->{socket_mode}'\n"
        if defined $o->{socket_mode} && ($o->{socket_mode} !~ /^0?[0-7]{3}$/ || oct($o->{socket_mode}) > 0777);
    die "--socket-group: no group '$o->{socket_group}'\n"
        if defined $o->{socket_group} && $o->{socket_group} !~ /^\d+$/
        && !defined getgrnam($o->{socket_group});
    for my $cidr (@{ $o->{proxy_from} || [] }) {
        die "--proxy-from wants an address or CIDR, not '$cidr'\n" unless Narwhal::Proxy::cidr_ok($cidr);
    }
    die "--proxy-from needs --proxy-protocol\n" if @{ $o->{proxy_from} || [] } && !$o->{proxy_protocol};
    _check_tls($o);
    for my $cidr (@{ $o->{forwarded_from} || [] }) {
        die "--forwarded-from wants an address or CIDR, not '$cidr'\n" unless Narwhal::Proxy::cidr_ok($cidr);
    }
    die "--forwarded-from needs --access-log-client forwarded\n"
        if @{ $o->{forwarded_from} || [] } && $o->{access_log_client} ne 'forwarded';
    die "--min-workers ($o->{min_workers}) must not exceed --max-workers ($o->{max_workers})\n"
        if defined $o->{min_workers} && $o->{min_workers} > $o->{max_workers};
    die "--min-reqs-per-child must not exceed --max-reqs-per-child\n"
        if defined $o->{min_reqs_per_child} && $o->{max_reqs_per_child}
        && $o->{min_reqs_per_child} > $o->{max_reqs_per_child};
}

# TLS listeners: a certificate pair, and the manager (which does their
# TLS, and reads a --proxy-protocol header before each handshake).
sub _check_tls {
    my ($o) = @_;
    my $tls = Narwhal::Listener::wants_tls($o);
    my @pair = grep { defined $o->{$_} } qw(tls_cert tls_key);
    die "--tls-cert and --tls-key are for TLS listeners (HOST:PORT:ssl, or --enable-ssl), "
        . "and there is none\n" if !$tls && @pair;
    return unless $tls;
    die "a TLS listener needs --tls-cert and --tls-key (Starman's --ssl-cert, --ssl-key)\n"
        if @pair < 2;
    die "TLS listeners need the connection manager (it does their TLS): drop --no-manager\n"
        unless $o->{manager};
}

sub _compile_code {
    my ($code) = @_;
    return $code if ref $code eq 'CODE';
    my $sub = eval $code;    ## no critic (ProhibitStringyEval)
    die "--child-exit does not compile: " . ($@ =~ s/\n.*//sr) . "\n" if $@;
    die "--child-exit must be a sub { ... }\n" unless ref $sub eq 'CODE';
    return $sub;
}

# The values the C side reads, in the order it asks for them
# (Narwhal::Acceptor::config_fields): a typed struct is filled from this
# list, never from a hash read by string key. A field the table does not
# have is a build error, caught at start.
sub c_config {
    my ($o) = @_;
    return [ map {
        my $opt = $BY_NAME{$_} && $BY_NAME{$_}{c} ? $BY_NAME{$_}
            : die "the C side asks for '$_', which is not a C option in Narwhal::Options\n";
        $o->{$_} // 0;
    } Narwhal::Acceptor::config_fields() ];
}

# The manager program's arguments, from the options it takes.
sub manager_argv {
    my ($o) = @_;
    return map { my $m = $_->{manager}; map { ("--$m", $_) } ref $o->{ $_->{name} } ? @{ $o->{ $_->{name} } } : $o->{ $_->{name} } }
           grep { $_->{manager} && defined $o->{ $_->{name} } } @TABLE;
}

# The --help text, grouped as the table is.
sub usage {
    my @out = ('Usage: narwhal [options] [app.psgi]', '');
    for my $group (GROUPS) {
        push @out, "$group:";
        push @out, _usage_line($_) for grep { $_->{group} eq $group && ($_->{doc} // 1) } @TABLE;
    }
    push @out,
        '  -E, --env ENV              PLACK_ENV (deployment)',
        '  -I DIR, -M Module          add to @INC, load a module first',
        '  -a, --app FILE             the app (or the last argument; default app.psgi)',
        '  -h, --help                 -v, --version',
        'Signals: TERM/INT/QUIT stop gracefully, HUP restarts workers, TTIN/TTOU add or',
        'remove a worker, USR1 reopens the error and access logs (every process),',
        'USR2 logs manager counts.';
    return join("\n", @out) . "\n";
}

sub _usage_line {
    my ($o) = @_;
    my @short = grep { length == 1 } @{ $o->{alias} || [] };
    my @long = grep { length > 1 } @{ $o->{alias} || [] };
    my $flag = (@short ? "-$short[0], " : '    ') . flag_name($o) . ($o->{arg} ? " $o->{arg}" : '');
    my $help = $o->{help};
    $help .= '; alias ' . join(', ', map { "--$_" } @long) if @long;
    $help .= " (default $o->{default})" if defined $o->{default} && $o->{type} ne 'bool';
    return sprintf('  %-26s %s', $flag, $help) if length $flag <= 26;
    return "  $flag\n" . (' ' x 29) . $help;
}

1;
__END__

=head1 NAME

Narwhal::Options - the one table of Narwhal's options

=head1 DESCRIPTION

The single table behind the C<narwhal> command line, its C<--help>,
C<< Plack::Handler::Narwhal->new(%options) >>, the C side's configuration
and the connection manager's arguments. See L<Narwhal/OPTIONS>.

=cut
