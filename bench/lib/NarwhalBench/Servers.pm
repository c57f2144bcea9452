package NarwhalBench::Servers;
# The servers under test: how to find out whether each is installed, its
# version, and the exact command that starts it on a given port with 4
# workers and keep-alive on (where it has such switches).
use strict;
use warnings;
use Exporter 'import';
use File::Find ();
use Time::HiRes ();
use File::Path qw(make_path);
use NarwhalBench::Util qw(capture which spawn wait_http kill_session reap_nowait);

our @EXPORT_OK = qw(discover_servers start_server await_server stop_server stop_servers alive display_cmd log_tail);

our $WORKERS = 4;

# Plack handlers that are not standalone HTTP servers, or aliases.
my %NOT_A_SERVER = (
    'Apache1'    => 'runs inside Apache httpd (mod_perl), not standalone',
    'Apache2'    => 'runs inside Apache httpd (mod_perl), not standalone',
    'CGI'        => 'a CGI adapter, not an HTTP server',
    'FCGI'       => 'speaks FastCGI, not HTTP',
    'Standalone' => 'an alias of HTTP::Server::PSGI',
);

sub plackup {
    my ($handler, @opts) = @_;
    return sub {
        my ($port, $app) = @_;
        return [ 'plackup', '-s', $handler, '-E', 'deployment', @opts,
                 '--listen', "127.0.0.1:$port", $app ];
    };
}

sub catalog {
    my ($root) = @_;
    return (
        { id => 'narwhal', label => 'Narwhal', kind => 'narwhal',
          cmd => sub {
              my ($port, $app) = @_;
              return [ $^X, "-I$root/blib/lib", "-I$root/blib/arch", "$root/bin/narwhal",
                       '--listen', "127.0.0.1:$port", '--max-workers', $WORKERS, $app ];
          } },
        { id => 'narwhal_nomgr', label => 'Narwhal --no-manager', kind => 'narwhal',
          explicit_only => 1,    # run only when named in --servers
          note => 'Narwhal without its connection manager (keep-alive in the workers)',
          cmd => sub {
              my ($port, $app) = @_;
              return [ $^X, "-I$root/blib/lib", "-I$root/blib/arch", "$root/bin/narwhal",
                       '--listen', "127.0.0.1:$port", '--max-workers', $WORKERS, '--no-manager', $app ];
          } },
        { id => 'starman', label => 'Starman', module => 'Starman', program => 'starman',
          cmd => sub {
              my ($port, $app) = @_;
              return [ 'starman', '--workers', $WORKERS, '--preload-app', '-E', 'deployment',
                       '--listen', "127.0.0.1:$port", $app ];
          } },
        { id => 'starlet', label => 'Starlet', module => 'Starlet', program => 'plackup',
          cmd => plackup('Starlet', '--max-workers', $WORKERS, '--max-keepalive-reqs', 1000) },
        { id => 'feersum', label => 'Feersum', module => 'Feersum', program => 'feersum',
          note => 'no keep-alive in this version: closes after each response',
          cmd => sub {
              my ($port, $app) = @_;
              return [ 'feersum', '-E', 'deployment', "--pre-fork=$WORKERS",
                       '--listen', "127.0.0.1:$port", $app ];
          } },
        { id => 'uwsgi', label => 'uWSGI', program => 'uwsgi', kind => 'uwsgi',
          note => 'keep-alive via --http11-socket, which never delimits a response that has no '
                . 'Content-Length (no chunking, no close): clients wait until their timeout. '
                . '--http-keepalive belongs to the --http router, which stalls ~40 ms per '
                . 'keep-alive request here',
          cmd => sub {
              my ($port, $app) = @_;
              return [ 'uwsgi', '--plugin', 'psgi', '--http11-socket', "127.0.0.1:$port",
                       '--psgi', $app, '--master', '--processes', $WORKERS,
                       '--disable-logging', '--die-on-term' ];
          } },
        { id => 'twiggy', label => 'Twiggy', module => 'Twiggy', program => 'plackup',
          note => 'one process (AnyEvent), no worker option; no keep-alive',
          cmd => plackup('Twiggy') },
        { id => 'http_server_psgi', label => 'HTTP::Server::PSGI', module => 'HTTP::Server::PSGI',
          program => 'plackup', version_from => 'Plack',
          note => 'one process, no keep-alive (Plack\'s reference server)',
          cmd => plackup('HTTP::Server::PSGI') },
        # The set-up prefork servers are usually deployed in: nginx (2
        # workers) in front, the server on a unix socket behind it, upstream
        # keep-alive (32 connections). Run only when named in --servers.
        (map {
            my ($id, $label, $module, $program, $backend) = @$_;
            { id => "${id}_nginx", label => "$label behind nginx", kind => 'front_nginx',
              explicit_only => 1, module => $module, program => $program,
              nginx_workers => 2, backend => $backend,
              note => "$label on a unix socket behind nginx (2 workers, upstream keep-alive 32)" }
        } [ 'narwhal', 'Narwhal', undef, undef, sub {
                my ($sock, $app) = @_;
                [ $^X, "-I$root/blib/lib", "-I$root/blib/arch", "$root/bin/narwhal",
                  '--listen', $sock, '--max-workers', $WORKERS, $app ] } ],
          [ 'starlet', 'Starlet', 'Starlet', 'plackup', sub {
                my ($sock, $app) = @_;
                [ 'plackup', '-s', 'Starlet', '-E', 'deployment', '--max-workers', $WORKERS,
                  '--max-keepalive-reqs', 1000, '--listen', $sock, $app ] } ],
          [ 'starman', 'Starman', 'Starman', 'starman', sub {
                my ($sock, $app) = @_;
                [ 'starman', '--workers', $WORKERS, '--preload-app', '-E', 'deployment',
                  '--listen', $sock, $app ] } ]),
        { id => 'nginx_1w', label => 'nginx 1w', kind => 'nginx', nginx_workers => 1,
          program => 'nginx', note => 'C ceiling: return 200 / static file' },
        { id => 'nginx_2w', label => 'nginx 2w', kind => 'nginx', nginx_workers => 2,
          program => 'nginx', note => 'C ceiling: return 200 / static file' },
    );
}

