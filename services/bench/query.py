"""`memstream bench query`: query latency per strategy at 1 and at N concurrent clients, over HTTP,
against a running serve (embedded by default, or a distributed deployment's serve with `--url`).

The LoCoMo dev split is first published through the API as the tenant `bench` (append rate and
add -> ready measured on the way: the first POST /v1/events to POST /v1/wait answering for the
last batch's positions), then its questions are asked: for each concurrency level, every strategy
answers every question, the strategies interleaved question by question (so that they meet the
same machine conditions; the machine is shared and noisy — compare within a run). Reported per
strategy and concurrency: the client's p50/p95/p99, the server's own total and per-stage p50
(`timings_ms` of each answer), throughput, and recall at the budgets (the gold turns of the dev
split), so that a faster configuration that answers worse shows.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import httpx

from services.bench.load import check_loopback
from services.eval.locomo import Question, percentile, questions, summarize
from services.eval.metrics import parse_ref, recall_at
from streams.sources import locomo

TENANT = "bench"
BATCH = 100  # events per POST /v1/events


@dataclass
class QueryBenchConfig:
    url: str
    key: str
    locomo: Path
    conversations: set[str] | None = None
    questions: int | None = None  # the first N questions (smoke runs)
    strategies: tuple[str, ...] = ("zero-mem", "bm25", "hierarchy-only")
    concurrency: tuple[int, ...] = (1, 4)
    budgets: tuple[int, ...] = (10, 25)
    warmup: int = 20
    extra: dict = field(default_factory=dict)


def _quantiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p95": None, "p99": None}
    return {f"p{q}": round(percentile(values, q), 2) for q in (50, 95, 99)}


class QueryBench:
    def __init__(self, cfg: QueryBenchConfig, progress: Callable[[str], None] = print):
        check_loopback(cfg.url)
        self.cfg, self.progress = cfg, progress
        samples = locomo.load(cfg.locomo)
        self.events = [e.model_dump(mode="json") for e in locomo.events(samples, TENANT, cfg.conversations)]
        self.qs: list[Question] = questions(samples, cfg.conversations)[: cfg.questions]

    async def run(self) -> dict:
        cfg = self.cfg
        limits = httpx.Limits(max_connections=max(cfg.concurrency) + 8)
        async with httpx.AsyncClient(base_url=cfg.url, headers={"Authorization": f"Bearer {cfg.key}"}, timeout=300, limits=limits) as http:
            self.http = http
            ingest = await self._ingest()
            for q in self.qs[: cfg.warmup]:  # caches built, files opened: steady state is measured
                for strategy in cfg.strategies:
                    await self._ask(q, strategy)
            query = {}
            for n in cfg.concurrency:
                self.progress(f"bench query: {len(self.qs)} questions x {len(cfg.strategies)} strategies, {n} concurrent client(s)")
                query[str(n)] = await self._round(n)
        return {"config": {"conversations": sorted(cfg.conversations) if cfg.conversations else "all", "questions": len(self.qs),
                           "strategies": list(cfg.strategies), "concurrency": list(cfg.concurrency), "budgets": list(cfg.budgets), **cfg.extra},
                "ingest": ingest, "query": query}

    async def _ingest(self) -> dict:
        """Publish the split, wait until every view has it: the append rate and add -> ready."""
        self.progress(f"bench query: publishing {len(self.events)} turns as tenant {TENANT!r}")
        t0 = time.monotonic()
        append_s, positions = 0.0, None
        for i in range(0, len(self.events), BATCH):
            t = time.monotonic()
            r = await self.http.post("/v1/events", json=self.events[i:i + BATCH])
            r.raise_for_status()
            append_s += time.monotonic() - t
            positions = r.json()["positions"]
        while positions is not None:  # not yet: a real model path takes minutes for the whole split
            w = await self.http.post("/v1/wait", json={"positions": positions, "timeout_seconds": 300})
            w.raise_for_status()
            if w.json()["caught_up"]:
                break
            self.progress(f"bench query: the views are still processing ({time.monotonic() - t0:.0f} s)")
        ready_s = time.monotonic() - t0
        n = len(self.events)
        return {"turns": n, "append_s": round(append_s, 2), "append_turns_per_s": round(n / append_s, 1) if append_s else None,
                "add_to_ready_s": round(ready_s, 2), "add_to_ready_turns_per_s": round(n / ready_s, 1) if ready_s else None}

    async def _ask(self, q: Question, strategy: str) -> tuple[float, dict]:
        body = {"tenant_id": TENANT, "conversation_id": q.conversation, "question": q.question, "strategy": strategy,
                "max_turns": max(self.cfg.budgets)}
        t = time.perf_counter()
        r = await self.http.post("/v1/search", json=body)
        ms = (time.perf_counter() - t) * 1000
        r.raise_for_status()
        return ms, r.json()

    async def _round(self, clients: int) -> dict:
        """Every (question, strategy) once, `clients` at a time; strategies interleaved per question."""
        cfg = self.cfg
        work = asyncio.Queue()
        for n, q in enumerate(self.qs):
            for j in range(len(cfg.strategies)):
                work.put_nowait((q, cfg.strategies[(n + j) % len(cfg.strategies)]))
        acc = {s: {"client": [], "server": [], "stages": {}, "rows": []} for s in cfg.strategies}

        async def client() -> None:
            while not work.empty():
                q, strategy = work.get_nowait()
                ms, resp = await self._ask(q, strategy)
                a = acc[strategy]
                a["client"].append(ms)
                timings = resp.get("timings_ms") or {}
                if "total" in timings:
                    a["server"].append(float(timings["total"]))
                for stage, v in timings.items():
                    if stage != "total":
                        a["stages"].setdefault(stage, []).append(float(v))
                gold = {f"D{s}:{t}" for s, t in q.gold}
                units = [[f"D{r[0]}:{r[1]}" for r in (parse_ref(t.get("source_ref")) for t in e["turns"]) if r] for e in resp["evidence"]]
                a["rows"].append((q, {b: recall_at(units, gold, b) for b in cfg.budgets}))

        t0 = time.monotonic()
        await asyncio.gather(*(client() for _ in range(clients)))
        wall = time.monotonic() - t0
        out = {}
        for strategy, a in acc.items():
            out[strategy] = {"client_ms": _quantiles(a["client"]), "server_ms": _quantiles(a["server"]),
                             "stage_ms_p50": {k: round(percentile(v, 50), 2) for k, v in sorted(a["stages"].items())},
                             "recall": summarize(a["rows"], list(cfg.budgets))}
        out["searches_per_s"] = round(sum(len(a["client"]) for a in acc.values()) / wall, 1) if wall else None
        return out


def plot(report: dict, path: Path, title: str = "memstream bench query") -> None:
    """Client p50/p95/p99 per strategy at each concurrency, and the server's stage p50s."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = list(report["query"])
    strategies = report["config"]["strategies"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.8 / (len(levels) * 3)
    for li, level in enumerate(levels):
        for qi, q in enumerate(("p50", "p95", "p99")):
            xs = [i + (li * 3 + qi) * width for i in range(len(strategies))]
            axes[0].bar(xs, [report["query"][level][s]["client_ms"][q] or 0 for s in strategies], width,
                        label=f"{q}, {level} client(s)", alpha=0.5 + 0.15 * qi, color=("tab:blue", "tab:orange", "tab:green", "tab:red")[li % 4])
    axes[0].set_xticks([i + 0.4 - width / 2 for i in range(len(strategies))], strategies)
    axes[0].set_ylabel("client latency (ms)")
    axes[0].legend(fontsize=7)
    first = report["query"][levels[0]]
    stages = sorted({k for s in strategies for k in first[s]["stage_ms_p50"]})
    bar = 0.8 / max(len(strategies), 1)
    for si, s in enumerate(strategies):  # grouped, not stacked: the stages nest (a view's time includes its engine calls)
        axes[1].barh([i + si * bar for i in range(len(stages))], [first[s]["stage_ms_p50"].get(k, 0.0) for k in stages], bar, label=s)
    axes[1].set_yticks([i + 0.4 - bar / 2 for i in range(len(stages))], stages, fontsize=7)
    axes[1].set_xlabel(f"server stage p50 (ms), {levels[0]} client(s)")
    axes[1].legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
