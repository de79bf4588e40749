"""`memstream bench scale`: the measured tenants' Zero-Mem latency and recall as the store grows.

Two embedded stores under one directory, each holding the LoCoMo dev conversations as the
measured tenant ("locomo", loaded with the configured models — the real ones unless the
environment names the fast path):

- `small/` grown with the synthetic fleet (services/bench/fleet.py) to the first point (10k turns
  stored in all);
- `large/` grown point after point (100k, 1M, …).

At each point the same questions go to both stores, alternating question by question (the order
rotating), so that both meet the same machine conditions — the ratio of the two p95s is the
figure, not either one alone (the machine is shared). Recall is computed on both the same way as
`memstream eval locomo`.

The bulk is loaded on the declared fast model path (hashing encoder of the measured encoder's
dimension, lexicon NER — `BulkRegistry`), whatever the generation records: its vectors are never
compared with the measured tenant's (boundaries are per tenant and conversation), and a million
turns through the real models would take this machine days. The measured tenant goes in first,
with the real models, so its vectors and entities are the real models'.

Resumable: each store keeps `fleet.json` (shape, seed, turns appended and processed); a run that
stops continues from there, and re-appending a chunk is harmless (event ids repeat, views keep the
first).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from infra.registry import Registry
from infra.settings import Settings
from services.bench.fleet import FleetShape, SyntheticFleet, Vocabulary
from services.bench.procfs import rss_mb, status_mb
from services.runtime import build_pipeline
from streams.sources import locomo

MEASURED_TENANT = "locomo"
CHUNK = 5000  # fleet turns appended then processed at a time (the resume granularity)


@dataclass
class ScaleConfig:
    locomo: Path
    root: Path
    points: tuple[int, ...] = (10_000, 100_000, 1_000_000)
    conversations: set[str] | None = None  # measured conversations (default: all of the dev split)
    budgets: tuple[int, ...] = (10, 25)
    questions: int | None = None  # the first N questions (default: all)
    shape: FleetShape = field(default_factory=FleetShape)
    # Settings of a store (name, directory): the embedded default, or a distributed deployment
    # (benchmarks/distributed_scale.py gives each store its own topic, prefixes and Neo4j). The
    # RSS probe and the per-view disk figures are the embedded stores' only: a server's memory
    # and files are its own.
    settings_for: Callable[[str, Path], Settings] | None = None
    # CPU time (ms) used so far by each process beside this one that ingest runs on (the servers
    # of a distributed deployment; none embedded): each chunk of the bulk load records its share,
    # so the rate comes with where its CPU went.
    process_cpu_ms: Callable[[], dict[str, float]] | None = None


class BulkRegistry(Registry):
    """The configured stores, the declared fast models for every generation (module docstring)."""

    def __init__(self, settings: Settings, dim: int):
        super().__init__(settings)
        from infra.models.fast import HashingEncoder, LexiconExtractor  # the declared fast path: not language models

        self._fast, self._lexicon = HashingEncoder(dim), LexiconExtractor()

    def encoder(self, name: str | None = None):
        return self._fast

    def extractor(self):
        return self._lexicon


def _settings(data_dir: Path) -> Settings:
    data_dir.mkdir(parents=True, exist_ok=True)
    s = Settings.load(data_dir=data_dir)
    return s.model_copy(update={"data_dir": data_dir})


def _state(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def _save(path: Path, state: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    os.replace(tmp, path)


def disk_bytes(data_dir: Path) -> dict[str, int]:
    """Bytes on disk per view (every generation) and per other store file (log, keys, catalog…)."""
    out: dict[str, int] = {}
    for p in data_dir.rglob("*"):
        if p.is_file() and p.name != "fleet.json":
            rel = p.relative_to(data_dir).parts
            name = rel[1] if rel[0] == "views" and len(rel) > 2 else rel[0].split(".")[0]
            out[name] = out.get(name, 0) + p.stat().st_size
    return dict(sorted(out.items()))


class Store:
    """One of the two stores: the measured tenant, then the fleet up to a number of turns."""

    def __init__(self, cfg: ScaleConfig, name: str, progress: Callable[[str], None]):
        self.cfg, self.name, self.progress = cfg, name, progress
        self.dir = cfg.root / name
        self.settings = cfg.settings_for(name, self.dir) if cfg.settings_for else _settings(self.dir)
        self.state_path = self.dir / "fleet.json"
        self.ingest: list[dict] = []

    async def load_measured(self, samples: list[dict], registry: Registry) -> int:
        state = _state(self.state_path)
        if "measured_turns" in state:
            return state["measured_turns"]
        from services.eval.locomo import ingest

        cpu0 = self._cpu_ms()
        report = await ingest(self.settings, registry, samples, MEASURED_TENANT, self.cfg.conversations)
        report["cpu_ms_per_turn"] = _per_turn(_spent(cpu0, self._cpu_ms()), report["turns"])
        self.progress(f"bench scale: {self.name}: measured tenant, {report['turns']} turns with {registry.encoder_name} "
                      f"in {report['seconds']} s; CPU ms per turn {report['cpu_ms_per_turn']}")
        _save(self.state_path, {"measured_turns": report["turns"], "fleet_turns": 0, "seed": self.cfg.shape.seed,
                                "shape": asdict(self.cfg.shape), "measured_ingest": report})
        return report["turns"]

    async def grow(self, fleet: SyntheticFleet, dim: int, total: int) -> None:
        """Append and process fleet turns until the store holds `total` turns (measured ones included)."""
        state = _state(self.state_path)
        if state.get("seed") != self.cfg.shape.seed or state.get("shape") != asdict(self.cfg.shape):
            raise SystemExit(f"{self.dir} was grown with another fleet (seed/shape in {self.state_path}); use another --root")
        have = state["fleet_turns"]
        want = max(0, total - state["measured_turns"])
        if have >= want:
            return
        pipeline = build_pipeline(self.settings, registry=BulkRegistry(self.settings, dim))
        await pipeline.start()
        try:
            publisher = pipeline.publisher()
            t_start, start_have = time.perf_counter(), have
            while have < want:
                n = min(CHUNK, want - have)
                cpu0 = self._cpu_ms()
                t0 = time.perf_counter()
                await publisher.publish(list(fleet.turns(have, have + n)))
                t1 = time.perf_counter()
                await pipeline.process_until_caught_up()
                t2 = time.perf_counter()
                cpu_ms = _spent(cpu0, self._cpu_ms())
                have += n
                state["fleet_turns"] = have
                _save(self.state_path, state)  # after the views hold the chunk: a resume never skips one
                self.ingest.append({"turns": n, "append_s": round(t1 - t0, 3), "process_s": round(t2 - t1, 3),
                                    "cpu_ms": {k: round(v, 1) for k, v in cpu_ms.items()}})
                rate = (have - start_have) / (time.perf_counter() - t_start)
                left = (want - have) / rate if rate else 0
                self.progress(f"bench scale: {self.name}: {have + state['measured_turns']:,}/{total:,} turns, "
                              f"{rate:.0f} turns/s, ~{left / 60:.0f} min left")
        finally:
            await pipeline.close()

    def _cpu_ms(self) -> dict[str, float]:
        """CPU time so far of this process (every thread) and of the configured others."""
        return {"benchmark process": time.process_time() * 1000, **(self.cfg.process_cpu_ms() if self.cfg.process_cpu_ms else {})}

    def stored_turns(self) -> int:
        s = _state(self.state_path)
        return s["measured_turns"] + s["fleet_turns"]


def rss_probe(data_dir: str, locomo_path: str, conversations: str, n: int) -> None:
    """Run in a fresh process (`query_rss`): the models, one store, n measured questions; prints
    the process's resident and peak memory in MB as JSON. One process per store, so that the two
    stores' figures do not share an allocator."""
    from services.eval.locomo import questions, request
    from services.query.service import QueryService
    from services.views import LiveViews

    settings = _settings(Path(data_dir))
    registry = Registry(settings)
    views = LiveViews(registry)
    svc = QueryService(views, registry.encoder(), registry.extractor())
    svc.start()
    base = rss_mb()
    qs = questions(locomo.load(locomo_path), set(conversations.split(",")) if conversations else None)[:n]
    for q in qs:
        svc.search(request(q, "zero-mem", MEASURED_TENANT, 25))
    status = status_mb(keys=("VmRSS", "VmHWM"))
    views.close()
    print(json.dumps({"rss_mb": round(status["VmRSS"], 1), "peak_mb": round(status["VmHWM"], 1), "after_models_mb": round(base, 1)}))