sub module_version {
    my ($module) = @_;
    my $out = capture($^X, "-M$module", '-e', "print $module->VERSION // 'unknown'");
    return $out =~ /^([\w.\-]+)$/ ? $1 : undef;
}

# Any other Plack::Handler::* installed: try it with plackup's defaults.
sub extra_handlers {
    my ($known, $skipped) = @_;
    my %seen;
    for my $dir (@INC) {
        next unless -d "$dir/Plack/Handler";
        opendir my $dh, "$dir/Plack/Handler" or next;
        $seen{$_}++ for map { /^(\w+)\.pm$/ ? $1 : () } readdir $dh;
        if (-d "$dir/Plack/Handler/HTTP/Server") {
            opendir my $h2, "$dir/Plack/Handler/HTTP/Server";
            $seen{"HTTP::Server::$_"}++ for map { /^(\w+)\.pm$/ ? $1 : () } readdir $h2;
        }
    }
    my @extra;
    for my $h (sort keys %seen) {
        next if $known->{$h};
        if (my $why = $NOT_A_SERVER{$h}) { push @$skipped, "Plack::Handler::$h: $why"; next }
        if (!module_version("Plack::Handler::$h")) {
            push @$skipped, "Plack::Handler::$h: does not load";
            next;
        }
        push @extra, { id => lc($h =~ s/::/_/gr), label => $h, module => "Plack::Handler::$h",
                       program => 'plackup', note => 'found installed; plackup defaults',
                       cmd => plackup($h) };
    }
    return @extra;
}

