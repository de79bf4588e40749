"""The dense view's reads on the Qdrant server over gRPC and over REST, side by side in one run.

    .venv/bin/python benchmarks/qdrant_transport.py [--points 20000] [--boundary 600] [--repeats 300] [--out FILE]

A generation with `--points` 384-d turn points spread over conversations of `--boundary` points
each (one tenant); then, alternating transport request by request, `score_units` (every point
of one conversation scored: what a Zero-Mem query asks per unit kind) and `search` (top 10).
Servers: $MEMSTREAM_TEST_QDRANT or one started with infra/servers.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from infra.vectors.qdrant import QdrantVectorStore  # noqa: E402
from schemas.ports.vectors import VectorChangeSet, VectorPoint  # noqa: E402
from schemas.ports.views import Boundary  # noqa: E402
from services.eval.locomo import percentile  # noqa: E402
from tests.contracts.builders import sealer  # noqa: E402
from tests.integration import servers  # noqa: E402
from report import write_report  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--points", type=int, default=20_000)
    ap.add_argument("--boundary", type=int, default=600)
    ap.add_argument("--repeats", type=int, default=300)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    rng = np.random.default_rng(7)
    t0 = datetime(2025, 1, 1, tzinfo=timezone.utc)
    with servers.qdrant() as url:
        prefix = f"bench{uuid.uuid4().hex[:6]}"
        keys = Path(tempfile.mkdtemp(prefix="bench-keys-"))  # the benchmark writes points only: the sealer is never used
        stores = {t: QdrantVectorStore(servers.qdrant_test_client(url, grpc=t == "grpc"), prefix, 1, sealer=sealer(keys)) for t in ("grpc", "rest")}
        try:
            vecs = rng.standard_normal((args.points, 384)).astype(np.float32)
            vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
            conversations = max(1, args.points // args.boundary)
            pts = [VectorPoint("turn", f"t{i}", vecs[i], "t1", f"c{i % conversations}", "s1", ("a",), t0 + timedelta(minutes=i),
                               t0 + timedelta(minutes=i), f"t{i}") for i in range(args.points)]
            load = time.perf_counter()
            for i in range(0, len(pts), 2000):
                stores["grpc"].apply(VectorChangeSet(upsert_points=pts[i:i + 2000]), {0: i + 2000})
            load = time.perf_counter() - load
            times: dict[str, dict[str, list[float]]] = {t: {"score_units": [], "search": []} for t in stores}
            for n in range(args.repeats):
                q = rng.standard_normal(384).astype(np.float32)
                b = Boundary("t1", (f"c{n % conversations}",))
                for t in (("grpc", "rest") if n % 2 else ("rest", "grpc")):
                    s = time.perf_counter()
                    keys, _ = stores[t].score_units("turn", q, b)
                    times[t]["score_units"].append((time.perf_counter() - s) * 1000)
                    s = time.perf_counter()
                    stores[t].search("turn", q, b, 10)
                    times[t]["search"].append((time.perf_counter() - s) * 1000)
            report = {"points": args.points, "boundary_points": len(keys), "load_seconds": round(load, 2),
                      **{t: {op: {"p50": round(percentile(v, 50), 2), "p95": round(percentile(v, 95), 2)} for op, v in ops.items()}
                         for t, ops in times.items()}}
            report["rest_over_grpc_p50"] = {op: round(report["rest"][op]["p50"] / report["grpc"][op]["p50"], 2) for op in ("score_units", "search")}
        finally:
            servers.drop_qdrant_prefix(url, prefix)
    write_report(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
