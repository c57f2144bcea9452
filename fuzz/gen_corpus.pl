#!/usr/bin/perl
# Writes the seed corpus fuzz/corpus/seed-*: valid requests (GET, POST with
# Content-Length, chunked, pipelined) and one file per malformed case.
# Crashers found by the fuzzer are kept next to them as crash-* files.
# Usage: perl fuzz/gen_corpus.pl   (from anywhere)
use strict;
use warnings;
use File::Basename qw(dirname);
use File::Spec;

my $dir = File::Spec->catdir(dirname(File::Spec->rel2abs(__FILE__)), 'corpus');
mkdir $dir unless -d $dir;

my $H = "Host: example.com\r\n";
my $chunked_head = "POST /up HTTP/1.1\r\n${H}Transfer-Encoding: chunked\r\n\r\n";

my %seed = (
    # valid
    'get-simple'          => "GET / HTTP/1.1\r\n$H\r\n",
    'get-query'           => "GET /p/a%20th?x=1&y=%zz HTTP/1.1\r\n${H}User-Agent: fuzz\r\nAccept: */*\r\n\r\n",
    'get-http10'          => "GET /index.html HTTP/1.0\r\n\r\n",
    'get-http10-ka'       => "GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n",
    'get-lf-only'         => "GET / HTTP/1.1\nHost: a\nX-A:  b \n\n",
    'get-leading-crlf'    => "\r\n\r\n\nGET / HTTP/1.1\r\n$H\r\n",
    'get-absolute'        => "GET http://example.com:8080/a/b?c=d HTTP/1.1\r\n$H\r\n",
    'get-absolute-nopath' => "GET https://example.com?q HTTP/1.1\r\n$H\r\n",
    'options-star'        => "OPTIONS * HTTP/1.1\r\n$H\r\n",
    'connect-authority'   => "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n",
    'get-obs-text'        => "GET / HTTP/1.1\r\n${H}X-Name: caf\xc3\xa9\t\r\nX-Empty:\r\n\r\n",
    'get-many-headers'    => "GET / HTTP/1.1\r\n$H" . join('', map { "X-$_: $_\r\n" } 1 .. 15) . "\r\n",
    'get-close'           => "GET / HTTP/1.1\r\n${H}Connection: upgrade, close\r\n\r\n",
    'get-expect'          => "PUT /x HTTP/1.1\r\n${H}Content-Length: 3\r\nExpect: 100-Continue\r\n\r\nabc",
    'post-cl'             => "POST /form HTTP/1.1\r\n${H}Content-Length: 11\r\n\r\nhello world",
    'post-cl-dup'         => "POST / HTTP/1.1\r\n${H}Content-Length: 5\r\ncontent-length: 5\r\n\r\nhello",
    'post-chunked'        => "${chunked_head}5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
    'post-chunked-ext'    => "${chunked_head}5;a=b;c=\"d;e\"\r\nhello\r\nA ;x\r\n0123456789\r\n0\r\nX-Sum: 1\r\n\r\n",
    'post-chunked-lf'     => "POST / HTTP/1.1\nHost: a\nTransfer-Encoding: Chunked\n\n3\nabc\n0\n\n",
    'post-chunked-pipe'   => "${chunked_head}3\r\nabc\r\n0\r\n\r\nGET /next HTTP/1.1\r\n$H\r\n",
    'pipelined-gets'      => "GET /1 HTTP/1.1\r\n$H\r\nGET /2 HTTP/1.1\r\n$H\r\n",
    'incomplete-head'     => "GET /slow HTTP/1.1\r\nHost: exa",
    'chunk-raw'           => "4\r\nwiki\r\n5\r\npedia\r\n0\r\n\r\n",
    'chunk-raw-trailer'   => "1a;ext\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\nA: b\r\nC:d\r\n\r\nrest",
    'chunk-raw-partial'   => "ff\r\nonly a little",

    # malformed head
    'bad-bare-cr-value'   => "GET / HTTP/1.1\r\nHost: a\rb\r\n\r\n",
    'bad-bare-cr-line'    => "GET / HTTP/1.1\r${H}\r\n",
    'bad-nul-method'      => "G\0T / HTTP/1.1\r\n$H\r\n",
    'bad-nul-value'       => "GET / HTTP/1.1\r\nHost: a\0b\r\n\r\n",
    'bad-method-long'     => ('M' x 33) . " / HTTP/1.1\r\n$H\r\n",
    'bad-method-char'     => "GE(T / HTTP/1.1\r\n$H\r\n",
    'bad-double-space'    => "GET  / HTTP/1.1\r\n$H\r\n",
    'bad-target-ctl'      => "GET /a\x01b HTTP/1.1\r\n$H\r\n",
    'bad-target-del'      => "GET /a\x7f HTTP/1.1\r\n$H\r\n",
    'bad-version-505'     => "GET / HTTP/2.0\r\n$H\r\n",
    'bad-version-12'      => "GET / HTTP/1.2\r\n$H\r\n",
    'bad-version-junk'    => "GET / HTTP/1.x\r\n$H\r\n",
    'bad-version-http09'  => "GET /\r\n\r\n",
    'bad-version-space'   => "GET / HTTP/1.1 \r\n$H\r\n",
    'bad-obs-fold'        => "GET / HTTP/1.1\r\n${H}X-A: a\r\n b\r\n\r\n",
    'bad-space-colon'     => "GET / HTTP/1.1\r\nHost : a\r\n\r\n",
    'bad-empty-name'      => "GET / HTTP/1.1\r\n$H: x\r\n\r\n",
    'bad-no-colon'        => "GET / HTTP/1.1\r\n${H}NoColon\r\n\r\n",
    'bad-value-ctl'       => "GET / HTTP/1.1\r\n${H}X: a\x1bb\r\n\r\n",
    'bad-rl-414'          => "GET /" . ('a' x 600) . " HTTP/1.1\r\n$H\r\n",
    'bad-head-431'        => "GET / HTTP/1.1\r\n$H" . ("X-Pad: " . ('p' x 200) . "\r\n") x 11 . "\r\n",
    'bad-headers-431'     => "GET / HTTP/1.1\r\n$H" . join('', map { "X-$_: $_\r\n" } 1 .. 16) . "\r\n",

    # malformed framing
    'bad-cl-sign'         => "POST / HTTP/1.1\r\n${H}Content-Length: +5\r\n\r\nhello",
    'bad-cl-comma'        => "POST / HTTP/1.1\r\n${H}Content-Length: 5, 5\r\n\r\nhello",
    'cl-padded'           => "POST / HTTP/1.1\r\n${H}Content-Length: 000000000000000000005\r\n\r\nhello",
    'bad-cl-overflow'     => "POST / HTTP/1.1\r\n${H}Content-Length: 9223372036854775808\r\n\r\n",
    'bad-cl-differ'       => "POST / HTTP/1.1\r\n${H}Content-Length: 5\r\nContent-Length: 6\r\n\r\nhello",
    'bad-te-and-cl'       => "POST / HTTP/1.1\r\n${H}Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    'bad-te-gzip'         => "POST / HTTP/1.1\r\n${H}Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
    'bad-te-twice'        => "POST / HTTP/1.1\r\n${H}Transfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n",
    'bad-te-two-lines'    => "POST / HTTP/1.1\r\n${H}Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    'bad-te-http10'       => "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    'bad-no-host'         => "GET / HTTP/1.1\r\n\r\n",
    'bad-two-hosts'       => "GET / HTTP/1.1\r\n${H}Host: other\r\n\r\n",
    'bad-expect'          => "POST / HTTP/1.1\r\n${H}Expect: 200-ok\r\nContent-Length: 1\r\n\r\nx",

    # malformed chunked bodies
    'bad-chunk-size'      => "${chunked_head}zz\r\nhello\r\n0\r\n\r\n",
    'post-chunked-padded' => "${chunked_head}00000000000000000005\r\nhello\r\n000000000000000000\r\n\r\n",
    'bad-chunk-ext-ctl'   => "${chunked_head}5;a\x01\r\nhello\r\n0\r\n\r\n",
    'bad-chunk-bare-cr'   => "${chunked_head}5\rhello\r\n0\r\n\r\n",
    'bad-chunk-data-end'  => "${chunked_head}5\r\nhelloXY0\r\n\r\n",
    'bad-chunk-line-long' => "${chunked_head}1;" . ('e' x 4100) . "\r\nx\r\n0\r\n\r\n",
    'bad-chunk-trl-fold'  => "${chunked_head}0\r\nX: a\r\n b\r\n\r\n",
    'bad-chunk-trl-large' => "${chunked_head}0\r\nX: " . ('t' x 200) . "\r\n\r\n",
    'bad-chunk-too-large' => "${chunked_head}10001\r\nx\r\n",
    'bad-chunk-overflow'  => "${chunked_head}ffffffffffffffff\r\nx\r\n",
    'bad-chunk-past-2-64' => "${chunked_head}10000000000000000\r\nx\r\n",
);

my $n = 0;
for my $name (sort keys %seed) {
    my $file = File::Spec->catfile($dir, "seed-$name");
    open my $fh, '>:raw', $file or die "$file: $!";
    print {$fh} $seed{$name};
    close $fh or die "$file: $!";
    $n++;
}
print "wrote $n seed files to $dir\n";
