"""Embedded vs distributed, side by side in one run, on the LoCoMo dev split.

    .venv/bin/python benchmarks/distributed.py [--conversations conv-30] [--kcat conv-30]
        [--qdrant grpc|rest|local] [--strategies zero-mem,bm25] [--no-replay] [--sequential-reads] [--out FILE]

The distributed stack is Apache Kafka (log), faust workers (projections), OpenSearch (hierarchy
and lexical views), Neo4j + GDS (graph) and the Qdrant server (dense; over gRPC by default,
`--qdrant rest` for its REST API, `--qdrant local` for qdrant-client's in-process mode). Servers
come from $MEMSTREAM_TEST_KAFKA / _OPENSEARCH / _NEO4J / _QDRANT or are started with
infra/servers. Events are published through the Kafka log adapter — one conversation with kcat
as a foreign producer when --kcat names it — and projected by `memstream worker` (one faust
app, one agent per view) running as a separate process, started (models loaded) before the
first append. Ready = every view's position at the log's end offset. The questions then run
against the views in both modes, strategies interleaved question by question; the report has
each strategy's p50 per query stage, so it says where a distributed query spends its time, and
the CPU time per query of this process and of each server (each strategy run alone), which on
a machine whose cores the servers share is a floor under the latency. `--sequential-reads`
adds Zero-Mem with its engine reads one after the other, alternating question by question with
the default (independent reads overlapped): the latency each way and whether the evidence is
identical. A replay of every view then runs while queries keep going, and must not fail one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Iterator

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from infra.registry import Registry  # noqa: E402
from infra.settings import Settings  # noqa: E402
from schemas.ports.views import VIEW_NAMES  # noqa: E402
from schemas.query import SearchRequest  # noqa: E402
from services.eval.locomo import ask, evaluate_strategies, ingest, percentile, questions  # noqa: E402
from services.query import zeromem  # noqa: E402
from services.query.service import QueryService, default_strategies  # noqa: E402
from services.runtime import build_pipeline  # noqa: E402
from services.views import LiveViews  # noqa: E402
from streams.sources import locomo  # noqa: E402
from tests.integration import servers  # noqa: E402
from report import write_report  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
from streams.sources.locomo import DEFAULT_PATH as DEFAULT_LOCOMO  # noqa: E402
TENANT = "locomo"


async def distributed_ingest(settings: Settings, samples, conversations, kcat_conv: str | None, log, *, local_dense: bool) -> dict:
    ready_file = Path(settings.data_dir) / "worker.ready"
    worker = servers.spawn_worker(settings, Path(settings.data_dir) / "worker.log", ready_file)
    try:
        t0 = time.perf_counter()
        while not ready_file.exists():
            if worker.poll() is not None:
                raise RuntimeError(f"the worker exited ({worker.returncode}); see {settings.data_dir}/worker.log")
            if time.perf_counter() - t0 > 600:
                raise RuntimeError("the worker did not get ready in 10 minutes")
            time.sleep(0.2)
        load = time.perf_counter() - t0
        pipeline = build_pipeline(settings, views=())
        await pipeline.start_log()
        events = list(locomo.events(samples, TENANT, conversations))
        foreign = [e for e in events if e.conversation_id == kcat_conv]
        own = [e for e in events if e.conversation_id != kcat_conv]
        t_first = time.perf_counter()
        await pipeline.publisher().publish(own)
        if foreign:
            servers.kcat_publish(pipeline.backends.kafka_connection()[0].split(",")[0], settings.log.topic + ".intake", foreign)
        end = await pipeline.log.end_offsets(settings.log.topic)
        log(f"published {len(own)} events with the log adapter and {len(foreign)} with kcat")
        # Ready: every view's position (kept with its writes) at the end offset.
        views = LiveViews(Registry(settings))
        while True:
            lag = 0
            for view in VIEW_NAMES:
                try:
                    positions = views.store(view).positions()
                except Exception:  # noqa: BLE001 - the worker owns Qdrant's local store until it stops
                    positions = None
                if positions is None and view == "dense" and local_dense:
                    continue
                lag += sum(max(0, off - (positions or {}).get(p, 0)) for p, off in end.items())
            if lag == 0:
                break
            if worker.poll() is not None:
                raise RuntimeError(f"the worker exited ({worker.returncode}); see {settings.data_dir}/worker.log")
            time.sleep(0.25)
        ready = time.perf_counter() - t_first  # every view caught up (the local dense view: checked after the worker stops)
        views.close()
        await pipeline.close()
        return {"turns": len(events), "kcat_events": len(foreign), "model_load_seconds": round(load, 2), "end_offsets": end,
                "t_first": t_first, "ready_seconds": ready}
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(120)
        except subprocess.TimeoutExpired:
            worker.kill()


async def dense_ready(settings: Settings, end: dict, t_first: float) -> float:
    """After the workers stop, the dense view can be read in Qdrant's local mode too: check its positions."""
    views = LiveViews(Registry(settings))
    try:
        positions = views.store("dense").positions()
        missing = sum(max(0, off - positions.get(p, 0)) for p, off in end.items())
        if missing:
            raise RuntimeError(f"the dense view is {missing} records behind after the workers stopped")
    finally:
        views.close()
    return time.perf_counter() - t_first


