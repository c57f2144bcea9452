use strict;
use warnings;
use Test::More;
use Getopt::Long ();
use Storable ();
use lib 't/lib';
use NarwhalTest qw(root free_port spawn_server narwhal_cmd http_get wait_until
                   manager_built missing missing_all);
use Narwhal::Listener ();
use Narwhal::Options ();

# eg/kubernetes.yaml, the manifest docs/DEPLOY.md gives, holds against the
# server it runs:
#  - its narwhal arguments are options narwhal takes (parsed as the command
#    line is, then the server started with them, on free ports);
#  - every probe (and Prometheus's annotations) asks a port narwhal listens
#    on, as the pod sees it, and a path that answers there (200-399, what a
#    probe counts as success); /health turns 503 once a stop begins;
#  - the Service reaches the app's port, and selects the pods;
#  - terminationGracePeriodSeconds outlasts preStop + --drain-delay +
#    --graceful-timeout, --request-timeout ends a request before the KILL;
#  - CPU and memory have requests and limits, and the memory limit holds
#    the pool at --max-worker-rss;
#  - the arguments are strings to YAML (Kubernetes refuses a number there).
# The server runs eg/hello.psgi in place of the manifest's app, and hello
# answers every path. The checks are subs returning what is wrong; the end of the file runs
# them on broken copies of the manifest, one fault each, and each must say
# so: a check that cannot fail fails there.

my $ROOT = root();
my $FILE = "$ROOT/eg/kubernetes.yaml";
eval { require YAML; 1 } or missing_all('YAML (libyaml-perl) is not installed');

my $TEXT = do { open(my $fh, '<', $FILE) or die "$FILE: $!"; local $/; <$fh> };
my @DOCS = YAML::Load($TEXT);

# (a copy of the manifest's documents to break)
sub docs_copy { return @{ Storable::dclone(\@DOCS) } }

# --- what the manifest says, and what is wrong with it without a server ---

