"""`memstream mcp`: memstream's tools for agent hosts over MCP (services/mcp_server.py), as a thin
client of a running `memstream serve` — no model loaded, no store opened.

    memstream mcp --transport stdio [--url URL]
        # key: MEMSTREAM_API_KEY, checked against the API at start (missing or refused: exit 2, saying why)
    memstream mcp --transport http [--host H] [--port N] [--url URL] [--allow-origin O]...
        # each request's own bearer key is passed through; none, or one the API refuses: 401
"""

from __future__ import annotations

import argparse
import os


def register(sub) -> None:
    s = sub.add_parser("mcp", help="serve memstream's tools over MCP (stdio or streamable HTTP), as a client of "
                                   "`memstream serve`")
    s.add_argument("--transport", choices=["stdio", "http"], default="stdio",
                   help="stdio: the key is MEMSTREAM_API_KEY; http: every request sends its own "
                        "`Authorization: Bearer <key>`")
    s.add_argument("--url", help="the memstream API (default: $MEMSTREAM_URL, else http://127.0.0.1:8080)")
    s.add_argument("--host", default="127.0.0.1", help="http: address to bind (default loopback)")
    s.add_argument("--port", type=int, default=8765, help="http: port (default 8765); the endpoint is /mcp")
    s.add_argument("--allow-origin", action="append", default=[], metavar="ORIGIN",
                   help="http: a browser origin allowed to call (e.g. https://agent.example.com); loopback origins "
                        "always are")
    s.add_argument("--allow-host", action="append", default=[], metavar="HOST[:PORT]",
                   help="http: a Host header to accept besides the loopback names (when serving behind a proxy)")
    s.set_defaults(func=cmd_mcp)


def cmd_mcp(args: argparse.Namespace) -> int:
    from services.mcp_server import run

    key = os.environ.get("MEMSTREAM_API_KEY") if args.transport == "stdio" else None
    run(args.transport, args.url, key, args.host, args.port, args.allow_origin, args.allow_host)
    return 0
