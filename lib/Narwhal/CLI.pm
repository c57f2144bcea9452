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
    # Other servers' options that Narwhal does not do (TLS, Net::Server's):
    # their reason, before Getopt would call them merely unknown.
    for my $arg (@argv) {
        last if $arg eq '--';
        next unless $arg =~ /^--([A-Za-z][\w-]*)(?:=(.*))?$/s;
        my $why = Narwhal::Options::refused($1, defined $2 ? $2 : 1) or next;
        die "usage: $why\n";
    }
    my $p = Getopt::Long::Parser->new(config => [qw(no_ignore_case bundling_values
                                                    no_auto_abbrev)]);
    # Getopt's complaints become the one-line error; the handler is gone
    # before anything else runs, so the app's warnings reach the error log.
    my ($parsed, @warnings);
    {
        local $SIG{__WARN__} = sub { push @warnings, $_[0] };
        $parsed = $p->getoptionsfromarray(\@argv, \%opt, Narwhal::Options::getopt_specs(),
            'help|h' => \$help, 'version|v' => \$version, 'I=s' => \@inc,
            'M=s' => \@modules, 'env|E=s' => \$env, 'app|a=s' => \$opt{app});
    }
    $parsed or die lcfirst($warnings[0] // "bad options\n");
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
    my $code = eval {
        Narwhal::Master->new(
            options  => $options,
            load_app => sub { _load_psgi($file) },
        )->run;
    };
    return $code if defined $code;
    # Once the server runs, stderr may be --error-log: the failure is one
    # of Narwhal's own lines there, with its time.
    die $@ unless defined $options->{error_log};
    Narwhal::log_line(error => $@ =~ s/\n.*//sr);
    return EXIT_FAIL;
}

sub _load_psgi {
    my ($file) = @_;
    require Plack::Util;
    my $app = Plack::Util::load_psgi($file);
    die "$file did not return a code reference\n" unless ref $app;
    return $app;
}

# Generated from the option table.
sub usage { return Narwhal::Options::usage() }

1;
__END__

=head1 NAME

Narwhal::CLI - the narwhal command line

=head1 SYNOPSIS

  narwhal --listen :5000 --max-workers 8 app.psgi

See L<Narwhal> for every option.

=cut
