package Narwhal::Input;
use strict;
use warnings;

# psgi.input for a request body held in memory: [ $buffer, $position ].
# Bodies larger than --body-in-memory arrive as a real temp file instead.

sub new {
    my ($class, $data) = @_;
    return bless [ defined $data ? $data : '', 0 ], $class;
}

# Same contract as CORE::read: read($buf, $len [, $offset]).
sub read {
    my ($self, undef, $len, $offset) = @_;
    my $chunk = substr($self->[0], $self->[1], $len);
    $chunk = '' unless defined $chunk;
    $self->[1] += length $chunk;
    $_[1] = '' unless defined $_[1];
    $offset = 0 unless defined $offset;
    $offset += length $_[1] if $offset < 0;
    $_[1] .= "\0" x ($offset - length $_[1]) if $offset > length $_[1];
    substr($_[1], $offset) = $chunk;
    return length $chunk;
}

sub seek {
    my ($self, $pos, $whence) = @_;
    $whence ||= 0;
    $pos += $self->[1] if $whence == 1;
    $pos += length $self->[0] if $whence == 2;
    return 0 if $pos < 0;
    $self->[1] = $pos > length $self->[0] ? length $self->[0] : $pos;
    return 1;
}

sub tell { $_[0][1] }
sub eof  { $_[0][1] >= length $_[0][0] }
sub close   { 1 }
sub binmode { 1 }
sub fileno  { undef }
sub opened  { 1 }

sub getline {
    my $self = shift;
    return undef if $self->eof;
    my $rest = length($self->[0]) - $self->[1];
    my $take = $rest;
    if (ref $/) {
        $take = ${$/} if ${$/} < $rest;
    } elsif (defined $/ && length $/) {
        my $at = index($self->[0], $/, $self->[1]);
        $take = $at - $self->[1] + length $/ if $at >= 0;
    }
    my $line = substr($self->[0], $self->[1], $take);
    $self->[1] += $take;
    return $line;
}

sub getlines {
    my $self = shift;
    my @lines;
    while (defined(my $l = $self->getline)) { push @lines, $l }
    return @lines;
}

1;
__END__

=head1 NAME

Narwhal::Input - psgi.input for request bodies held in memory

=head1 DESCRIPTION

Implements C<read>, C<seek>, C<tell>, C<getline>, C<getlines>, C<eof> and
C<close> like a file handle over the buffered body. C<psgix.input.buffered>
is always true under Narwhal, so apps and middleware may seek back and read
again. Bodies larger than C<--body-in-memory> bytes are given as a real file
handle on an unlinked temp file instead.

=cut