@contextmanager
def serving(registry: Registry, strategies: dict | None = None, **views_options) -> Iterator[QueryService]:
    """A started query service over live views of `registry`'s stores, closed after."""
    views = LiveViews(registry, **views_options)
    try:
        service = QueryService(views, registry.encoder(), registry.extractor(), strategies=strategies)
        service.start()
        yield service
    finally:
        views.close()


def reads_overlapped_vs_in_order(registry: Registry, qs) -> dict:
    """Zero-Mem with its independent engine reads overlapped (the default) and one after the
    other (QueryContext.overlap off), alternating question by question on the same views: the
    latency of each and how many questions got identical evidence."""
    def in_order(fn):
        def run(ctx):
            ctx.overlap = False
            return fn(ctx)
        return run

    with serving(registry) as overlapped, \
            serving(registry, {**default_strategies(), "zero-mem": in_order(zeromem.strategy("zero-mem"))}) as sequential:
        services = {"overlapped": overlapped, "in_order": sequential}
        latencies: dict[str, list[float]] = {name: [] for name in services}
        identical = 0
        for n, q in enumerate(qs):
            evidence = {}
            for name in (list(services) if n % 2 == 0 else list(reversed(services))):
                ms, resp, _ = ask(services[name], q, "zero-mem", TENANT, [25], 5)
                latencies[name].append(ms)
                evidence[name] = [e.unit_id for e in resp.evidence]
            identical += evidence["overlapped"] == evidence["in_order"]
    out: dict = {name: {"p50": round(percentile(v, 50), 2), "p95": round(percentile(v, 95), 2)} for name, v in latencies.items()}
    out["ratio_in_order_over_overlapped"] = {p: round(out["in_order"][p] / out["overlapped"][p], 2) for p in ("p50", "p95")}
    out.update(questions=len(qs), identical_evidence=identical)
    return out


def cpu_per_query(registry: Registry, qs, strategies) -> dict:
    """Each strategy alone over every question: wall time and the CPU time of this process
    (the query service: drivers, decoding, the method) and of each server, per query. On a
    machine whose cores the servers share, their sum over the cores is a floor for latency
    that no overlapping of round trips can go below."""
    out = {}
    with serving(registry) as service:
        for strategy in strategies:
            cpu0, own0, wall0 = servers.server_cpu_ms(), time.process_time(), time.perf_counter()
            for q in qs:
                ask(service, q, strategy, TENANT, [25], 5)
            cpu1, own1, wall1 = servers.server_cpu_ms(), time.process_time(), time.perf_counter()
            row = {"wall_ms": (wall1 - wall0) * 1000 / len(qs), "query_service_cpu_ms": (own1 - own0) * 1000 / len(qs),
                   **{f"{name}_cpu_ms": (cpu1[name] - cpu0[name]) / len(qs) for name in cpu1 if name in cpu0}}
            row["cpu_ms_total"] = sum(v for k, v in row.items() if k.endswith("_cpu_ms"))
            row["cores_busy"] = row["cpu_ms_total"] / row["wall_ms"]
            out[strategy] = {k: round(v, 2) for k, v in row.items()}
    return {"cores": os.cpu_count(), "strategies": out}


