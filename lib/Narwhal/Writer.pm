package Narwhal::Writer;
use strict;
use warnings;

# The writer object handed to a psgi.streaming app: [ $conn, $on_close ].

sub new {
    my ($class, $conn, $on_close) = @_;
    return bless [ $conn, $on_close ], $class;
}

sub write {
    my ($self, $data) = @_;
    my $conn = $self->[0] or die "write() on a closed Narwhal::Writer\n";
    return 1 unless defined $data && length $data;
    return $conn->write_body($data);
}

sub close {
    my $self = shift;
    my $conn = $self->[0] or return;
    $self->[0] = undef;
    $self->[1]->($conn->end_body);
    return 1;
}

# psgi.nonblocking is false: the callback can run at once, and it is up to
# it to write and return.
sub poll_cb {
    my ($self, $cb) = @_;
    $cb->($self);
}

sub DESTROY {
    my $self = shift;
    $self->close if $self->[0];
}

1;
__END__

=head1 NAME

Narwhal::Writer - the writer of a streamed (psgi.streaming) response

=head1 DESCRIPTION

C<write($chunk)> sends a chunk (framed as a chunk for HTTP/1.1 when the app
gave no Content-Length), C<close> ends the body. A writer dropped without
C<close> is closed for the app.

=cut
