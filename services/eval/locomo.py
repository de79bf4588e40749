"""LoCoMo evaluation: ingest through the log into a fresh data directory, wait until ready, run
every category 1-4 question with its own conversation as the boundary, for each strategy.

    memstream eval locomo PATH [--conversations ID,…] [--strategies S,…] [--budgets 10,25] --out FILE.json

Rules (category mapping, evidence parsing, recall at a turn budget) are in metrics.py. The
reader is always the local counting server (zero_tokens.py) — forwarding to a real endpoint when
one is configured — and outbound connections to anything else are refused, so `llm_tokens` is
measured, not asserted.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Callable

from infra.registry import Registry
from infra.settings import Settings
from schemas.query import SearchRequest
from services.eval.metrics import CATEGORIES, parse_evidence, parse_ref, recall_at
from services.eval.readiness import check_answering
from services.eval.zero_tokens import CountingReader, refuse_outbound
from services.reports import write_json
from services.runtime import build_pipeline
from streams.sources import locomo


@dataclass(frozen=True)
class Question:
    conversation: str
    question: str
    answer: str
    category: int
    gold: frozenset[tuple[int, int]]


def questions(samples: list[dict], conversations: set[str] | None) -> list[Question]:
    out = []
    for s in samples:
        if conversations is not None and s["sample_id"] not in conversations:
            continue
        for q in s["qa"]:
            if q.get("category") not in CATEGORIES:
                continue
            gold = parse_evidence(q.get("evidence", []))
            if not gold:
                continue  # no parseable evidence: skipped (documented rule)
            out.append(Question(s["sample_id"], q["question"], str(q.get("answer", "")), q["category"], frozenset(gold)))
    return out


async def ingest(settings: Settings, registry: Registry, samples: list[dict], tenant: str, conversations: set[str] | None) -> dict:
    pipeline = build_pipeline(settings, registry=registry)
    t0 = time.perf_counter()
    await pipeline.start()
    load = time.perf_counter() - t0
    events = list(locomo.events(samples, tenant, conversations))
    t_first = time.perf_counter()
    await pipeline.publisher().publish(events)
    await pipeline.process_until_caught_up()
    await check_answering(pipeline, registry.encoder(), tenant, sorted({e.conversation_id for e in events}))
    seconds = time.perf_counter() - t_first
    await pipeline.close()
    return {"turns": len(events), "seconds": round(seconds, 2), "model_load_seconds": round(load, 2)}


def summarize(rows: list[tuple[Question, dict[int, float]]], budgets: list[int]) -> dict[str, dict[str, float]]:
    out = {}
    for b in budgets:
        per = {"all": round(statistics.fmean(r[b] for _, r in rows), 4) if rows else 0.0}
        for cat, name in CATEGORIES.items():
            vals = [r[b] for q, r in rows if q.category == cat]
            per[name] = round(statistics.fmean(vals), 4) if vals else 0.0
        out[f"budget_{b}"] = per
    return out


def percentile(values: list[float], p: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    k = max(0, min(len(s) - 1, int(round(p / 100 * (len(s) - 1)))))
    return s[k]


def request(q: Question, strategy: str, tenant: str, budget: int, k: int | None = None) -> SearchRequest:
    """The question's request (k: the service's default when None)."""
    return SearchRequest(question=q.question, tenant_id=tenant, conversation_id=q.conversation, strategy=strategy, max_turns=budget,
                         **({"k": k} if k is not None else {}))


def ask(service, q: Question, strategy: str, tenant: str, budgets: list[int] | tuple[int, ...], k: int | None = None):
    """One question: (latency in ms, the response, recall at each budget)."""
    t0 = time.perf_counter()
    resp = service.search(request(q, strategy, tenant, max(budgets), k))
    ms = (time.perf_counter() - t0) * 1000
    gold = {f"D{s}:{t}" for s, t in q.gold}
    units = [[f"D{r[0]}:{r[1]}" for r in (parse_ref(t.source_ref) for t in e.turns) if r] for e in resp.evidence]
    return ms, resp, {b: recall_at(units, gold, b) for b in budgets}


def evaluate_strategies(service, qs: list[Question], strategies: list[str], budgets: list[int], tenant: str, k: int,
                        tokens: Callable[[], int] | None = None, progress: Callable[[str], None] | None = None) -> dict[str, dict[str, Any]]:
    """Per strategy: recall at each budget, latency, LLM tokens (from `tokens`, the reader's
    counter) and — without a reader — how often the gold answer is among the typed answer
    candidates A(q) extracted from the evidence (eq. 16).

    Strategies are interleaved question by question (the order rotating), so that every one
    meets the same machine conditions: run one after the other, the first ran ~20 % slower
    than the same strategy run later (background work after ingest, shared cores)."""
    from services.query.answering import evidence_turns
    from services.query.answers import extract_candidates, gold_in_candidates
    from services.query.profile import answer_type

    strategies = list(dict.fromkeys(strategies))
    acc = {name: {"rows": [], "latencies": [], "stages": {}, "typed": {}, "tokens": 0} for name in strategies}
    for n, q in enumerate(qs):
        kind = answer_type(q.question)
        for j in range(len(strategies)):
            name = strategies[(n + j) % len(strategies)]
            a = acc[name]
            before = tokens() if tokens else 0
            ms, resp, recall = ask(service, q, name, tenant, budgets, k)
            a["latencies"].append(ms)
            a["tokens"] += (tokens() - before) if tokens else 0
            for stage, stage_ms in resp.timings_ms.items():
                a["stages"].setdefault(stage, []).append(stage_ms)
            a["rows"].append((q, recall))
            if kind in ("date", "duration", "number", "person", "place"):
                cands = extract_candidates([(t.turn_id, t.text, t.occurred_at) for t in evidence_turns(resp.evidence)], kind)
                a["typed"].setdefault(CATEGORIES[q.category], []).append(gold_in_candidates(q.answer, cands))
        if progress and (n + 1) % 100 == 0:
            progress(f"{n + 1}/{len(qs)} questions x {len(strategies)} strategies")
    out = {}
    for name, a in acc.items():
        everything = [x for v in a["typed"].values() for x in v]
        out[name] = {
            "recall": summarize(a["rows"], budgets),
            "latency_ms": {"p50": round(percentile(a["latencies"], 50), 2), "p95": round(percentile(a["latencies"], 95), 2)},
            # where the time goes: p50 of each stage the service timed (stages nest: the views
            # include the lexical and dense engine calls they make)
            "stage_ms_p50": {k: round(percentile(v, 50), 2) for k, v in sorted(a["stages"].items()) if k != "total"},
            "llm_tokens": a["tokens"],
            "answer_in_candidates": {"questions": len(everything), "all": round(statistics.fmean(everything), 4) if everything else None,
                                     **{c: round(statistics.fmean(v), 4) for c, v in sorted(a["typed"].items())}},
        }
    return out


def allowed_addresses(settings: Settings) -> set[tuple[str, int]]:
    """The configured stores' (host, port): the only outbound connections an evaluation may open
    besides the counting reader."""
    from urllib.parse import urlparse

    out = set()
    for url in (settings.log.url, settings.views.hierarchy_url, settings.views.lexical_url, settings.views.dense_url, settings.views.graph_url):
        parsed = urlparse(url)
        for hostport in parsed.netloc.split(","):
            if ":" in hostport:
                host, port = hostport.rsplit(":", 1)
                if port.isdigit():
                    out.add((host, int(port)))
    return out


def table(report: dict, budgets: list[int]) -> str:
    cats = ["all", *CATEGORIES.values()]
    short = {"all": "all", "multi-hop": "multi", "temporal": "temp", "open-domain": "open", "single-hop": "single"}
    head = f"{'strategy':<15}" + "".join(f"| B={b:<3}" + "".join(f"{short[c]:>7}" for c in cats) + " " for b in budgets) + "| p50 ms  p95 ms  tokens"
    lines = [head, "-" * len(head)]
    for name, s in report["strategies"].items():
        cells = "".join("|      " + "".join(f"{s['recall'][f'budget_{b}'][c]:>7.3f}" for c in cats) + " " for b in budgets)
        lines.append(f"{name:<15}{cells}| {s['latency_ms']['p50']:>6.1f}  {s['latency_ms']['p95']:>6.1f}  {s['llm_tokens']:>6}")
    return "\n".join(lines)


@dataclass
class Session:
    """An evaluation's served memory: the ingest report, the live views and a started query
    service, the counting reader (LLM tokens) and the refused outbound connections so far."""

    ingest: dict[str, Any]
    views: Any
    service: Any
    reader: CountingReader
    refused: list


@asynccontextmanager
async def session(settings: Settings, registry: Registry, samples, tenant: str, conversations: set[str] | None, *,
                  upstream: str | None = None, upstream_key: str | None = None) -> AsyncIterator[Session]:
    """Ingest the conversations and serve them, with every outbound connection refused except
    to the stores and the counting reader (which forwards to `upstream`, the optional final-QA
    reader, and counts its tokens): what proves an evaluation used zero LLM tokens."""
    from services.query.config import bounds_for
    from services.query.service import QueryService
    from services.views import LiveViews

    reader = CountingReader(upstream=upstream, upstream_key=upstream_key).start()
    try:
        with refuse_outbound({reader.address, *allowed_addresses(settings)}) as refused:
            before = reader.counter.snapshot()["tokens"]
            report = await ingest(settings, registry, samples, tenant, conversations)
            report["llm_tokens"] = reader.counter.snapshot()["tokens"] - before
            views = LiveViews(registry)
            try:
                service = QueryService(views, registry.encoder(), registry.extractor(),
                                       bounds=bounds_for(settings.query.path))
                service.start()
                yield Session(report, views, service, reader, refused)
            finally:
                views.close()
    finally:
        reader.close()


async def run(path: Path, *, conversations: set[str] | None, strategies: list[str], budgets: list[int], out: Path | None,
              k: int = 5, data_dir: Path | None = None, settings: Settings | None = None, registry: Registry | None = None,
              progress=print) -> dict:
    samples = locomo.load(path)
    tenant = "locomo"
    data_dir = data_dir or Path(tempfile.mkdtemp(prefix="memstream-eval-"))
    settings = settings or Settings.load(data_dir=data_dir)
    settings = settings.model_copy(update={"data_dir": data_dir})
    registry = registry or Registry(settings)
    registry.settings = settings
    registry.data_dir = data_dir
    report: dict[str, Any] = {"dataset": "locomo", "conversations": sorted(conversations) if conversations else None}
    key = settings.reader.api_key.get_secret_value() if settings.reader.api_key else None
    async with session(settings, registry, samples, tenant, conversations, upstream=settings.reader.url, upstream_key=key) as s:
        report["ingest"] = s.ingest
        qs = questions(samples, conversations)
        report["questions"] = len(qs)
        tokens = lambda: s.reader.counter.snapshot()["tokens"]  # noqa: E731
        report["strategies"] = await asyncio.to_thread(evaluate_strategies, s.service, qs, list(strategies), budgets, tenant, k, tokens, progress)
        report["refused_connections"] = len(s.refused)
        report["reader_requests"] = s.reader.counter.snapshot()["requests"]
    if out is not None:
        write_json(report, out)
    return report