def evaluate(settings: Settings, registry: Registry, qs, strategies, budgets) -> dict:
    with serving(registry) as service:
        return evaluate_strategies(service, qs, list(strategies), budgets, TENANT, 5)


async def replay_under_queries(settings: Settings, registry: Registry, qs, log) -> dict:
    """Rebuild every view from offset 0 while a thread keeps querying; count failed queries."""
    views = LiveViews(registry, refresh_seconds=0.05)
    service = QueryService(views, registry.encoder(), registry.extractor())
    service.start()
    stop, failures, done = threading.Event(), [], [0]
    before = {q.question: [e.unit_id for e in service.search(SearchRequest(question=q.question, tenant_id=TENANT, conversation_id=q.conversation)).evidence]
              for q in qs[:20]}

    def query_loop():
        i = 0
        while not stop.is_set():
            q = qs[i % len(qs)]
            try:
                service.search(SearchRequest(question=q.question, tenant_id=TENANT, conversation_id=q.conversation))
                done[0] += 1
            except Exception as exc:  # noqa: BLE001 - that is what we count
                failures.append(repr(exc))
            i += 1

    thread = threading.Thread(target=query_loop)
    thread.start()
    pipeline = build_pipeline(settings, registry=registry, views=VIEW_NAMES)
    await pipeline.start_log()
    generations = {}
    t0 = time.perf_counter()
    try:
        for view in VIEW_NAMES:
            generations[view] = await pipeline.replay(view)
            log(f"replayed {view} into generation {generations[view]}")
    finally:
        stop.set()
        thread.join()
        await pipeline.close()
    after = {q.question: [e.unit_id for e in service.search(SearchRequest(question=q.question, tenant_id=TENANT, conversation_id=q.conversation)).evidence]
             for q in qs[:20]}
    views.close()
    return {"seconds": round(time.perf_counter() - t0, 2), "generations": generations, "queries_during_replay": done[0],
            "failed_queries": len(failures), "failures": failures[:5], "same_evidence_after": before == after}


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--locomo", type=Path, default=DEFAULT_LOCOMO)
    ap.add_argument("--conversations", help="comma-separated sample ids (default: all)")
    ap.add_argument("--kcat", help="publish this conversation with kcat instead of the log adapter")
    ap.add_argument("--strategies", default="zero-mem,bm25,dense")
    ap.add_argument("--qdrant", choices=("grpc", "rest", "local"), default="grpc",
                    help="the dense view on the Qdrant server over gRPC (default) or REST, or in qdrant-client's local mode")
    ap.add_argument("--no-replay", action="store_true")
    ap.add_argument("--sequential-reads", action="store_true",
                    help="also run Zero-Mem with its engine reads one after the other, alternating with the overlapped default")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    samples = locomo.load(args.locomo)
    conversations = set(args.conversations.split(",")) if args.conversations else None
    qs = questions(samples, conversations)
    strategies = args.strategies.split(",")
    budgets = [10, 25]
    report: dict = {"questions": len(qs), "conversations": sorted(conversations) if conversations else "all"}
    work = Path(tempfile.mkdtemp(prefix="memstream-dist-bench-"))
    with ExitStack() as stack:
        kafka = stack.enter_context(servers.kafka())
        opensearch = stack.enter_context(servers.opensearch())
        neo4j = stack.enter_context(servers.neo4j())
        qdrant = stack.enter_context(servers.qdrant()) if args.qdrant != "local" else None
        servers.reset_neo4j_graph_view(neo4j)
        # -- embedded --
        emb = Settings.load(data_dir=work / "embedded")
        reg = Registry(emb)
        report["embedded"] = {"ingest": await ingest(emb, reg, samples, TENANT, conversations)}
        report["embedded"]["strategies"] = evaluate(emb, reg, qs, strategies, budgets)
        log(f"embedded: {json.dumps({k: v['recall'] for k, v in report['embedded']['strategies'].items()})}")
        # -- distributed --
        prefix = f"bench{uuid.uuid4().hex[:6]}"
        dist = Settings.load(
            data_dir=work / "distributed",
            log=servers.kafka_log(kafka, topic=f"{prefix}.events"),
            views={"hierarchy_url": f"opensearch://{opensearch.removeprefix('http://')}?prefix={prefix}",
                   "lexical_url": f"opensearch://{opensearch.removeprefix('http://')}?prefix={prefix}",
                   "dense_url": (f"qdrant+local://{work / 'distributed' / 'qdrant'}?prefix={prefix}" if qdrant is None
                                 else servers.qdrant_view_url(qdrant, prefix, grpc=args.qdrant == "grpc")),
                   **servers.neo4j_views(neo4j)},
        )
        Path(dist.data_dir).mkdir(parents=True, exist_ok=True)
        report["qdrant"] = args.qdrant
        info = await distributed_ingest(dist, samples, conversations, args.kcat, log, local_dense=qdrant is None)
        # add -> ready ends when the views caught up, not when the worker has stopped (its shutdown
        # was counted); the local dense view can only be read after it stops.
        seconds = await dense_ready(dist, info.pop("end_offsets"), info.pop("t_first"))
        ready = info.pop("ready_seconds")
        info["seconds"] = round(seconds if qdrant is None else ready, 2)
        report["distributed"] = {"ingest": info}
        dreg = Registry(dist)
        report["distributed"]["strategies"] = evaluate(dist, dreg, qs, strategies, budgets)
        log(f"distributed: {json.dumps({k: v['recall'] for k, v in report['distributed']['strategies'].items()})}")
        report["distributed"]["cpu_per_query"] = cpu_per_query(dreg, qs, strategies)
        log(f"distributed, CPU per query: {report['distributed']['cpu_per_query']}")
        if args.sequential_reads:
            report["distributed"]["reads_overlapped_vs_in_order"] = reads_overlapped_vs_in_order(dreg, qs)
            log(f"distributed, Zero-Mem reads overlapped vs in order: {report['distributed']['reads_overlapped_vs_in_order']}")
        if not args.no_replay:
            report["distributed"]["replay"] = await replay_under_queries(dist, dreg, qs, log)
        dreg.close()
        if qdrant is not None:
            servers.drop_qdrant_prefix(qdrant, prefix)
    e, d = report["embedded"], report["distributed"]
    report["comparison"] = {
        "ingest_turns_per_second": {"embedded": round(e["ingest"]["turns"] / e["ingest"]["seconds"], 1),
                                    "distributed": round(d["ingest"]["turns"] / d["ingest"]["seconds"], 1)},
        "recall_difference_points": {s: {b: round(100 * (d["strategies"][s]["recall"][b]["all"] - e["strategies"][s]["recall"][b]["all"]), 2)
                                         for b in ("budget_10", "budget_25")} for s in strategies},
        "query_latency_ratio_distributed_over_embedded": {
            s: {p: round(d["strategies"][s]["latency_ms"][p] / max(e["strategies"][s]["latency_ms"][p], 1e-9), 2) for p in ("p50", "p95")}
            for s in strategies},
    }
    c = report["comparison"]["ingest_turns_per_second"]
    c["ratio_distributed_over_embedded"] = round(c["distributed"] / c["embedded"], 2)
    write_report(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
