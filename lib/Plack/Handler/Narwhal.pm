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
    return bless { options => _options(%args), server_ready => $server_ready,
                   listen_sock => $listen_sock }, $class;
}

# The handler's arguments, checked when it is made (a bad value dies here,
# before anything listens). An option Narwhal does not know is named in one
# warning, never silently dropped: plackup passes on every --option it does
# not know itself (-D, --enable-ssl, a typo).
sub _options {
    my (%args) = @_;
    $args{listen} = [ ref $args{listen} ? @{ $args{listen} } : ($args{listen}) ]
        if defined $args{listen};
    $args{socket} = [ $args{socket} ] if defined $args{socket} && !ref $args{socket};
    my @unknown;
    my $options = Narwhal::Options::normalize(%args, -on_unknown => sub { push @unknown, $_[0] });
    warn "narwhal: ignoring " . (@unknown > 1 ? 'options' : 'the option')
        . " Narwhal does not know: " . join(', ', @unknown) . "\n" if @unknown;
    return $options;
}

sub run {
    my ($self, $app) = @_;
    my $options = $self->{options};
    require Narwhal::Master;
    my $master = Narwhal::Master->new(
        options      => $options,
        app          => $app,
        load_app     => sub { $app },
        server_ready => $self->{server_ready},
        quiet        => 1,
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
can be given, in snake_case or kebab-case; C<server_ready> is called once
the listeners are open, and a C<listen_sock> handle is used instead of
opening one.

=cut
