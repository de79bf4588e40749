"""Ingest benchmark: event append rate, and add -> ready on the LoCoMo dev split.

    .venv/bin/python benchmarks/ingest.py [--locomo PATH] [--out bench-results/ingest.json]

*Ready* means every projection is at the log's end offset and every unit kind (turn, window,
episode and sentence vectors, entity vectors, graph, BM25) answers a query. Model loading is
timed separately and excluded. The breakdown says where the time goes: encoder, NER, each
store's writes, and the rest of each projection (segmentation, diffing, SQL reads).

The machine is shared and noisy: compare figures from one run, not across runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from infra.registry import Registry  # noqa: E402
from infra.settings import Settings  # noqa: E402
from schemas.events import TurnRecorded, encode_event  # noqa: E402
from schemas.ports.views import Boundary  # noqa: E402
from schemas.units import entity_id  # noqa: E402
from services.runtime import build_pipeline  # noqa: E402
from streams.sources import locomo  # noqa: E402
from report import write_report  # noqa: E402

from streams.sources.locomo import DEFAULT_PATH as DEFAULT_LOCOMO  # noqa: E402


class Clock:
    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    def wrap(self, obj, method: str, label: str):
        original = getattr(obj, method)

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds[label] += time.perf_counter() - t0
                self.calls[label] += 1

        setattr(obj, method, timed)


async def append_rate(n: int) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="memstream-append-"))
    try:
        settings = Settings.load(data_dir=tmp)
        pipeline = build_pipeline(settings)
        await pipeline.start_log()
        base = TurnRecorded(event_id="x", tenant_id="bench", agent_id="a", conversation_id="c0", session_id="s", turn_index=0,
                            speaker="A", text="a fairly ordinary sentence of about ten words in length", occurred_at="2025-01-01T00:00:00Z")
        events = [base.model_copy(update={"event_id": f"e{i}", "conversation_id": f"c{i % 50}", "turn_index": i}) for i in range(n)]
        publisher = pipeline.publisher()
        t0 = time.perf_counter()
        await publisher.publish(events)
        typed = time.perf_counter() - t0
        items = [json.loads(encode_event(e)) for e in events]
        for item in items:
            item["event_id"] += "-raw"
        t0 = time.perf_counter()
        results = await publisher.publish_items(items)
        raw = time.perf_counter() - t0
        assert all(r.status == "accepted" for r in results)
        await pipeline.close()
        return {"events": n, "append_events_per_s": round(n / typed), "validate_and_append_events_per_s": round(n / raw)}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


async def add_to_ready(path: Path, batch_size: int) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="memstream-ingest-"))
    try:
        settings = Settings.load(data_dir=tmp, runner={"batch_size": batch_size})
        reg = Registry(settings)
        pipeline = build_pipeline(settings, registry=reg)
        t0 = time.perf_counter()
        await pipeline.start()
        load = time.perf_counter() - t0
        clock = Clock()
        clock.wrap(reg.encoder(), "encode_with_spans", "encoder: turns + sentences (dense)")
        clock.wrap(reg.encoder(), "encode", "encoder: entity names (graph)")
        clock.wrap(reg.extractor(), "analyze", "ner (graph)")
        for view, live in pipeline._live.items():
            clock.wrap(live.runner.projection, "handle", f"{view}: handle (incl. models)")
            clock.wrap(live.runner.projection.store, "apply", f"{view}: store writes")
        samples = locomo.load(path)
        events = list(locomo.events(samples, "locomo"))
        t_start = time.perf_counter()
        await pipeline.publisher().publish(events)
        appended = time.perf_counter() - t_start
        await pipeline.process_until_caught_up()
        processed = time.perf_counter()
        # Ready = every unit kind answers a query in every conversation.
        encoder = reg.encoder()
        qv = encoder.encode(["what did they talk about"])[0]
        for sample in samples:
            b = Boundary("locomo", (sample["sample_id"],))
            for kind in ("turn", "window", "episode"):
                assert pipeline.store("lexical").search(kind, "talk", b, 1), (kind, b)
                assert pipeline.store("hierarchy").list_units(b, kind)
            for kind in ("turn", "window", "episode", "sentence"):
                assert pipeline.store("dense").search(kind, qv, b, 1)
            graph = pipeline.store("graph")
            match = graph.align_entities(b, [entity_id("locomo", "talk")], qv[None, :], 1)[0]
            assert match and graph.personalized_pagerank(b, {match[0].entity_id: 1.0}, 0.6)
        ready = time.perf_counter() - t_start
        statuses = await pipeline.status()
        assert all(s.lag_events == 0 for s in statuses)
        await pipeline.close()
        turns = len(events)
        return {
            "turns": turns,
            "model_load_seconds": round(load, 2),
            "append_seconds": round(appended, 3),
            "process_seconds": round(processed - t_start, 2),
            "ready_seconds": round(ready, 2),
            "turns_per_second": round(turns / ready, 1),
            "breakdown_seconds": {k: round(v, 2) for k, v in sorted(clock.seconds.items())},
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--locomo", type=Path, default=DEFAULT_LOCOMO)
    ap.add_argument("--append-events", type=int, default=50_000)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    result = {"append": await append_rate(args.append_events)}
    print(json.dumps(result["append"]), flush=True)
    if args.locomo.exists():
        result["locomo_add_to_ready"] = await add_to_ready(args.locomo, args.batch_size)
        print(json.dumps(result["locomo_add_to_ready"], indent=2))
    else:
        print(f"LoCoMo not found at {args.locomo}: skipping add -> ready", file=sys.stderr)
    write_report(result, args.out, echo=False)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
