# dancer2_hello: a Dancer2 hello world (Debian: libdancer2-perl), the
# framework's own routing, request and response objects around one route:
# GET / answers "Hello World" (text/html, with Content-Length). Dancer2's
# defaults otherwise (no config.yml); its environment follows PLACK_ENV, so
# run it with -E deployment as bench/real-apps does.
package BenchDancer2Hello;
use Dancer2;

get '/' => sub { return "Hello World\n" };

BenchDancer2Hello->to_app;
