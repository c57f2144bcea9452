package NarwhalTest::Clients;
use strict;
use warnings;
use IO::Socket::INET ();
use IO::Socket::UNIX ();
use POSIX ();
use Socket ();
use Time::HiRes qw(time sleep);

# Clients that count every request's outcome and never retry, for the
# fault and deployment runs (xt/) and the tests that change a
# connection's owner under load: each is a process doing keep-alive GETs
# on one connection. A request that gets no complete 200 counts as failed
# (or reset when the connection broke before any byte of an answer;
# reset_new when that was the first request of a new connection), and
# the next one opens a new connection; Connection: close is honoured (the
# next request goes on a new connection, as a client must). With a
# PROXY header, each new connection starts with it, and an answer whose
# body does not say the address it gave counts as wrong.

# One client process, for $o{seconds} (or $o{count} requests). Writes
# "sent answered failed reset reset_new wrong" to $out. Returns its pid.
#   to      a TCP port on 127.0.0.1, or a unix socket's path
#   path    what it asks for
#   proxy   a PROXY header to send first on each new connection
#   expect  a regex each answer's body must match (else it counts as wrong)
#   post    send POSTs with a small body (a proxy must not retry them once sent)
#   pace    seconds to wait after each answer (0: none; a paced client keeps
#           a request in flight most of the time at a fraction of the CPU)
#   up      after this many answers, create "$out.up": the client is at work
#           (wait_up waits for it)
#   tls     speak TLS (IO::Socket::SSL, the certificate not checked)
#   times   write each answered request's time in seconds, a line each, to
#           "$out.times" (times_of reads them)
sub client {
    my ($out, %o) = @_;
    my $pid = fork // die "fork: $!";
    return $pid if $pid;
    $SIG{PIPE} = 'IGNORE';
    require IO::Socket::SSL if $o{tls};
    my %n = (sent => 0, answered => 0, failed => 0, reset => 0, reset_new => 0, wrong => 0);
    my $end = time + $o{seconds};
    $SIG{USR1} = sub { $end = 0 };    # finish(): no new request after the one under way
    my ($c, $on_conn, @times);
    while (time < $end && (!$o{count} || $n{sent} < $o{count})) {
        if (!$c) {
            $c = connect_to($o{to}, $o{tls});
            if (!$c) { sleep 0.05; next }     # refused: not a request sent
            syswrite($c, $o{proxy}) if defined $o{proxy};
        }
        $n{sent}++;
        my $t0 = time;
        my ($r, $close, $body) = one_request($c, $o{path}, $o{post});
        push @times, time - $t0 if $o{times} && $r eq 'answered';
        $r = 'wrong' if $r eq 'answered' && $o{expect} && $body !~ $o{expect};
        $n{$r}++;
        if ($o{up} && $r eq 'answered' && $n{answered} == $o{up}) {
            open(my $u, '>', "$out.up") or POSIX::_exit(1);
            close $u;
        }
        $n{reset_new}++ if $r eq 'reset' && !$on_conn++;
        ($c, $on_conn) = (undef, 0) if $r ne 'answered' || $close;    # Connection: close is honoured
        sleep $o{pace} if $o{pace};
    }
    if ($o{times}) {
        open(my $t, '>', "$out.times") or POSIX::_exit(1);
        print $t map { "$_\n" } @times;
        close $t;
    }
    open(my $f, '>', $out) or POSIX::_exit(1);
    print $f join(' ', @n{qw(sent answered failed reset reset_new wrong)}), "\n";
    close $f;
    POSIX::_exit(0);
}

sub connect_to {
    my ($to, $tls) = @_;
    return IO::Socket::SSL->new(PeerAddr => '127.0.0.1', PeerPort => $to, Timeout => 2,
                                SSL_verify_mode => 0) if $tls;
    return $to =~ m{/}
        ? IO::Socket::UNIX->new(Peer => $to, Type => Socket::SOCK_STREAM())
        : IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $to, Timeout => 2);
}

sub one_request {
    my ($c, $path, $post) = @_;
    my $req = $post ? "POST $path HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"
                    : "GET $path HTTP/1.1\r\nHost: x\r\n\r\n";
    syswrite($c, $req) or return 'reset';
    my $buf = '';
    my $deadline = time + 10;
    while (time < $deadline) {
        my $rin = '';
        vec($rin, fileno($c), 1) = 1;
        # (TLS: bytes already decrypted wait in the socket object, not the kernel)
        $c->can('pending') && $c->pending or select(my $rout = $rin, undef, undef, 0.5) or next;
        my $n = sysread($c, $buf, 65536, length $buf);
        return length $buf ? 'failed' : 'reset' unless $n;
        next unless $buf =~ /\r\n\r\n/;
        my ($status) = $buf =~ m{^HTTP/1\.\d (\d{3})};
        my ($len) = $buf =~ /^Content-Length:\s*(\d+)/mi;
        my $head = index($buf, "\r\n\r\n") + 4;
        next if defined $len && length($buf) - $head < $len;
        my $close = $buf =~ /^Connection:\s*close/mi;
        return ($status && $status == 200 ? 'answered' : 'failed', $close, substr($buf, $head));
    }
    return 'failed';
}

# Wait for the clients; their summed counts.
sub collect {
    my (@runs) = @_;
    my @fields = qw(sent answered failed reset reset_new wrong);
    my %t = map { $_ => 0 } @fields;
    for my $r (@runs) {
        waitpid($r->{pid}, 0);
        open(my $f, '<', $r->{out}) or next;
        my @v = split ' ', (<$f> // '');
        @t{@fields} = map { $t{$_} + (shift(@v) // 0) } @fields;
    }
    return \%t;
}

# Tell the clients to stop after the request each has under way (once
# what is tested has happened: the server is gone, say), then collect.
sub finish {
    my (@runs) = @_;
    kill USR1 => map { $_->{pid} } @runs;
    return collect(@runs);
}

# The answered requests' times (seconds) of clients started with times =>
# 1, once collected, sorted.
sub times_of {
    my (@runs) = @_;
    my @t;
    for my $r (@runs) {
        open(my $f, '<', "$r->{out}.times") or next;
        push @t, map { 0 + $_ } <$f>;
    }
    return sort { $a <=> $b } @t;
}

# Wait up to $timeout seconds until every client started with up => $n
# has had its $n answers; true once they all have.
sub wait_up {
    my ($timeout, @runs) = @_;
    my $end = time + $timeout;
    while (grep { !-e "$_->{out}.up" } @runs) {
        return 0 if time > $end;
        sleep 0.01;
    }
    return 1;
}

my $N = 0;

# $n clients of $path on $port (a TCP port or a unix socket's path); their
# counts go to files in $dir. %o: proxy => sub { $i -> header }, expect =>
# sub { $i -> regex }, post => 1, pace => seconds, up => $answers, tls => 1,
# times => 1 (see client).
sub start_clients {
    my ($dir, $port, $n, $path, $seconds, $count, %o) = @_;
    return map {
        my $i = $_;
        my $out = "$dir/client-$$-" . $N++;
        { pid => client($out, to => $port, path => $path, seconds => $seconds, count => $count,
                        proxy => $o{proxy} && $o{proxy}->($i), expect => $o{expect} && $o{expect}->($i),
                        post => $o{post}, pace => $o{pace}, up => $o{up}, tls => $o{tls},
                        times => $o{times}),
          out => $out }
    } 1 .. $n;
}

1;