def query_rss(store: "Store", cfg: ScaleConfig, n: int = 100) -> dict:
    import subprocess
    import sys

    code = "import sys; from services.bench.scale import rss_probe; rss_probe(*sys.argv[1:4], int(sys.argv[4]))"
    convs = ",".join(sorted(cfg.conversations)) if cfg.conversations else ""
    run = subprocess.run([sys.executable, "-c", code, str(store.dir), str(cfg.locomo), convs, str(n)], capture_output=True, text=True,
                         timeout=1800, cwd=Path(__file__).resolve().parents[2])
    if run.returncode != 0:
        raise RuntimeError(f"the RSS probe failed: {run.stderr[-2000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def _quantile(values: list[float], q: float) -> float:
    from services.eval.locomo import percentile

    return round(percentile(values, q), 2)


def compare(small: Store, large: Store, registry: Registry, samples: list[dict], cfg: ScaleConfig) -> dict:
    """The same questions on both stores, alternating (module docstring)."""
    from services.eval.locomo import ask, questions, request, summarize
    from services.query.service import QueryService
    from services.views import LiveViews

    qs = questions(samples, cfg.conversations)[: cfg.questions]
    stores = {"small": small, "large": large}
    services = {}
    for name, store in stores.items():
        reg = Registry(store.settings).share_models(registry)  # one copy of the models for both stores
        views = LiveViews(reg)
        svc = QueryService(views, reg.encoder(), reg.extractor())
        svc.start()
        for q in qs[:20]:  # warm: caches built, files opened, so the comparison is of steady state
            svc.search(request(q, "zero-mem", MEASURED_TENANT, max(cfg.budgets)))
        services[name] = (svc, views)
    lat: dict[str, list[float]] = {n: [] for n in stores}
    rows: dict[str, list] = {n: [] for n in stores}
    names = list(stores)
    for i, q in enumerate(qs):
        for j in range(2):
            name = names[(i + j) % 2]
            ms, _, recall = ask(services[name][0], q, "zero-mem", MEASURED_TENANT, cfg.budgets)
            lat[name].append(ms)
            rows[name].append((q, recall))
    for _, views in services.values():
        views.close()
    out = {}
    for name, store in stores.items():
        out[name] = {"stored_turns": store.stored_turns(), "questions": len(qs),
                     "zero_mem_ms": {"p50": _quantile(lat[name], 50), "p95": _quantile(lat[name], 95), "p99": _quantile(lat[name], 99)},
                     "recall": summarize(rows[name], list(cfg.budgets))}
        if cfg.settings_for is None:
            out[name] |= {"query_process": query_rss(store, cfg), "disk_bytes": disk_bytes(store.dir)}
    small_p95, large_p95 = out["small"]["zero_mem_ms"]["p95"], out["large"]["zero_mem_ms"]["p95"]
    out["p95_ratio"] = round(large_p95 / small_p95, 3) if small_p95 else None
    out["recall_equal"] = [r for _, r in rows["small"]] == [r for _, r in rows["large"]]
    return out


async def run(cfg: ScaleConfig, progress: Callable[[str], None] = print, on_point: Callable[[dict], None] | None = None) -> dict:
    """Grow and compare point by point; `on_point` gets the report so far after each one (a long
    run that is stopped keeps what it measured)."""
    samples = locomo.load(cfg.locomo)
    words = list(locomo.events(samples, MEASURED_TENANT, cfg.conversations))
    fleet = SyntheticFleet(Vocabulary.from_turns(words), cfg.shape)
    small, large = Store(cfg, "small", progress), Store(cfg, "large", progress)
    registry = Registry(small.settings)  # the measured tenant's models, loaded once
    await small.load_measured(samples, registry)
    await large.load_measured(samples, Registry(large.settings).share_models(registry))
    encoder = registry.encoder()
    encoder.start()
    dim = encoder.dim
    points = sorted(cfg.points)
    await small.grow(fleet, dim, points[0])
    report: dict = {"config": {"points": points, "seed": cfg.shape.seed, "shape": asdict(cfg.shape), "chunk": CHUNK,
                               "conversations": sorted(cfg.conversations) if cfg.conversations else None,
                               "measured_encoder": registry.encoder_name, "bulk_models": BulkRegistry(small.settings, dim).encoder().model_name},
                    "points": [],
                    "measured_ingest": {store.name: _state(store.state_path).get("measured_ingest") for store in (small, large)}}
    for point in points[1:] or points[:1]:
        await large.grow(fleet, dim, point)
        progress(f"bench scale: comparing {small.stored_turns():,} and {large.stored_turns():,} stored turns")
        result = await asyncio.to_thread(compare, small, large, registry, samples, cfg)
        result["large_ingest"] = large.ingest
        result["large_ingest_cpu_ms_per_turn"] = cpu_per_turn(large.ingest)
        large.ingest = []
        report["points"].append(result)
        if cfg.settings_for is None:
            report["bytes_per_turn"] = _bytes_per_turn(report["points"])
        if on_point:
            on_point(report)
    return report


def _spent(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """CPU ms each process used between two readings (a process missing from either is left out)."""
    return {k: after[k] - before[k] for k in after if k in before}


def _per_turn(cpu_ms: dict[str, float], turns: int) -> dict[str, float]:
    """CPU ms per turn by process, and their sum."""
    out = {k: round(v / max(turns, 1), 3) for k, v in cpu_ms.items()}
    out["all processes"] = round(sum(out.values()), 3)
    return out


def cpu_per_turn(chunks: list[dict]) -> dict[str, float]:
    """CPU ms per bulk-loaded turn by process, their sum, and the wall ms per turn beside it."""
    turns = sum(c["turns"] for c in chunks)
    if not turns:
        return {}
    out = _per_turn({name: sum(c["cpu_ms"].get(name, 0.0) for c in chunks) for name in chunks[0].get("cpu_ms", {})}, turns)
    out["wall"] = round(sum(c["append_s"] + c["process_s"] for c in chunks) * 1000 / turns, 3)
    return out


def _bytes_per_turn(points: list[dict]) -> dict[str, dict[str, float]]:
    out = {}
    for p in points:
        for side in ("small", "large"):
            s = p[side]
            out[str(s["stored_turns"])] = {k: round(v / s["stored_turns"], 1) for k, v in s["disk_bytes"].items()}
    return dict(sorted(out.items(), key=lambda kv: int(kv[0])))


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = report["points"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    turns = [p["large"]["stored_turns"] for p in pts]
    for side, style in (("small", "o--"), ("large", "o-")):
        for q in ("p50", "p95"):
            axes[0].plot(turns, [p[side]["zero_mem_ms"][q] for p in pts], style, label=f"{q}, {side} store")
    axes[0].set_xscale("log")
    axes[0].set_xlabel("stored turns of the large store (the small one stays at the first point)")
    axes[0].set_ylabel("measured tenant's Zero-Mem latency (ms)")
    axes[0].legend(fontsize=8)
    bpt = report["bytes_per_turn"]
    xs = sorted(int(k) for k in bpt)
    for view in sorted({v for d in bpt.values() for v in d}):
        axes[1].plot(xs, [bpt[str(x)].get(view, 0) for x in xs], "o-", label=view)
    axes[1].set_xscale("log")
    axes[1].set_xlabel("stored turns")
    axes[1].set_ylabel("bytes on disk per stored turn")
    axes[1].legend(fontsize=8)
    ingest = [c for p in pts for c in p.get("large_ingest", [])]
    if ingest:
        axes[2].plot([c["turns"] / (c["append_s"] + c["process_s"]) for c in ingest], ".-")
    axes[2].set_xlabel(f"chunk of {CHUNK:,} fleet turns (fast model path)")
    axes[2].set_ylabel("add -> ready, turns/s")
    fig.suptitle("memstream bench scale (embedded)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
