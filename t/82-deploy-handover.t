use strict;
use warnings;
use lib 't/lib';
use NarwhalTest::Deploy qw(run_quick);

# Hand-overs under load (docs/DEPLOY.md, xt/deploy/run --quick): HUP under
# Server::Starter (starter), and a new instance on the same port with
# --reuse-port (reuse-port).
run_quick(qw(starter reuse-port));
