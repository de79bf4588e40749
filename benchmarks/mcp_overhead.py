"""What one `search_memory` call through MCP costs against the same search over HTTP, in one run.

    .venv/bin/python benchmarks/mcp_overhead.py [--locomo PATH] [--conversation conv-26] [--questions 150] [--out FILE]

A real `memstream serve` (embedded, real models) holds one LoCoMo dev conversation; a real
`memstream mcp` serves over streamable HTTP and another over stdio. Each question is asked three
ways, one after the other (the order rotating per question): the Python client's `search`
(HTTP), `search_memory` through the MCP HTTP server, and through the MCP stdio server — same
boundary, strategy (zero-mem) and budget (10 turns). Reported: wall-clock p50/p95 per way as the
caller sees it, and the ratios to HTTP.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from memstream_client import AsyncClient  # noqa: E402
from report import write_report  # noqa: E402
from streams.sources import locomo  # noqa: E402
from tests.integration import servers  # noqa: E402

BIN = Path(sys.executable).with_name("memstream")


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return round(s[min(len(s) - 1, int(q * len(s)))], 2)


async def run(args) -> dict:
    import httpx2
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client
    from mcp.client.streamable_http import streamable_http_client

    samples = locomo.load(args.locomo)
    sample = next(s for s in samples if s["sample_id"] == args.conversation)
    questions = [q["question"] for q in sample["qa"] if q.get("category") != 5][: args.questions]
    with tempfile.TemporaryDirectory() as work, servers.memstream_serve(Path(work)) as served:
        key = servers.cli_key(served.data_dir, "writer", "bench", env=servers.embedded_env(served.data_dir))["key"]
        await asyncio.sleep(1.0)
        events = [e.model_dump(mode="json") for e in locomo.events([sample], "bench")]
        async with AsyncClient(served.url, key, timeout=300) as http:
            added = await http.add(events)
            await http.wait(added.positions, 600)
            [port] = servers.free_ports(1)
            proc = subprocess.Popen([str(BIN), "mcp", "--transport", "http", "--port", str(port), "--url", served.url],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                while True:
                    try:
                        socket.create_connection(("127.0.0.1", port), timeout=1).close()
                        break
                    except OSError:
                        await asyncio.sleep(0.2)
                params = StdioServerParameters(command=str(BIN), args=["mcp", "--transport", "stdio", "--url", served.url],
                                               env={**os.environ, "MEMSTREAM_API_KEY": key})
                async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=300) as h2, \
                        streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=h2) as (r1, w1), ClientSession(r1, w1) as mcp_http, \
                        stdio_client(params) as (r2, w2), ClientSession(r2, w2) as mcp_stdio:
                    await mcp_http.initialize()
                    await mcp_stdio.initialize()
                    arguments = {"conversation_id": args.conversation, "strategy": "zero-mem", "max_turns": 10}

                    async def via_http(q):
                        await http.search(q, **arguments)

                    async def via_mcp(session, q):
                        r = await session.call_tool("search_memory", {"question": q, **arguments})
                        assert not r.is_error, r.content

                    ways = {"http": via_http, "mcp-http": lambda q: via_mcp(mcp_http, q), "mcp-stdio": lambda q: via_mcp(mcp_stdio, q)}
                    for q in questions[:5]:  # warm-up
                        for fn in ways.values():
                            await fn(q)
                    times: dict[str, list[float]] = {w: [] for w in ways}
                    order = list(ways)
                    for i, q in enumerate(questions):
                        for name in order[i % 3:] + order[: i % 3]:
                            t0 = time.perf_counter()
                            await ways[name](q)
                            times[name].append((time.perf_counter() - t0) * 1000)
            finally:
                proc.terminate()
                proc.wait(30)
    base = statistics.median(times["http"])
    return {
        "conversation": args.conversation, "turns": len(events), "questions": len(questions),
        "ms": {w: {"p50": pct(t, 0.5), "p95": pct(t, 0.95)} for w, t in times.items()},
        "p50_ratio_to_http": {w: round(statistics.median(t) / base, 2) for w, t in times.items()},
        "p50_added_ms": {w: round(statistics.median(t) - base, 2) for w, t in times.items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--locomo", type=Path, default=Path(__file__).resolve().parents[2] / "shared/data/locomo/locomo-dev.json")
    ap.add_argument("--conversation", default="conv-26")
    ap.add_argument("--questions", type=int, default=150)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    write_report(asyncio.run(run(args)), args.out)


if __name__ == "__main__":
    main()