sub newest_mtime {
    my (@dirs) = @_;
    my $newest = 0;
    File::Find::find(sub { my $m = (stat $_)[9] // 0; $newest = $m if -f _ && $m > $newest }, grep { -d } @dirs);
    return $newest;
}

sub check_narwhal {
    my ($s, $root, $log, $build) = @_;
    return "bin/narwhal not found (not written yet)" unless -e "$root/bin/narwhal";
    if (-e "$root/Makefile.PL" && ($build || !-d "$root/blib")) {
        print "building Narwhal: perl Makefile.PL && make (log: $log)\n";
        my $ok = system("cd '$root' && ($^X Makefile.PL && make) >>'$log' 2>&1") == 0;
        return "build failed (perl Makefile.PL && make): " . log_tail($log) unless $ok;
    }
    if (-d "$root/blib" && newest_mtime(map { "$root/$_" } qw(lib src bin)) > newest_mtime("$root/blib")) {
        $s->{warning} = 'blib/ is older than lib/, src/ or bin/: benchmarking a stale build '
                      . '(run make, or bench/run --build)';
        print "warning: Narwhal: $s->{warning}\n";
    }
    my $v = capture($^X, "-I$root/blib/lib", "-I$root/blib/arch", "-I$root/lib", '-MNarwhal',
                    '-e', 'print Narwhal->VERSION // "dev"');
    $s->{version} = $v =~ /^([\w.\-]+)$/ ? $1 : 'dev';
    return '';
}

# Why this server cannot run here ('' when it can); fills in {version}.
sub check_server {
    my ($s, $root, $log, $build) = @_;
    return check_narwhal($s, $root, $log, $build) if ($s->{kind} // '') eq 'narwhal';
    return "$s->{program} not installed" if $s->{program} && !which($s->{program});
    if ($s->{module}) {
        $s->{version} = module_version($s->{module})
            or return "perl module $s->{module} does not load";
        $s->{version} = "Plack " . module_version($s->{version_from}) if $s->{version_from};
    }
    if (($s->{kind} // '') eq 'uwsgi') {
        my $out = capture('uwsgi', '--plugin', 'psgi', '--help');
        return "uwsgi psgi plugin not available (uwsgi-plugin-psgi)" unless $out =~ /--psgi\b/;
        ($s->{version}) = capture('uwsgi', '--version') =~ /^(\S+)/;
    }
    if (($s->{kind} // '') eq 'nginx') {
        ($s->{version}) = capture('nginx', '-v') =~ m{nginx/(\S+)};
    }
    if (($s->{kind} // '') eq 'front_nginx') {
        return 'nginx not installed' unless which('nginx');
        return check_narwhal($s, $root, $log, $build) if $s->{id} eq 'narwhal_nginx';
    }
    return '';
}

# Returns (list of usable servers, list of "skipped: why" lines).
sub discover_servers {
    my ($root, $log, $build) = @_;
    my (@ok, @skipped);
    my @all = catalog($root);
    my %known = map { my $m = $_->{module} // ''; $m =~ s/^(?:Plack::Handler::)//; ($m => 1) } @all;
    push @all, extra_handlers(\%known, \@skipped);
    for my $s (@all) {
        my $why = check_server($s, $root, $log, $build);
        if ($why) { push @skipped, "$s->{label}: $why" }
        else      { push @ok, $s }
    }
    return (\@ok, \@skipped);
}

sub nginx_conf {
    my ($dir, $port, $workers, $file) = @_;
    return <<"CONF";
user root;
daemon off;
master_process on;
worker_processes $workers;
pid $dir/nginx.pid;
error_log $dir/error.log crit;
worker_rlimit_nofile 65536;
events { worker_connections 16384; }
http {
    access_log off;
    client_body_temp_path $dir/tmp_body;
    proxy_temp_path $dir/tmp_proxy;
    fastcgi_temp_path $dir/tmp_fastcgi;
    uwsgi_temp_path $dir/tmp_uwsgi;
    scgi_temp_path $dir/tmp_scgi;
    default_type text/plain;
    keepalive_requests 1000;
    sendfile on;
    server {
        listen 127.0.0.1:$port;
        location = / { return 200 "Hello World\\n"; }
        location = /file { alias $file; default_type application/octet-stream; }
    }
}
CONF
}

# nginx in front of a server on a unix socket (kind front_nginx).
sub front_nginx_conf {
    my ($dir, $port, $workers, $sock) = @_;
    my $conf = nginx_conf($dir, $port, $workers, '/dev/null');
    my $server = index($conf, '    server {');
    return substr($conf, 0, $server) . <<"CONF";
    upstream app {
        server unix:$sock;
        keepalive 32;
    }
    server {
        listen 127.0.0.1:$port;
        location / {
            proxy_pass http://app;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host \$host;
            proxy_set_header X-Forwarded-For \$remote_addr;
        }
    }
}
CONF
}

sub front_nginx_cmd {
    my ($s, $port, $app, $ctx) = @_;
    my $dir = "$ctx->{tmp}/$s->{id}-$port";
    make_path($dir);
    my $sock = "$dir/app.sock";
    open my $fh, '>', "$dir/nginx.conf" or die "$dir/nginx.conf: $!\n";
    print $fh front_nginx_conf($dir, $port, $s->{nginx_workers}, $sock);
    close $fh;
    my $backend = join ' ', map { "'$_'" } @{ $s->{backend}->($sock, $app) };
    # both in one session: the harness stops the session
    return [ 'sh', '-c', "$backend & exec nginx -p '$dir/' -c '$dir/nginx.conf' -e '$dir/error.log'" ];
}

sub server_cmd {
    my ($s, $port, $app, $ctx) = @_;
    return front_nginx_cmd($s, $port, $app, $ctx) if ($s->{kind} // '') eq 'front_nginx';
    return $s->{cmd}->($port, $app) unless ($s->{kind} // '') eq 'nginx';
    my $dir = "$ctx->{tmp}/$s->{id}-$port";
    make_path($dir);
    open my $fh, '>', "$dir/nginx.conf" or die "$dir/nginx.conf: $!\n";
    print $fh nginx_conf($dir, $port, $s->{nginx_workers}, $ctx->{file});
    close $fh;
    return [ 'nginx', '-p', "$dir/", '-c', "$dir/nginx.conf", '-e', "$dir/error.log" ];
}

# The command line as it is shown in the results: no temp dirs, no ports.
sub display_cmd {
    my ($cmd, $ctx) = @_;
    my $s = join ' ', map { /[\s'"]/ ? "'$_'" : $_ } @$cmd;
    $s =~ s/\Q$ctx->{root}\E\///g;
    $s =~ s/\Q$ctx->{tmp}\E/\$TMP/g;
    $s =~ s/127\.0\.0\.1:\d+/127.0.0.1:PORT/g;
    $s =~ s/-\d+\//-PORT\//g;
    $s =~ s/^\Q$^X\E /perl /;
    return $s;
}

# Start a server for an app and wait until it answers $ready_path.
# Returns an instance hash; {error} is set if it did not come up.
sub start_server {
    my ($s, $app, $ctx, $tag, $port) = @_;
    $port //= NarwhalBench::Util::free_port();
    my $cmd = server_cmd($s, $port, $app, $ctx);
    my $log = "$ctx->{tmp}/$tag-$s->{id}.log";
    my $inst = { server => $s, port => $port, log => $log, cmd => $cmd,
                 app => $app, ctx => $ctx, tag => $tag,
                 cmdline => display_cmd($cmd, $ctx) };
    $inst->{pid} = spawn($cmd, $log, { BENCH_FILE => $ctx->{file}, PLACK_ENV => 'deployment' });
    return $inst;
}

sub await_server {
    my ($inst, $ready_path, $bound) = @_;
    my $why = wait_http($inst->{pid}, $inst->{port}, $ready_path, $bound);
    return '' unless $why;
    if (!$inst->{retried} && log_tail($inst->{log}) =~ /in use/i) {
        # someone took the port between our probe and the server's bind: once more
        stop_server($inst);
        my $again = start_server($inst->{server}, $inst->{app}, $inst->{ctx}, $inst->{tag});
        %$inst = (%$again, retried => 1);
        return await_server($inst, $ready_path, $bound);
    }
    $inst->{error} = $why . ': ' . log_tail($inst->{log});
    stop_server($inst);
    return $inst->{error};
}

sub log_tail {
    my ($log) = @_;
    open my $fh, '<', $log or return '(no log)';
    my @lines = grep { /\S/ } <$fh>;
    my $tail = join ' | ', map { s/\s+$//r } @lines[ ($#lines > 2 ? $#lines - 2 : 0) .. $#lines ];
    return length $tail ? $tail : '(empty log)';
}

sub stop_server {
    my ($inst, $grace) = @_;
    return unless $inst && $inst->{pid};
    kill_session($inst->{pid}, $grace // 2);   # no need to wait out graceful shutdowns
    delete $inst->{pid};
}

# Stop several at once: TERM them all, then wait (graceful shutdowns overlap).
sub stop_servers {
    my (@insts) = grep { $_->{pid} } @_;
    kill 'TERM', -$_->{pid} for @insts;
    my $deadline = Time::HiRes::time() + 2;
    while (Time::HiRes::time() < $deadline) {
        reap_nowait($_->{pid}) for @insts;
        last unless grep { NarwhalBench::Util::session_pids($_->{pid}) } @insts;
        Time::HiRes::sleep(0.05);
    }
    stop_server($_, 0) for @insts;  # KILLs what is left
}

sub alive { my ($inst) = @_; return $inst->{pid} && reap_nowait($inst->{pid}) }

1;
