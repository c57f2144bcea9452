use strict;
use warnings;
use Test::More;
use lib 't/lib';
use NarwhalTest qw(perl_cmd root);

for my $m (qw(Narwhal Narwhal::Options Narwhal::Listener Narwhal::Input Narwhal::Writer
              Narwhal::Worker Narwhal::Master Narwhal::CLI Plack::Handler::Narwhal)) {
    use_ok($m);
}
ok(Narwhal::Acceptor->can('next_conn') && Narwhal::Acceptor->can('serve'), 'XS Narwhal::Acceptor loaded');
ok(Narwhal::Conn->can('write_response'), 'XS Narwhal::Conn loaded');
my $out = `@{[ join ' ', perl_cmd() ]} -c ${\ root() }/bin/narwhal 2>&1`;
like($out, qr/syntax OK/, 'bin/narwhal compiles');
done_testing;
