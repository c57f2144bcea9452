use strict;
use warnings;
use lib 't/lib';
use NarwhalTest::Deploy qw(run_quick);

# Behind HAProxy (docs/DEPLOY.md, xt/deploy/run --quick): TCP mode with
# send-proxy-v2 in front of two instances whose workers recycle, restarted
# in turn (rolling), the same with TLS passed through to TLS listeners
# that read the PROXY header before the handshake (tls-rolling), and a
# connection without the PROXY header (proxy).
run_quick(qw(rolling tls-rolling proxy));
