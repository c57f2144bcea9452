package Narwhal::CLI;
use strict;
use warnings;
use Getopt::Long ();
use Narwhal ();
use Narwhal::Options ();

# The narwhal command: parse, check, run. Every failure before the server
# runs is one line on stderr and a non-zero exit.

use constant EXIT_USAGE => 2;
use constant EXIT_FAIL  => 1;

sub run {
    my ($class, @argv) = @_;
    my $code = eval { _run(@argv) };
    return $code if defined $code;
    my $err = $@;
    $err =~ s/\n.*//s;
    my $usage = $err =~ s/^usage: //;
    print STDERR "narwhal: $err\n";
    return $usage || $err =~ /^(?:unknown option|option )/ ? EXIT_USAGE : EXIT_FAIL;
}

sub _run {
    my @argv = @_;
    my %opt;
    my ($help, $version, @inc, @modules, $env);
    my $p = Getopt::Long::Parser->new(config => [qw(no_ignore_case bundling_values
                                                    no_auto_abbrev)]);
    my @warnings;
    local $SIG{__WARN__} = sub { push @warnings, $_[0] };
    $p->getoptionsfromarray(\@argv, \%opt, Narwhal::Options::getopt_specs(),
        'help|h' => \$help, 'version|v' => \$version, 'I=s' => \@inc,
        'M=s' => \@modules, 'env|E=s' => \$env, 'app|a=s' => \$opt{app})
        or die lcfirst($warnings[0] // "bad options\n");
    if ($help) { print usage(); return 0 }
    if ($version) { print "Narwhal $Narwhal::VERSION (perl $^V)\n"; return 0 }
    my $file = delete $opt{app};
    $file //= shift @argv;
    $file //= 'app.psgi';
    die "unexpected argument '$argv[0]'\n" if @argv;
    die "cannot find the app file '$file'\n" unless -f $file;
    unshift @INC, @inc;
    $ENV{PLACK_ENV} = $env // $ENV{PLACK_ENV} // 'deployment';
    for my $m (@modules) {
        eval "require $m; 1" or die "cannot load module $m: " . ($@ =~ s/\n.*//sr) . "\n";
    }
    my $options = eval { Narwhal::Options::normalize(%opt) } or die "usage: $@";
    require Narwhal::Master;
    return Narwhal::Master->new(
        options  => $options,
        load_app => sub { _load_psgi($file) },
    )->run;
}

sub _load_psgi {
    my ($file) = @_;
    require Plack::Util;
    my $app = Plack::Util::load_psgi($file);
    die "$file did not return a code reference\n" unless ref $app;
    return $app;
}

sub usage {
    return <<'USAGE';
Usage: narwhal [options] [app.psgi]

Listening (repeatable; default 0.0.0.0:5000):
  -l, --listen ADDR          host:port, :port, [::1]:port or /path/to.sock
  -o, --host HOST            -p, --port PORT
  -S, --socket PATH          a unix socket
      --backlog N            listen queue length (1024)
Workers:
      --max-workers N        worker processes (4); alias --workers
      --max-reqs-per-child N requests before a worker is replaced (10000);
                             alias --max-requests; 0 = never
      --min-reqs-per-child N replace each worker at a random count in [N, max]
      --spawn-interval SECS  space worker starts out
      --preload-app          load the app in the master (default)
      --no-preload-app, -L Delayed   load it in each worker (HUP reloads it)
      --child-exit CODE      sub { ... } run in a worker before it exits
      --user USER --group GROUP      workers drop privileges to these
Connections:
      --timeout SECS         deadline for one read or write (300)
      --read-timeout SECS    deadline for a whole request head (60)
      --keepalive-timeout S  idle time allowed between requests (5)
      --max-keepalive-reqs N requests on one connection (1000)
      --disable-keepalive    close after every response
      --no-manager           keep idle connections in workers (no manager)
      --max-connections N    connections the manager holds (10000)
      --keepalive-wait SECS  keep a served connection parked in the worker (0.05)
      --worker-quantum N     requests in a row before yielding (5)
Limits:
      --max-request-body BYTES  larger bodies get 413 (0 = no limit)
      --body-in-memory BYTES    larger bodies go to a temp file (1048576)
      --max-request-line BYTES  414 beyond (8192)
      --max-header-bytes BYTES  431 beyond (65536)
      --max-headers N           431 beyond (100)
Process:
      --graceful-timeout SECS   wait this long for requests on stop (30)
      --pid FILE                write the master's pid here
      --error-log FILE          append stderr here (USR1 reopens it)
  -E, --env ENV              PLACK_ENV (deployment)
  -I DIR, -M Module          add to @INC, load a module first
  -h, --help                 -v, --version
Signals: TERM/INT/QUIT stop gracefully, HUP restarts workers, TTIN/TTOU add or
remove a worker, USR1 reopens the error log, USR2 logs manager counts.
USAGE
}

1;
__END__

=head1 NAME

Narwhal::CLI - the narwhal command line

=head1 SYNOPSIS

  narwhal --listen :5000 --max-workers 8 app.psgi

See L<Narwhal> for every option.

=cut
