"""`memstream bench scale` on the distributed mode: the measured tenant's Zero-Mem p95 and recall
in a store of 100k turns against one of 10k, on Kafka + OpenSearch + Neo4j/GDS + the Qdrant server.

    MEMSTREAM_C1=0 .venv/bin/python benchmarks/distributed_scale.py [--points 10000,100000]
        [--conversations conv-26] [--questions N] [--out FILE]

The procedure is services/bench/scale.py's (the same code grows and compares the stores): both
stores hold the LoCoMo dev conversations as the measured tenant (real models), then a synthetic
fleet on the declared fast model path; the same questions go to both, alternating question by
question, and the ratio of the two p95s is the figure. Each store has its own Kafka topic, its own
OpenSearch and Qdrant prefixes and — because Neo4j Community has one database and keeps the graph
view's catalog in it — its own Neo4j server. The servers are started fresh (infra/servers) unless
$MEMSTREAM_TEST_KAFKA / _OPENSEARCH / _QDRANT name running ones; the two Neo4j servers are always
started here. Not resumable (the servers are fresh); no per-view disk or RSS figures (a server's
memory and files are its own).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from infra.settings import Settings  # noqa: E402
from services.bench.fleet import FleetShape  # noqa: E402
from services.bench.scale import ScaleConfig, run  # noqa: E402
from streams.sources.locomo import DEFAULT_PATH as DEFAULT_LOCOMO  # noqa: E402
from tests.integration import servers  # noqa: E402
from report import write_report  # noqa: E402


def _neo4j(stack: ExitStack, env_var: str) -> dict:
    """A Neo4j server of this run's own (the password read before another start replaces it)."""
    os.environ.pop(env_var, None)
    uri = stack.enter_context(servers.neo4j(env_var))
    return servers.neo4j_views(uri)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--locomo", type=Path, default=DEFAULT_LOCOMO)
    ap.add_argument("--points", default="10000,100000", help="the small store's size, then the large one's")
    ap.add_argument("--conversations", help="measured conversations (default: all of the dev split)")
    ap.add_argument("--questions", type=int, help="the first N questions (default: all)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    points = tuple(int(p) for p in args.points.split(","))
    work = Path(tempfile.mkdtemp(prefix="memstream-dist-scale-"))
    t0 = time.perf_counter()
    with ExitStack() as stack:
        kafka = stack.enter_context(servers.kafka())
        opensearch = stack.enter_context(servers.opensearch()).removeprefix("http://")
        qdrant = stack.enter_context(servers.qdrant())
        graphs = {"small": _neo4j(stack, "MEMSTREAM_BENCH_NEO4J_SMALL"), "large": _neo4j(stack, "MEMSTREAM_BENCH_NEO4J_LARGE")}
        log(f"distributed scale: servers up in {time.perf_counter() - t0:.0f} s; work dir {work}")

        def settings_for(name: str, directory: Path) -> Settings:
            directory.mkdir(parents=True, exist_ok=True)
            return Settings.load(
                data_dir=directory,
                log=servers.kafka_log(kafka, topic=f"scale-{name}.events"),
                views={"hierarchy_url": f"opensearch://{opensearch}?prefix=scale-{name}",
                       "lexical_url": f"opensearch://{opensearch}?prefix=scale-{name}",
                       "dense_url": servers.qdrant_view_url(qdrant, f"scale-{name}"), **graphs[name]},
            )

        cfg = ScaleConfig(locomo=args.locomo, root=work, points=points, questions=args.questions, shape=FleetShape(),
                          conversations=set(args.conversations.split(",")) if args.conversations else None,
                          settings_for=settings_for, process_cpu_ms=servers.server_cpu_ms)
        report = asyncio.run(run(cfg, progress=log))
        servers.drop_qdrant_prefix(qdrant, "scale-small")
        servers.drop_qdrant_prefix(qdrant, "scale-large")
    report["mode"] = "distributed: Kafka + OpenSearch + Neo4j/GDS (one server per store) + Qdrant (gRPC)"
    report["command"] = " ".join(["benchmarks/distributed_scale.py", *sys.argv[1:]])
    report["seconds"] = round(time.perf_counter() - t0, 1)
    write_report(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
