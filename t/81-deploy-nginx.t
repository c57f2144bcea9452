use strict;
use warnings;
use lib 't/lib';
use NarwhalTest::Deploy qw(run_quick);

# Behind nginx (docs/DEPLOY.md, xt/deploy/run --quick): over a unix socket
# with upstream keep-alive and X-Forwarded-For (nginx), and two unix-socket
# instances restarted in turn under POSTs (nginx-rolling).
run_quick(qw(nginx nginx-rolling));
