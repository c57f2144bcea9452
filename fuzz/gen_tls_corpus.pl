#!/usr/bin/perl
# Writes the seed inputs of fuzz/fuzz_tls.c into fuzz/corpus-tls/ (run
# from the top directory): the ClientHellos `openssl s_client` sends in
# several settings (caught by a listener here), that of TLS 1.3 cut
# short, and what is not TLS (plain HTTP, 0x16 then junk, an empty
# stream, an SSLv2-format hello).
use strict; use warnings;
use IO::Socket::INET;
my $dir = 'fuzz/corpus-tls'; mkdir $dir;

# The first flight of `openssl s_client @args` (what it sends before it
# hears anything back).
sub hello {
    my (@args) = @_;
    my $l = IO::Socket::INET->new(Listen => 1, LocalAddr => '127.0.0.1', LocalPort => 0,
                                  ReuseAddr => 1) or die "listen: $!";
    my $port = $l->sockport;
    my $pid = fork // die "fork: $!";
    if (!$pid) {
        open STDIN, '<', '/dev/null'; open STDOUT, '>', '/dev/null'; open STDERR, '>', '/dev/null';
        exec 'openssl', 's_client', '-connect', "127.0.0.1:$port", @args or exit 127;
    }
    my $c = $l->accept or die "accept: $!";
    my ($buf, $got) = ('', '');
    $c->blocking(1);
    local $SIG{ALRM} = sub { die "timeout\n" };
    alarm 5;
    while (length($got) < 5 || length($got) < 5 + unpack('n', substr($got, 3, 2))) {
        last unless sysread($c, $buf, 65536);
        $got .= $buf;
    }
    alarm 0;
    close $c;
    kill 'TERM', $pid; waitpid $pid, 0;
    return $got;
}

my $tls13 = hello('-alpn', 'h2,http/1.1', '-servername', 'localhost');
my %seeds = (
  'tls13'          => $tls13,
  'tls12'          => hello('-tls1_2', '-alpn', 'http/1.1'),
  'tls12-rsa-kx'   => hello('-tls1_2', '-cipher', 'AES128-GCM-SHA256'),
  'tls10'          => hello('-tls1', '-cipher', 'DEFAULT:@SECLEVEL=0'),
  'tls13-half'     => substr($tls13, 0, length($tls13) >> 1),
  'tls13-header'   => substr($tls13, 0, 5),
  'http'           => "GET / HTTP/1.1\r\nHost: x\r\n\r\n",
  'junk'           => "\x16garbage, not a record at all\r\n\r\n",
  'short-hello'    => "\x16\x03\x01\x00\x06\x01\x00\x00\x02\x03\x03",
  'sslv2-hello'    => "\x80\x2e\x01\x03\x01\x00\x15\x00\x00\x00\x10" . ("\x00\x00\x2f" x 7) . ("\x11" x 16),
  'empty'          => '',
);
for my $name (sort keys %seeds) {
  open my $f, '>:raw', "$dir/seed-$name" or die; print $f $seeds{$name}; close $f;
}
