use strict;
use warnings;
use Test::More;
use lib 't/lib';
use JSON::PP ();
use NarwhalTest qw(spawn_server free_port write_app tmpdir run_cmd missing_all);

# A TLS listener as an operator's scanner sees it: testssl.sh (Debian's
# testssl.sh) against Narwhal's own TLS (docs/DESIGN.md, "HTTPS") finds
# no weak protocol, cipher or known vulnerability. Its findings about the
# certificate (this test's own, self-signed and short-lived: trust,
# expiry, revocation, CAA) are the certificate's business, not the
# server's, and are left out; every other finding must be OK or INFO.

plan skip_all => 'the connection manager is not built or is switched off (TLS needs it)'
    unless NarwhalTest::managed();
my ($testssl) = grep { -x } map { ("$_/testssl", "$_/testssl.sh") } split /:/, $ENV{PATH} // '';
missing_all('needs testssl.sh and openssl (Debian: apt-get install testssl.sh openssl)')
    unless $testssl && grep { -x "$_/openssl" } split /:/, $ENV{PATH} // '';

my $TMP = tmpdir();
my ($CERT, $KEY, $JSON) = map { "$TMP/$_" } qw(scan-cert.pem scan-key.pem testssl.json);
system("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout $KEY -out $CERT "
       . "-days 2 -subj /CN=localhost -addext subjectAltName=DNS:localhost,IP:127.0.0.1 >/dev/null 2>&1") == 0
    or BAIL_OUT('openssl could not make a certificate');

my $port = free_port();
my $s = spawn_server(app => write_app("sub { [200, ['Content-Type' => 'text/plain'], ['ok']] }"),
                     no_listen => 1, port => $port,
                     args => [ '--listen', "127.0.0.1:$port:ssl", '--tls-cert', $CERT, '--tls-key', $KEY ]);
my $r = run_cmd([ $testssl, '--quiet', '--color', '0', '--warnings', 'off', '--jsonfile', $JSON,
                  '-p', '-s', '-U', '-S', "127.0.0.1:$port" ], timeout => 300);
$s->stop;
my $findings = eval { open(my $fh, '<', $JSON) or die "$JSON: $!"; local $/; JSON::PP::decode_json(<$fh>) } || [];
cmp_ok(scalar @$findings, '>', 50, "testssl.sh reported its findings (exit $r->{code})")
    or diag $r->{out}, $r->{err};
my %by_id = map { $_->{id} => $_ } @$findings;
for my $old (qw(SSLv2 SSLv3 TLS1 TLS1_1)) {
    like($by_id{$old}{finding} // '', qr/not offered/, "$old is not offered");
}
like($by_id{TLS1_3}{finding} // '', qr/offered/, 'TLS 1.3 is offered');
# (testssl's own ticket probe sometimes asks with a TLS 1.3 s_client that
# closes before the server's ticket comes, then WARNs of a connect problem:
# its tool, not the server; t/29 checks resumption with s_client itself)
my @weak = grep { $_->{severity} !~ /\A(?:OK|INFO)\z/ && $_->{id} !~ /\A(?:cert_|DNS_CAArecord)/
                  && !($_->{id} eq 'sessionresumption_ticket' && $_->{severity} eq 'WARN'
                       && $_->{finding} =~ /connect problem/) } @$findings;
is_deeply([ map { "$_->{severity} $_->{id}: $_->{finding}" } @weak ], [],
          'nothing weak: every finding but the certificate\'s is OK or INFO');
done_testing();
