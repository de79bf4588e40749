"""`memstream bench ingest`: the write path's rates on the embedded default, in-process.

- Append: typed events appended in one batch, and raw JSON items validated then appended, on a
  scratch log (no projection runs).
- Add -> ready on the LoCoMo dev split: from the first append until every projection is at the
  log's end and every unit kind (turn, window, episode and sentence vectors, entity vectors,
  graph, BM25) answers a query in every conversation. Model loading is timed apart and excluded.
- Time per stage: the models (encoder over turns and sentences, NER, entity-name encoding) and
  each view's projection and store writes, summed over the run. The projections run
  concurrently on the machine's cores, so the stages add up to more than the wall time.
- The models' own throughput on the same turns, each model alone after the run (so with the
  cores to itself; the CPU time it used per second of wall time says how many it kept busy), and
  the pipeline's rate as a ratio of the slower model's and of both models
  run one after the other (each takes every core it can, so overlapping them cannot beat the
  latter by much): how close the pipeline gets to what its models allow.

The machine is shared and noisy: compare figures from one run, not across runs.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from infra.registry import Registry
from infra.settings import Settings
from schemas.events import TurnRecorded, encode_event
from schemas.text import split_sentences
from services.eval.readiness import check_answering
from services.runtime import build_pipeline
from streams.projections.dense import dense_text
from streams.sources import locomo

TENANT = "locomo"


@dataclass
class IngestBenchConfig:
    locomo: Path | None  # None: the append rate alone
    conversations: set[str] | None = None
    append_events: int = 50_000
    batch_size: int = 256


class StageClock:
    """Wall time summed per labelled method, by wrapping the methods of live objects."""

    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    def wrap(self, obj, method: str, label: str) -> None:
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
    """Events/s appended to the embedded log, typed and as raw JSON items validated at the edge."""
    tmp = Path(tempfile.mkdtemp(prefix="memstream-append-"))
    try:
        pipeline = build_pipeline(Settings.load(data_dir=tmp), views=())
        await pipeline.start_log()
        try:
            base = TurnRecorded(event_id="x", tenant_id="bench", agent_id="a", conversation_id="c0", session_id="s", turn_index=0,
                                speaker="A", text="a fairly ordinary sentence of about ten words in length",
                                occurred_at="2025-01-01T00:00:00Z")
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
        finally:
            await pipeline.close()
        refused = [r for r in results if r.status != "accepted"]
        if refused:
            raise RuntimeError(f"{len(refused)} of {n} benchmark events were refused, e.g. {refused[0]}")
        return {"events": n, "append_events_per_s": round(n / typed), "validate_and_append_events_per_s": round(n / raw)}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _models_alone(reg: Registry, events: list[TurnRecorded], batch: int, speaker_prefix: bool) -> dict:
    """(turns/s, cores used) of each model over the same turns, alone, in the batches and with the inputs the projections
    use (the encoder sees the dense projection's text and pools each sentence's span, streams/projections/dense.py)."""
    encoder, extractor = reg.encoder(), reg.extractor()
    texts = [e.text for e in events]
    rates, cores = {}, {}
    t0, c0 = time.perf_counter(), time.process_time()
    for i in range(0, len(events), batch):
        encoded, spans = [], []
        for e in events[i:i + batch]:
            text, shift = dense_text(e, speaker_prefix)  # a TurnRecorded has the speaker and text it reads
            encoded.append(text)
            spans.append([(s + shift, end + shift) for s, end in split_sentences(e.text)])
        encoder.encode_with_spans(encoded, spans)
    wall = time.perf_counter() - t0
    rates["encoder_turns_per_s"], cores["encoder"] = round(len(texts) / wall, 1), round((time.process_time() - c0) / wall, 2)
    t0, c0 = time.perf_counter(), time.process_time()
    for i in range(0, len(texts), batch):
        extractor.analyze(texts[i:i + batch])
    wall = time.perf_counter() - t0
    rates["ner_turns_per_s"], cores["ner"] = round(len(texts) / wall, 1), round((time.process_time() - c0) / wall, 2)
    return rates, cores


async def add_to_ready(path: Path, conversations: set[str] | None, batch_size: int, progress: Callable[[str], None]) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="memstream-ingest-"))
    try:
        settings = Settings.load(data_dir=tmp, runner={"batch_size": batch_size})
        reg = Registry(settings)
        pipeline = build_pipeline(settings, registry=reg)
        t0 = time.perf_counter()
        await pipeline.start()
        load = time.perf_counter() - t0
        clock = StageClock()
        clock.wrap(reg.encoder(), "encode_with_spans", "encoder: turns + sentences (dense)")
        clock.wrap(reg.encoder(), "encode", "encoder: entity names (graph)")
        clock.wrap(reg.extractor(), "analyze", "ner (graph)")
        for view, live in pipeline._live.items():
            clock.wrap(live.runner.projection, "handle", f"{view}: projection, models included")
            clock.wrap(live.runner.projection.store, "apply", f"{view}: store writes")
        samples = [s for s in locomo.load(path) if conversations is None or s["sample_id"] in conversations]
        if not samples:
            raise RuntimeError(f"none of the conversations {sorted(conversations or ())} is in {path}")
        events = list(locomo.events(samples, TENANT))
        progress(f"add -> ready: {len(events)} turns of {len(samples)} conversation(s) (models loaded in {load:.1f} s)")
        try:
            t_start = time.perf_counter()
            await pipeline.publisher().publish(events)
            appended = time.perf_counter() - t_start
            await pipeline.process_until_caught_up()
            processed = time.perf_counter()
            await check_answering(pipeline, reg.encoder(), TENANT, [s["sample_id"] for s in samples])
            ready = time.perf_counter() - t_start
            progress(f"ready after {ready:.1f} s; now each model alone on the same turns")
            stages = {k: round(v, 4) for k, v in sorted(clock.seconds.items())}  # (0.1 ms: the fast path's lexicon NER takes a few ms on a conversation)
            alone, cores = _models_alone(reg, events, batch_size, settings.hierarchy.speaker_prefix)
        finally:
            await pipeline.close()
        turns = len(events)
        rate = turns / ready
        slower = min(alone.values())
        serial = 1.0 / sum(1.0 / v for v in alone.values())  # the two models one after the other, each with the cores
        return {
            "turns": turns,
            "conversations": [s["sample_id"] for s in samples],
            "model_load_seconds": round(load, 2),
            "append_seconds": round(appended, 3),
            "process_seconds": round(processed - t_start, 2),
            "ready_seconds": round(ready, 2),
            "turns_per_second": round(rate, 1),
            "stage_seconds": stages,
            "models_alone": alone,
            "models_alone_cores_used": cores,  # process CPU time / wall time while each ran
            "models_in_sequence_turns_per_s": round(serial, 1),
            "pipeline_to_slower_model": round(rate / slower, 3),
            "pipeline_to_models_in_sequence": round(rate / serial, 3),
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


async def run(cfg: IngestBenchConfig, progress: Callable[[str], None] = print) -> dict:
    progress(f"append: {cfg.append_events} events")
    report: dict = {"config": {"append_events": cfg.append_events, "batch_size": cfg.batch_size,
                               "conversations": sorted(cfg.conversations) if cfg.conversations else "all"},
                    "append": await append_rate(cfg.append_events)}
    if cfg.locomo is not None:
        report["add_to_ready"] = await add_to_ready(cfg.locomo, cfg.conversations, cfg.batch_size, progress)
    return report


def plot(report: dict, path: Path, title: str = "memstream bench ingest") -> None:
    """Time per stage (bars) with the rates in the title lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    a = report["append"]
    lines = [title, f"append {a['append_events_per_s']:,} events/s typed, {a['validate_and_append_events_per_s']:,} validated from JSON"]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    r = report.get("add_to_ready")
    if r:
        lines.append(f"add -> ready {r['turns_per_second']} turns/s ({r['turns']} turns in {r['ready_seconds']} s); "
                     f"models alone: encoder {r['models_alone']['encoder_turns_per_s']}, NER {r['models_alone']['ner_turns_per_s']} "
                     f"turns/s\n(both in sequence {r['models_in_sequence_turns_per_s']}); pipeline / slower model = "
                     f"{r['pipeline_to_slower_model']}, / both in sequence = {r['pipeline_to_models_in_sequence']}")
        stages = r["stage_seconds"]
        names = sorted(stages, key=stages.get)
        ax.barh(names, [stages[n] for n in names], color=["tab:orange" if n.startswith(("encoder", "ner")) else "tab:blue" for n in names])
        ax.axvline(r["ready_seconds"], color="black", linestyle="--", linewidth=1, label="add -> ready (wall)")
        ax.set_xlabel("seconds, summed over the run (projections overlap on the cores)")
        ax.tick_params(axis="y", labelsize=7)
        ax.legend(fontsize=7)
    else:
        ax.set_axis_off()
    fig.suptitle("\n".join(lines), fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
