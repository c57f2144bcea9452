#!/usr/bin/perl
# Writes the seed inputs of fuzz/fuzz_proxy.c into fuzz/corpus-proxy/ (run
# from the top directory): valid v1 and v2 headers of every kind with a
# request after them, and each way of being invalid (docs/PROTOCOL.md).
use strict; use warnings;
my $dir = 'fuzz/corpus-proxy'; mkdir $dir;
my $sig = "\r\n\r\n\0\r\nQUIT\n";
my $get = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
sub v2 { my ($cmd, $fam, $addr, $len) = @_; $sig . chr($cmd) . chr($fam) . pack('n', $len // length $addr) . $addr }
my %seeds = (
  'v1-tcp4'        => "PROXY TCP4 203.0.113.7 10.0.0.1 51234 80\r\n$get",
  'v1-tcp6'        => "PROXY TCP6 2001:db8::1 2001:db8::2 4444 443\r\n$get",
  'v1-unknown'     => "PROXY UNKNOWN\r\n$get",
  'v1-unknown-f'   => "PROXY UNKNOWN ::1 ::1 1 1\r\n$get",
  'v1-no-cr'       => "PROXY TCP4 1.2.3.4 5.6.7.8 1 2\n$get",
  'v1-long'        => "PROXY UNKNOWN " . ('x' x 120) . "\r\n",
  'v1-bad-port'    => "PROXY TCP4 1.2.3.4 5.6.7.8 65536 2\r\n",
  'v1-cut'         => "PROXY TCP4 1.2.3.4 5.6",
  'v2-tcp4'        => v2(0x21, 0x11, pack('C4C4nn', 203, 0, 113, 7, 10, 0, 0, 1, 51234, 80)) . $get,
  'v2-tcp6'        => v2(0x21, 0x21, ("\x20\x01\x0d\xb8" . "\0" x 11 . "\x01") . ("\0" x 16) . pack('nn', 1, 2)) . $get,
  'v2-unix'        => v2(0x21, 0x31, pack('a108a108', '/run/a.sock', '/run/b.sock')) . $get,
  'v2-local'       => v2(0x20, 0x00, '') . $get,
  'v2-tlv'         => v2(0x21, 0x11, pack('C4C4nn', 1, 2, 3, 4, 5, 6, 7, 8, 9, 10) . "\x04\x00\x02ab") . $get,
  'v2-short-len'   => v2(0x21, 0x21, "\0" x 12),
  'v2-huge-len'    => v2(0x21, 0x11, "\0" x 12, 0xffff),
  'v2-bad-family'  => v2(0x21, 0x41, "\0" x 12),
  'v2-bad-cmd'     => v2(0x2f, 0x11, "\0" x 12),
  'v2-cut-sig'     => substr($sig, 0, 7),
  'http'           => $get,
  'empty'          => '',
);
for my $name (sort keys %seeds) {
  open my $f, '>:raw', "$dir/seed-$name" or die; print $f $seeds{$name}; close $f;
}
