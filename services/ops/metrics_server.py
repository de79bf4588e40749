"""`memstream worker --metrics-port N`: /metrics on its own port, behind the ops token like the
query service's (prometheus-client's own server has no authentication, so its WSGI app is
wrapped here and served the way prometheus-client serves it: wsgiref, one thread per request)."""

from __future__ import annotations

import hmac
import threading
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer


class _Quiet(WSGIRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - wsgiref's signature
        pass


def guarded(app, token: str | None):
    """The WSGI app, answering 401 unless `Authorization: Bearer <token>` (no token: 401 always,
    since an unauthenticated /metrics would reveal every tenant's activity)."""
    expected = f"Bearer {token}".encode() if token else None

    def wrapper(environ, start_response):
        given = environ.get("HTTP_AUTHORIZATION", "").encode("latin-1", "replace")
        if expected is None or not hmac.compare_digest(given, expected):
            body = b'{"error": {"code": "unauthorized", "message": "send the ops token: Authorization: Bearer $MEMSTREAM_OPS_TOKEN"}}'
            start_response("401 Unauthorized", [("Content-Type", "application/json"), ("WWW-Authenticate", 'Bearer realm="memstream"'),
                                                ("Content-Length", str(len(body)))])
            return [body]
        return app(environ, start_response)

    return wrapper


def start_metrics_server(port: int, addr: str, registry, token: str | None):
    """Serve `registry` on addr:port in a daemon thread; returns the server (shutdown() stops it)."""
    httpd = make_server(addr, port, guarded(make_wsgi_app(registry), token), ThreadingWSGIServer, handler_class=_Quiet)
    threading.Thread(target=httpd.serve_forever, daemon=True, name="metrics-server").start()
    return httpd
