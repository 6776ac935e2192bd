"""Serves one OpenStack WSGI application on a loopback port, threaded.

Used by scripts/setup-openstack for Keystone, heat-api and heat-api-cfn: the
pinned releases ship only WSGI entry points (no eventlet servers), and a
threaded wsgiref server from the standard library needs nothing more in the
virtualenv.

    python wsgi_serve.py --app heat.wsgi.api:application --port 8004 \
        --prog heat-api -- --config-file heat.conf

Everything after `--` becomes the application's command line (oslo.config
reads sys.argv when the application module is imported).
"""

import argparse
import importlib
import socketserver
import sys
from wsgiref import simple_server


class ThreadingWSGIServer(socketserver.ThreadingMixIn, simple_server.WSGIServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64


class Handler(simple_server.WSGIRequestHandler):
    # One line per request on stderr (the service's log file), like an
    # access log.
    def log_message(self, fmt, *args):
        sys.stderr.write("access: %s - %s\n" % (self.address_string(), fmt % args))
        sys.stderr.flush()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--app", required=True, help="module:attribute of the WSGI app")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--prog", default=None, help="argv[0] seen by the app")
    p.add_argument("rest", nargs=argparse.REMAINDER)
    a = p.parse_args()
    rest = a.rest[1:] if a.rest[:1] == ["--"] else a.rest
    if not a.host.startswith("127.") and a.host != "::1":
        sys.exit("wsgi_serve: refusing to listen on a non-loopback address")
    sys.argv = [a.prog or a.app.split(":")[0]] + rest
    module, attr = a.app.split(":")
    app = getattr(importlib.import_module(module), attr)
    server = ThreadingWSGIServer((a.host, a.port), Handler)
    server.set_app(app)
    sys.stderr.write("wsgi_serve: %s listening on %s:%d\n" % (a.app, a.host, a.port))
    sys.stderr.flush()
    server.serve_forever()


if __name__ == "__main__":
    main()
