package Plack::Handler::Narwhal;
use strict;
use warnings;
use Narwhal ();
use Narwhal::Options ();

# plackup -s Narwhal: the options plackup passes become Narwhal's.

sub new {
    my ($class, %args) = @_;
    my $server_ready = delete $args{server_ready};
    my $listen_sock  = delete $args{listen_sock};
    my $options = eval { _options(%args) } or die "narwhal: $@";
    require Narwhal::Master;
    eval { Narwhal::Master::check_tls($options); 1 } or die "narwhal: $@";   # (the TLS pair loads)
    # plackup loads the app in this process before it makes the handler
    # (Plack::Loader's preload_app): only its Delayed loader, -L Delayed,
    # hands over an app each worker loads itself.
    die "narwhal: --no-preload-app: plackup has loaded the app already, before Narwhal "
      . "started; give plackup -L Delayed (each worker loads it), or use the narwhal command\n"
        if !$options->{preload_app} && !$INC{'Plack/Loader/Delayed.pm'};
    return bless { options => $options, server_ready => $server_ready,
                   listen_sock => $listen_sock }, $class;
}

# The handler's arguments, checked when it is made (a bad value dies here,
# in one line, before anything listens). An option Narwhal does not know
# is refused, never silently dropped: plackup passes on every --option it
# does not know itself (a typo, another server's), and a server that
# ignored one would not do what its operator believes it does.
sub _options {
    my (%args) = @_;
    $args{listen} = [ ref $args{listen} ? @{ $args{listen} } : ($args{listen}) ]
        if defined $args{listen};
    $args{socket} = [ $args{socket} ] if defined $args{socket} && !ref $args{socket};
    my @unknown;
    my $options = Narwhal::Options::normalize(%args, -on_unknown => sub { push @unknown, $_[0] });
    die "unknown option" . (@unknown > 1 ? 's ' : ' ')
        . join(', ', map { Narwhal::Options::cli_name($_) } @unknown)
        . ": Narwhal does not know " . (@unknown > 1 ? 'them' : 'it') . " (narwhal --help lists "
        . "what it does)\n" if @unknown;
    return $options;
}

# Plack servers say where they accept connections, in one line on stderr
# ("Starman: Accepting connections at http://*:5000/"): plackup passes a
# server_ready that prints it in development; otherwise Narwhal prints it.
sub _say_ready {
    my ($args) = @_;
    print STDERR "$args->{server_software}: Accepting connections at "
        . "$args->{proto}://$args->{host}:$args->{port}/\n";
}

sub run {
    my ($self, $app) = @_;
    my $options = $self->{options};
    require Narwhal::Master;
    my $master = Narwhal::Master->new(
        options      => $options,
        app          => $app,
        load_app     => sub { $app },
        server_ready => $self->{server_ready} || \&_say_ready,
    );
    $master->{listeners} = [ Narwhal::Listener::from_fd(fileno($self->{listen_sock}), 'listen_sock') ]
        if $self->{listen_sock};
    return $master->run;
}

1;
__END__

=head1 NAME

Plack::Handler::Narwhal - plackup -s Narwhal

=head1 SYNOPSIS

  plackup -s Narwhal --max-workers 8 --listen :5000 app.psgi

  use Plack::Handler::Narwhal;
  Plack::Handler::Narwhal->new(port => 5000, max_workers => 4)->run($app);

=head1 DESCRIPTION

The adapter between L<Plack> and L<Narwhal>. Every option of L<Narwhal>
can be given, in snake_case or kebab-case; one it does not know (another
server's, a typo) is refused in one line, as are TLS options.
C<server_ready> is called once the listeners are open (without it, Narwhal
prints C<Narwhal: Accepting connections at http://HOST:PORT/> on stderr, as
other Plack servers do), and a C<listen_sock> handle is used instead of
opening one. plackup loads the app before it makes the handler:
C<--no-preload-app> is refused unless plackup has C<-L Delayed>.

=cut
