#!/usr/bin/perl
# Writes the seed inputs of fuzz/fuzz_frame.c into fuzz/corpus-frame/ (run from the top
# directory): byte 0 is the harness's descriptor count, short-buffer flag and
# reader (16: the two-descriptor one), the
# rest one datagram, valid frames (docs/PROTOCOL.md) and each way of being invalid.
use strict; use warnings;
my $dir = 'fuzz/corpus-frame'; mkdir $dir;
sub frame { my ($type, $data, %o) = @_;
  pack('VvvVlVVV', $o{magic} // 0x3146574e, $type, $o{listener} // 0, $o{requests} // 0, $o{deadline} // -1, $o{flags} // 0, $o{len} // length $data, $o{ready} // 0) . $data }
my %seeds = (
  'handoff-empty'      => [1, frame(1, '')],
  'handoff-partial'    => [1, frame(1, "GET / HTTP/1.1\r\nHo", flags => 1, deadline => 5000)],
  'serve-head'         => [1, frame(2, "GET /a HTTP/1.1\r\nHost: x\r\n\r\n", requests => 7, listener => 2)],
  'stats'              => [0, frame(5, "\0" x 72)],
  'serve-no-fd'        => [0, frame(2, "GET / HTTP/1.1\r\n\r\n")],
  'bad-magic'          => [1, frame(1, 'x', magic => 0x12345678)],
  'bad-type-3'         => [1, frame(3, '')],
  'bad-type-0'         => [0, frame(0, '')],
  'bad-type-big'       => [2, frame(65535, '')],
  'len-too-long'       => [1, frame(1, 'abc', len => 4)],
  'len-too-short'      => [1, frame(1, 'abcd', len => 2)],
  'len-huge'           => [1, frame(1, 'abc', len => 0xffffffff)],
  'short-header'       => [1, substr(frame(1, ''), 0, 10)],
  'five-fds'           => [5, frame(2, "GET / HTTP/1.1\r\n\r\n")],
  'seven-fds-bad'      => [7, 'junk'],
  'short-cap'          => [8 | 1, frame(2, 'x' x 40)],
  'empty'              => [3, ''],
  'output-two-fds'     => [16 | 2, frame(1, pack('QQQVV', 100, 5000, 0, 1, 0) . "GET /n HTTP/1.1\r\n\r\n", flags => 4)],
  'output-one-fd'      => [16 | 1, frame(1, pack('QQQVV', 0, 10, 10, 0, 0), flags => 4)],
  'output-three-fds'   => [16 | 3, frame(1, pack('QQQVV', 0, 10, 0, 1, 0), flags => 4)],
  'many-reader-bad'    => [16 | 2, frame(9, '')],
);
for my $name (sort keys %seeds) {
  my ($b0, $bytes) = @{ $seeds{$name} };
  open my $f, '>:raw', "$dir/seed-$name" or die; print $f chr($b0) . $bytes; close $f;
}