# Returns { problems => [...], and what the later checks need }.
sub analyse {
    my (@docs) = @_;
    my %info = (problems => []);
    my $bad = sub { push @{ $info{problems} }, join '', @_ };
    my ($deploy) = grep { ref eq 'HASH' && ($_->{kind} // '') eq 'Deployment' } @docs;
    my ($service) = grep { ref eq 'HASH' && ($_->{kind} // '') eq 'Service' } @docs;
    $bad->('no Deployment') unless $deploy;
    $bad->('no Service') unless $service;
    return \%info unless $deploy;
    my $pod = $deploy->{spec}{template} // {};
    my $labels = $pod->{metadata}{labels} // {};
    my $matches = sub {
        my ($sel) = @_;
        return ref $sel eq 'HASH' && %$sel
            && !grep { ($labels->{$_} // "\0") ne ($sel->{$_} // '') } keys %$sel;
    };
    $bad->("the Deployment's selector does not match its pods' labels")
        unless $matches->($deploy->{spec}{selector}{matchLabels});
    my ($c) = grep { (($_->{command} // [])->[0] // '') =~ m{(?:^|/)narwhal$} }
                   @{ $pod->{spec}{containers} // [] };
    $bad->('no container whose command is narwhal'), return \%info unless $c;
    $info{container} = $c;

    # The arguments, parsed as narwhal parses its command line.
    my @argv = (@{ $c->{command} }[1 .. $#{ $c->{command} }], @{ $c->{args} // [] });
    $info{argv} = [@argv];
    my ($opts, %opt, @warnings);
    # (Starman's and plackup's options narwhal refuses with a reason, as
    # the command line does before Getopt)
    for my $arg (@argv) {
        last if $arg eq '--';
        my ($name, $value) = $arg =~ /^--([A-Za-z][\w-]*)(?:=(.*))?$/s or next;
        my $why = Narwhal::Options::refused($name, $value // 1) or next;
        $bad->("narwhal would refuse its arguments: $why");
    }
    my $p = Getopt::Long::Parser->new(config => [qw(no_ignore_case bundling_values no_auto_abbrev)]);
    {
        local $SIG{__WARN__} = sub { push @warnings, $_[0] };
        $p->getoptionsfromarray(\@argv, \%opt, Narwhal::Options::getopt_specs(),
                                'app|a=s' => \$opt{app}, 'env|E=s' => \my $env)
            or $bad->('narwhal would refuse its arguments: ', lcfirst($warnings[0] // '?') =~ s/\n.*//sr);
    }
    my $app = delete $opt{app} // shift @argv;
    $bad->("arguments after the app: @argv") if @argv;
    $bad->('no app file among the arguments') unless defined $app;
    $info{app} = $app;
    $opts = eval { Narwhal::Options::normalize(%opt) }
        or $bad->('narwhal would refuse its arguments: ', $@ =~ s/\n.*//sr), return \%info;
    $info{options} = $opts;

    # Ports: each the container declares is one narwhal listens on.
    my %listens;    # port => 'app' or 'status'
    for my $l (@{ $opts->{listen} }) {
        my $spec = Narwhal::Listener::parse_spec($l);
        $bad->("--listen $l: a unix socket, which no probe or Service reaches"), next if $spec->{path};
        $bad->("--listen $l: on loopback, which the kubelet and the Service cannot reach")
            if $spec->{host} =~ /^(?:127\.|::1$|localhost$)/;
        $listens{ $spec->{port} } = 'app';
    }
    if (defined $opts->{status_listen}) {
        my $spec = Narwhal::Listener::parse_spec($opts->{status_listen});
        if ($spec->{path} || $spec->{host} =~ /^(?:127\.|::1$|localhost$)/) {
            $bad->("--status-listen $opts->{status_listen}: the kubelet's probes cannot reach it");
        } else {
            $listens{ $spec->{port} } = 'status';
        }
    } else {
        $bad->('no --status-listen: no /health for the probes');
    }
    $info{listens} = \%listens;
    my %by_name;
    for my $port (@{ $c->{ports} // [] }) {
        my $n = $port->{containerPort} // '';
        $bad->("containerPort $n: narwhal does not listen there") unless $listens{$n};
        $by_name{ $port->{name} } = $n if defined $port->{name};
    }
    $bad->("port $_: narwhal listens there, the container does not declare it")
        for grep { my $n = $_; !grep { ($_->{containerPort} // '') eq $n } @{ $c->{ports} // [] } }
            sort keys %listens;
    # (a port as a probe or the Service names it: a name or a number)
    my $resolve = sub {
        my ($port) = @_;
        return undef unless defined $port;
        return $port =~ /^\d+$/ ? $port : $by_name{$port};
    };

    # Probes: each an httpGet to a port narwhal listens on.
    my @asks;    # [what, port, path]
    for my $kind (qw(startupProbe readinessProbe livenessProbe)) {
        my $probe = $c->{$kind} or next;
        my $get = $probe->{httpGet} or $bad->("$kind: not an httpGet"), next;
        $bad->("$kind: scheme $get->{scheme} (narwhal speaks HTTP)")
            if ($get->{scheme} // 'HTTP') ne 'HTTP';
        $bad->("$kind: a host of its own ($get->{host}): the kubelet asks the pod's address")
            if defined $get->{host};
        my $port = $resolve->($get->{port});
        $bad->("$kind: port ", $get->{port} // '(none)', ' is no port of the container'), next
            unless defined $port;
        $bad->("$kind: narwhal does not listen on port $port"), next unless $listens{$port};
        push @asks, [ $kind, $port, $get->{path} // '/' ];
    }
    $bad->("no $_") for grep { !$c->{$_} } qw(readinessProbe livenessProbe);
    $bad->("the readiness probe asks the app's port, not /health on the status port: "
           . 'it would fail while every worker is busy, and take the pod out then')
        if $c->{readinessProbe} && grep { $_->[0] eq 'readinessProbe' && $listens{ $_->[1] } ne 'status' } @asks;
    $bad->("the startup probe asks the app's port: a path of the app may redirect, need a login or "
           . 'be slow; /health on the status port says 200 once the workers serve')
        if grep { $_->[0] eq 'startupProbe' && $listens{ $_->[1] } ne 'status' } @asks;
    my $ann = $pod->{metadata}{annotations} // {};
    if (($ann->{'prometheus.io/scrape'} // '') eq 'true') {
        my $port = $ann->{'prometheus.io/port'};
        if (!defined $port || !$listens{$port}) {
            $bad->('prometheus.io/port: narwhal does not listen on ', $port // '(none)');
        } else {
            push @asks, [ 'prometheus.io annotations', $port, $ann->{'prometheus.io/path'} // '/metrics' ];
        }
    }
    $info{asks} = \@asks;

    # The Service: the app's port, on these pods.
    if ($service) {
        $bad->("the Service's selector does not match the Deployment's pods")
            unless $matches->($service->{spec}{selector});
        my @ports = @{ $service->{spec}{ports} // [] };
        $bad->('the Service has no port') unless @ports;
        for my $sp (@ports) {
            my $to = $resolve->($sp->{targetPort} // $sp->{port});
            $bad->('the Service sends port ', $sp->{port} // '?', ' to ', $sp->{targetPort} // '?',
                   ': not the app\'s port')
                unless defined $to && ($listens{$to} // '') eq 'app';
        }
    }

    # Time: the grace period counts from the deletion; preStop runs first,
    # then TERM: the drain, then the graceful stop, KILL at its end, the
    # reaping (0.5 s at most) and the exit after it.
    my $pre = $c->{lifecycle}{preStop};
    my $sleep = !$pre ? undef
              : $pre->{sleep} ? $pre->{sleep}{seconds}
              : $pre->{exec} && ($pre->{exec}{command}[0] // '') =~ m{(?:^|/)sleep$} ? $pre->{exec}{command}[1]
              : undef;
    $bad->('no preStop sleep: the pod would stop accepting before the endpoints know it is going')
        unless defined $sleep && $sleep =~ /^\d+(?:\.\d+)?$/ && $sleep > 0;
    $sleep //= 0;
    my $grace = $pod->{spec}{terminationGracePeriodSeconds};
    my $needed = $sleep + $opts->{drain_delay} + $opts->{graceful_timeout};
    $bad->('terminationGracePeriodSeconds ', $grace // '(default 30)', " is not over preStop $sleep + "
           . "--drain-delay $opts->{drain_delay} + --graceful-timeout $opts->{graceful_timeout} "
           . '+ 2 (the KILL, the reaping, the exit): the kubelet would KILL the requests in flight')
        unless ($grace // 30) >= $needed + 2;
    $bad->('--request-timeout ', $opts->{request_timeout}, ' is not under --graceful-timeout ',
           $opts->{graceful_timeout}, ': a long request would meet the KILL, not its 504')
        if $opts->{request_timeout} && $opts->{request_timeout} >= $opts->{graceful_timeout};

    # Resources.
    my $res = $c->{resources} // {};
    for my $which (qw(requests limits)) {
        $bad->("no $which.$_") for grep { !defined $res->{$which}{$_} } qw(cpu memory);
    }
    my $limit = mebibytes($res->{limits}{memory});
    my $request = mebibytes($res->{requests}{memory});
    $bad->('requests.memory over limits.memory')
        if defined $limit && defined $request && $request > $limit;
    my ($cpu_limit, $cpu_request) = map { cpus($res->{$_}{cpu}) } qw(limits requests);
    $bad->('requests.cpu over limits.cpu')
        if defined $cpu_limit && defined $cpu_request && $cpu_request > $cpu_limit;
    if (defined $limit) {
        if (!$opts->{max_worker_rss}) {
            $bad->('no --max-worker-rss: a worker that grows meets the OOM killer, not a replacement');
        } else {
            # every worker at the limit, one more (a recycled worker's
            # successor), and 64 MiB for the master and the manager
            my $pool = ($opts->{max_workers} + 1) * $opts->{max_worker_rss} + 64;
            $bad->("limits.memory $res->{limits}{memory} is under (--max-workers $opts->{max_workers} + 1) "
                   . "x --max-worker-rss $opts->{max_worker_rss} MiB + 64 MiB = $pool MiB")
                if $limit < $pool;
        }
    }
    return \%info;
}

# "2Gi", "512Mi", "2G", "1000000000": in MiB (undef: not a quantity).
sub mebibytes {
    my ($q) = @_;
    return undef unless defined $q && $q =~ /^(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)?$/;
    my %unit = ('' => 1, Ki => 2**10, Mi => 2**20, Gi => 2**30, Ti => 2**40,
                k => 1e3, M => 1e6, G => 1e9, T => 1e12);
    return $1 * $unit{ $2 // '' } / 2**20;
}

# "2", "500m", "1.5": in CPUs.
sub cpus {
    my ($q) = @_;
    return undef unless defined $q && $q =~ /^(\d+(?:\.\d+)?)(m)?$/;
    return $2 ? $1 / 1000 : $1;
}

# The command and args as written: a plain scalar YAML reads as a number, a
# boolean or null (8, 0.5, true, ~) is not a string, and Kubernetes refuses
# the manifest. YAML.pm loads them all as strings, so the text says it.
sub unquoted_non_strings {
    my ($text) = @_;
    my @bad;
    my $in;
    for my $line (split /\n/, $text) {
        next if $line =~ /^\s*(?:#|$)/;
        if ($line =~ /^(\s*)(?:command|args):\s*$/) { $in = length $1; next }
        next unless defined $in;
        if ($line =~ /^(\s*)-\s+(.*?)\s*(?:\s#.*)?$/ && length($1) >= $in) {
            my $v = $2;
            push @bad, $v if $v =~ /^(?:[-+]?(?:\d[\d_]*(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|0x[\da-fA-F]+|0o?[0-7]+
                                       |true|false|yes|no|on|off|y|n|null|~)$/xi;
            next;
        }
        undef $in;
    }
    return @bad;
}

# --- against the server ---

# The argv with each listener on 127.0.0.1 and a free port, and the app
# replaced by eg/hello.psgi. Returns (argv, { manifest port => free port }).
sub local_argv {
    my ($info) = @_;
    my %port;
    my @argv = @{ $info->{argv} };
    my %addr = map { $_ => 1 } @{ $info->{options}{listen} }, $info->{options}{status_listen} // ();
    for my $arg (@argv) {
        my ($flag, $value) = $arg =~ /^(--[\w-]+=)(.*)$/ ? ($1, $2) : ('', $arg);
        next unless $addr{$value};
        my $spec = Narwhal::Listener::parse_spec($value);
        my $free = $port{ $spec->{port} } //= free_port();
        $arg = "${flag}127.0.0.1:$free";
    }
    $argv[-1] eq $info->{app} or die "the app is not the last argument\n";
    $argv[-1] = "$ROOT/eg/hello.psgi";
    return (\@argv, \%port);
}

# What a probe would see: each ask's port (the manifest's, mapped to the
# free one the server listens on) and path answers 200-399.
sub ask_problems {
    my ($info, $port) = @_;
    my @bad;
    for my $ask (@{ $info->{asks} }) {
        my ($what, $p, $path) = @$ask;
        my $free = $port->{$p} or push(@bad, "$what: narwhal does not listen on $p"), next;
        my $r = http_get($free, $path);
        push @bad, "$what: GET $path on port $p answered $r->{status}"
            unless $r->{status} >= 200 && $r->{status} < 400;
    }
    return @bad;
}

# --- the manifest as shipped ---

my $info = analyse(@DOCS);
is_deeply($info->{problems}, [], 'eg/kubernetes.yaml: nothing wrong without a server')
    or diag map { "  $_\n" } @{ $info->{problems} };
is_deeply([ unquoted_non_strings($TEXT) ], [], 'eg/kubernetes.yaml: command and args are strings');
ok(scalar @{ $info->{asks} // [] } >= 3, 'it has probes to ask');

my ($server, $ports);
SKIP: {
    manager_built() or missing('the connection manager is not built (--status-listen needs it)', 2);
    my $argv;
    ($argv, $ports) = local_argv($info);
    my ($app_port) = grep { $info->{listens}{$_} eq 'app' } keys %$ports;
    $server = eval { spawn_server(command => [ narwhal_cmd(), @$argv ], port => $ports->{$app_port}) };
    ok($server, "narwhal starts with the manifest's arguments")
        or diag("narwhal @$argv: $@"), skip('no server', 1);
    # (as the kubelet does: the other probes once the startup probe says yes)
    my ($startup) = grep { $_->[0] eq 'startupProbe' } @{ $info->{asks} };
    wait_until(sub { http_get($ports->{ $startup->[1] }, $startup->[2])->{status} == 200 }, 30)
        if $startup;
    my @bad = ask_problems($info, $ports);
    is_deeply(\@bad, [], 'every probe asks a port narwhal listens on and a path that answers there')
        or diag map { "  $_\n" } @bad;
}

# --- each check fails on a manifest that is wrong ---
# (one fault per copy; the server above answers the asks. Each must be
# found, by the check that names it.)

my @faults = (
    [ 'readiness probe on a path narwhal does not serve', sub { $_[0]{readinessProbe}{httpGet}{path} = '/healthz' },
      qr{readinessProbe: GET /healthz on port 9000 answered 404}, 'live' ],
    [ "startup probe on the app's port", sub { $_[0]{startupProbe}{httpGet}{port} = 'http' },
      qr{the startup probe asks the app's port} ],
    [ 'liveness probe on a path narwhal does not serve', sub { $_[0]{livenessProbe}{httpGet}{path} = '/status/health' },
      qr{livenessProbe: GET /status/health on port 9000 answered 404}, 'live' ],
    [ 'liveness probe on a port nothing listens on', sub { $_[0]{livenessProbe}{httpGet}{port} = 9001 },
      qr{livenessProbe: narwhal does not listen on port 9001} ],
    [ 'probe naming a port the container lacks', sub { $_[0]{readinessProbe}{httpGet}{port} = 'metrics' },
      qr{readinessProbe: port metrics is no port of the container} ],
    [ 'readiness probe on the app port', sub { $_[0]{readinessProbe}{httpGet}{port} = 'http' },
      qr{readiness probe asks the app's port} ],
    [ 'containerPort not the one narwhal listens on', sub { $_[0]{ports}[0]{containerPort} = 8080 },
      qr{containerPort 8080: narwhal does not listen there} ],
    [ '--status-listen moved, probes not', sub { s/^:9000$/:9100/ for @{ $_[0]{args} } },
      qr{readinessProbe: narwhal does not listen on port 9000} ],
    [ 'status on loopback', sub { s/^:9000$/127.0.0.1:9000/ for @{ $_[0]{args} } },
      qr{--status-listen 127\.0\.0\.1:9000: the kubelet's probes cannot reach it} ],
    [ 'an option narwhal does not have', sub { unshift @{ $_[0]{args} }, '--graceful-timout', '20' },
      qr{narwhal would refuse its arguments: unknown option: graceful-timout$} ],
    [ 'an option of Starman\'s narwhal refuses', sub { push @{ $_[0]{args} }, '--ssl-ca', 'ca.pem' },
      qr{narwhal would refuse its arguments: --ssl-ca: } ],
    [ 'a value narwhal refuses', sub { s/^5$/five/ for @{ $_[0]{args} } },
      qr{narwhal would refuse its arguments: --drain-delay wants a number of seconds} ],
    [ 'grace period too short', sub { $_[1]{terminationGracePeriodSeconds} = 30 },
      qr{terminationGracePeriodSeconds 30 is not over preStop 5 \+ --drain-delay 5 \+ --graceful-timeout 20} ],
    [ 'no grace period (the default 30)', sub { delete $_[1]{terminationGracePeriodSeconds} },
      qr{terminationGracePeriodSeconds \(default 30\) is not over} ],
    [ 'graceful timeout raised alone', sub { my $g = $_[0]{args}; $g->[ (grep { $g->[$_] eq '--graceful-timeout' } 0 .. $#$g)[0] + 1 ] = 35 },
      qr{terminationGracePeriodSeconds 40 is not over preStop 5 \+ --drain-delay 5 \+ --graceful-timeout 35} ],
    [ 'no preStop', sub { delete $_[0]{lifecycle} }, qr{no preStop sleep} ],
    [ 'preStop as exec sleep, too long', sub { $_[0]{lifecycle}{preStop} = { exec => { command => [ 'sleep', 15 ] } } },
      qr{is not over preStop 15 } ],
    [ 'request timeout past the graceful timeout', sub { s/^15$/25/ for @{ $_[0]{args} } },
      qr{--request-timeout 25 is not under --graceful-timeout 20} ],
    [ 'no memory limit', sub { delete $_[0]{resources}{limits}{memory} }, qr{no limits\.memory} ],
    [ 'no CPU limit', sub { delete $_[0]{resources}{limits}{cpu} }, qr{no limits\.cpu} ],
    [ 'no requests', sub { delete $_[0]{resources}{requests} }, qr{no requests\.cpu} ],
    [ 'memory limit under the pool', sub { $_[0]{resources}{limits}{memory} = $_[0]{resources}{requests}{memory} = '1Gi' },
      qr{limits\.memory 1Gi is under \(--max-workers 8 \+ 1\) x --max-worker-rss 200 MiB} ],
    [ 'no --max-worker-rss', sub { my $g = $_[0]{args}; my ($i) = grep { $g->[$_] eq '--max-worker-rss' } 0 .. $#$g; splice @$g, $i, 2 },
      qr{no --max-worker-rss} ],
    [ 'Service to the status port', sub { $_[2]{spec}{ports}[0]{targetPort} = 'status' },
      qr{the Service sends port 80 to status: not the app's port} ],
    [ 'Service selecting other pods', sub { $_[2]{spec}{selector} = { app => 'other' } },
      qr{the Service's selector does not match} ],
    [ 'no readiness probe', sub { delete $_[0]{readinessProbe} }, qr{^no readinessProbe$} ],
    [ 'Prometheus annotation on a port nothing listens on', sub { $_[3]{'prometheus.io/port'} = '9100' },
      qr{prometheus\.io/port: narwhal does not listen on 9100} ],
    [ 'Prometheus annotation on a path not served', sub { $_[3]{'prometheus.io/path'} = '/stats' },
      qr{prometheus\.io annotations: GET /stats on port 9000 answered 404}, 'live' ],
);
for my $f (@faults) {
    my ($name, $break, $want, $live) = @$f;
    SKIP: {
        skip("$name: needs the server above", 1) if $live && !($server && $ports);
        my @docs = docs_copy();
        my ($deploy) = grep { $_->{kind} eq 'Deployment' } @docs;
        my ($service) = grep { $_->{kind} eq 'Service' } @docs;
        my $spec = $deploy->{spec}{template}{spec};
        $break->($spec->{containers}[0], $spec, $service, $deploy->{spec}{template}{metadata}{annotations});
        my $b = analyse(@docs);
        my @found = @{ $b->{problems} };
        push @found, ask_problems($b, $ports) if $live && $b->{asks};
        ok(scalar(grep { /$want/ } @found), "a manifest with $name fails")
            or diag "found instead:\n", map { "  $_\n" } @found;
    }
}
(my $unquoted = $TEXT) =~ s/^(\s*- )"8"$/${1}8/m;
is_deeply([ unquoted_non_strings($unquoted) ], ['8'], 'a manifest with "8" unquoted in args fails');
is_deeply([ unquoted_non_strings("  args:\n    - \"--max-workers\"\n    - 8\n    - '2'\n    - true\n  ports:\n    - name: x\n") ],
          [ '8', 'true' ], 'a number or a boolean left unquoted in args is found');

# A stop: /health says 503 at once, through the drain; a second TERM ends
# the drain.
SKIP: {
    skip('no server', 2) unless $server && $ports;
    my ($status_port) = grep { $info->{listens}{$_} eq 'status' } keys %$ports;
    kill TERM => $server->pid;
    my $r = wait_until(sub { my $r = http_get($ports->{$status_port}, '/health'); $r->{status} == 503 && $r }, 3);
    ok($r, '/health answers 503 once a stop began (the readiness probe fails)');
    kill TERM => $server->pid;
    my $status = $server->wait_exit(5);
    is($status, 0, 'a second TERM ends the drain, and narwhal exits 0')
        or diag $server->log_text;
}

done_testing();
