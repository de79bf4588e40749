"""`memstream bench grow`: the bounded query path (services/query/candidates.py) measured as one
conversation grows, and as a whole tenant is searched while it is written to.

Embedded, with the configured models (the real ones by default: the filler has to compete in
every view, the dense and graph views included, which the fast path's vectors and names would
not). Three parts, each selectable:

- `loop`: an agent's loop against a real `memstream serve` through the Python client, at each
  size the conversation reaches. A round adds one turn, waits for it (`wait` on its positions),
  searches right after the write, then searches once more with nothing written since. Every
  turn written is a unique fact ("Ada Bacedi's locker code is 4471"); half the rounds ask about
  it right after the write and half ask it with nothing written since (after a dev question
  asked right after the write), so both conditions see the same mix of questions. A written turn
  missing from its search's evidence is a failure, counted and reported. Dev questions come from
  the conversation's LoCoMo questions, then (when the rounds need more than it has) from the
  other dev conversations' (latency only); no question is asked twice at one size.
- `haystack`: the conversation's LoCoMo questions asked in-process of the store at each size
  (no re-ingest): Zero-Mem on the bounded path (the service's default) and over the whole
  boundary (`bounds=None`, up to `whole_up_to` turns), BM25 and dense; recall at B = 10 / 25 with
  95 % intervals, per category, the paired differences of Zero-Mem with the others (where it
  loses, per category) and how many gold turns the bounded path's candidates hold at all
  (a loss of the candidates, not of the ranking).
- `tenant`: many conversations in one tenant (the dev conversation among them), searched
  tenant-wide and per agent while a writer thread adds turns to other conversations of the
  tenant at a fixed rate.

The conversation: a LoCoMo dev conversation's own turns (their real session dates) placed among
filler sessions of the same conversation (services/bench/fleet.py `ConversationFiller`: its
speakers, names and words), dated across a window three times the real sessions' span so that
the real sessions sit in its middle at every size (a low-discrepancy sequence of dates: any
prefix of the filler covers the window evenly).

Resumable: each store keeps `grow.json` in its directory (turns appended and processed, turns the
loop wrote); a stopped run continues from there, and re-appending a chunk is harmless (event ids
repeat, views keep the first). The loop's turns are new on every run (they extend the count).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import platform
import random
import subprocess
import threading
import time
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from infra.registry import Registry
from infra.settings import Settings
from services.bench.fleet import ConversationFiller, FleetShape, SyntheticFleet, Vocabulary
from services.eval.intervals import paired, stratified
from services.eval.locomo import Question, ask, questions, request
from services.eval.metrics import CATEGORIES, parse_ref, recall_at
from services.runtime import build_pipeline
from streams.sources import locomo

TENANT = "grow"  # the loop's and the haystack's tenant
CHUNK = 2_000  # turns appended then processed at a time (the resume granularity)
BUDGETS = (10, 25)
PARTS = ("loop", "haystack", "tenant")
WARMUP = 5  # searches before each measured phase, not counted (the first answers pay files opened and models warmed)
RESAMPLES = 2_000  # bootstrap resamples of a latency quantile
SEED = 20261203
_PHI = (math.sqrt(5) - 1) / 2

# (url, key) of a running `memstream serve` on the given data directory, for the block's duration.
Serve = Callable[[Path], AbstractContextManager[tuple[str, str]]]
Progress = Callable[[str], None]


@dataclass
class GrowConfig:
    locomo: Path
    root: Path
    conversation: str = "conv-26"
    sizes: tuple[int, ...] = (1_000, 10_000, 100_000)
    rounds: int = 200
    parts: tuple[str, ...] = ("loop", "haystack")
    whole_up_to: int = 10_000  # the whole-boundary Zero-Mem runs at sizes up to this
    questions: int | None = None  # the haystack's first N questions (smoke runs)
    tenant_conversations: int = 200
    tenant_turns: int = 100_000
    tenant_agents: int = 8
    write_rate: float = 50.0  # turns/s the tenant part's writer offers
    tenant_searches: int = 200  # of each kind: tenant-wide and agent-scoped
    seed: int = 7
    turns_per_session: int = 20
    extra: dict = field(default_factory=dict)


# -- stores ------------------------------------------------------------------------------------
def _settings(data_dir: Path) -> Settings:
    data_dir.mkdir(parents=True, exist_ok=True)
    return Settings.load(data_dir=data_dir).model_copy(update={"data_dir": data_dir})


class Store:
    """A data directory grown by appending and processing chunks, and its state file."""

    def __init__(self, root: Path, name: str, models: Registry, progress: Progress):
        self.dir, self.models, self.progress = root / name, models, progress
        self.settings = _settings(self.dir)
        self.state_path = self.dir / "grow.json"
        self.state: dict = json.loads(self.state_path.read_text()) if self.state_path.exists() else {}
        self.ingest: list[dict] = []  # the chunks this run loaded

    def registry(self) -> Registry:
        return Registry(self.settings).share_models(self.models)

    def save(self) -> None:
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.state, indent=2))
        os.replace(tmp, self.state_path)

    def check(self, identity: dict) -> None:
        """The store was grown for this configuration and these models (or is new)."""
        identity = {**identity, "encoder": self.models.encoder_name, "ner": self.models.settings.ner.model}
        if self.state.setdefault("identity", identity) != identity:
            raise SystemExit(f"{self.dir} was grown with another configuration ({self.state['identity']}, now "
                             f"{identity}); use another --root")
        self.save()

    async def load(self, key: str, source: Callable[[int, int], list], target: int, label: str) -> None:
        """Append and process `source(have, have + n)` chunk by chunk until `state[key]` reaches
        `target`. The state is saved after the views hold a chunk: a resume never skips one."""
        have = self.state.get(key, 0)
        if have >= target:
            return
        pipeline = build_pipeline(self.settings, registry=self.registry())
        await pipeline.start()
        try:
            publisher = pipeline.publisher()
            t_start, start_have = time.perf_counter(), have
            while have < target:
                n = min(CHUNK, target - have)
                t0 = time.perf_counter()
                await publisher.publish(source(have, have + n))
                t1 = time.perf_counter()
                await pipeline.process_until_caught_up()
                t2 = time.perf_counter()
                have += n
                self.state[key] = have
                self.save()
                self.ingest.append({"what": label, "turns": n, "append_s": round(t1 - t0, 3),
                                    "process_s": round(t2 - t1, 3)})
                rate = (have - start_have) / (time.perf_counter() - t_start)
                self.progress(f"bench grow: {self.dir.name}: {label} {have:,}/{target:,} turns, {rate:.1f} turns/s, "
                              f"~{(target - have) / rate / 60:.1f} min left")
        finally:
            await pipeline.close()

    def stored_turns(self, tenant: str, conversation: str | None) -> int:
        """Turns the hierarchy view holds for the conversation (None: the tenant's)."""
        from schemas.ports.views import Boundary
        from services.views import LiveViews

        views = LiveViews(self.registry())
        try:
            units = views.store("hierarchy")
            return units.size(Boundary(tenant_id=tenant, conversation_ids=(conversation,) if conversation else None))
        finally:
            views.close()

    def ingest_rate(self) -> dict:
        turns = sum(c["turns"] for c in self.ingest)
        seconds = sum(c["append_s"] + c["process_s"] for c in self.ingest)
        return {"turns": turns, "seconds": round(seconds, 1),
                "turns_per_s": round(turns / seconds, 1) if seconds else None}


# -- the conversation --------------------------------------------------------------------------
def _sample(samples: list[dict], conversation: str) -> dict:
    for s in samples:
        if s["sample_id"] == conversation:
            return s
    have = [s["sample_id"] for s in samples]
    raise SystemExit(f"--conversation: {conversation!r} is not in the LoCoMo file (it has {have})")


@dataclass(frozen=True)
class Window:
    """Where the filler sessions are dated: the real sessions' span with as much again on each side."""

    start: datetime
    end: datetime

    @classmethod
    def around(cls, sample: dict) -> "Window":
        dates = [d for _, _, d in locomo.sessions(sample)]
        span = max(max(dates) - min(dates), timedelta(days=30))
        return cls(min(dates) - span, max(dates) + span)

    def day_of(self, session: int) -> datetime:
        """Session s's date: the golden-ratio sequence over the window, a time of day of its own."""
        frac = ((session + 1) * _PHI) % 1.0
        day = self.start + timedelta(days=int(frac * (self.end - self.start).days))
        minutes = random.Random(f"grow:hour:{session}").randrange(14 * 60)
        return day.replace(hour=8, minute=0) + timedelta(minutes=minutes)


FIRST_NAMES = ("Ada", "Bruno", "Cleo", "Dmitri", "Esme", "Farid", "Greta", "Hugo", "Ines", "Jonah", "Kira", "Leon",
               "Mara", "Nico", "Olga", "Pavel", "Quinn", "Rosa", "Soren", "Tala")
SYLLABLES = ("ba", "ce", "di", "fo", "gu", "ka", "le", "mi", "no", "pu", "ra", "se", "ti", "vo", "wu", "xa", "ye", "zo",
             "lu", "ne")
ATTRIBUTES = ("locker code", "gate code", "bike lock combination", "gym membership number", "storage unit number",
              "parking permit number", "library card PIN", "mailbox number")


@dataclass(frozen=True)
class Fact:
    """The n-th unique fact the loop writes about someone (n counts every loop turn the store holds)."""

    n: int
    subject: str
    attribute: str
    value: int

    @classmethod
    def number(cls, n: int) -> "Fact":
        first, rest = FIRST_NAMES[n % len(FIRST_NAMES)], n // len(FIRST_NAMES)
        syllables = []
        for _ in range(3):  # 8,000 surnames per first name: unique up to 160,000 facts
            rest, d = divmod(rest, len(SYLLABLES))
            syllables.append(SYLLABLES[d])
        rng = random.Random(f"grow:fact:{n}")
        return cls(n, f"{first} {''.join(syllables).capitalize()}", rng.choice(ATTRIBUTES), rng.randrange(1000, 10_000))

    @property
    def text(self) -> str:
        return f"By the way, {self.subject}'s {self.attribute} is {self.value}, in case anyone asks."

    @property
    def question(self) -> str:
        return f"What is {self.subject}'s {self.attribute}?"


def _gold(q: Question) -> set[str]:
    return {f"D{s}:{t}" for s, t in q.gold}


def _refs(evidence: Iterable) -> list[list[str]]:
    """Per evidence unit, its turns' LoCoMo refs (`source_ref`), from a service or client response."""
    out = []
    for e in evidence:
        refs = []
        for t in e.turns:
            r = parse_ref(t.source_ref)
            if r:
                refs.append(f"D{r[0]}:{r[1]}")
        out.append(refs)
    return out


# -- figures -----------------------------------------------------------------------------------
def spread(values: list[float]) -> dict:
    """n, p50 and p95 with their bootstrap 95 % intervals (fixed seed: a rerun gives the same)."""
    if not values:
        return {"n": 0}
    a = np.asarray(values, dtype=np.float64)
    draws = a[np.random.default_rng(SEED).integers(0, len(a), size=(RESAMPLES, len(a)))]
    out: dict = {"n": len(a)}
    for q in (50, 95):
        low, high = np.percentile(np.percentile(draws, q, axis=1), [2.5, 97.5])
        out[f"p{q}"] = round(float(np.percentile(a, q)), 2)
        out[f"p{q}_ci95"] = [round(float(low), 2), round(float(high), 2)]
    return out


def _by_category(rows: list[tuple[Question, float]]) -> dict:
    """Mean with its 95 % interval, for all questions and per category (strata: the conversation)."""
    out = {}
    for name, sel in [("all", rows), *((n, [r for r in rows if r[0].category == c]) for c, n in CATEGORIES.items())]:
        if sel:
            out[name] = stratified([v for _, v in sel], [q.conversation for q, _ in sel]).as_dict() | {"n": len(sel)}
    return out


def _paired_by_category(a: list[tuple[Question, float]], b: list[tuple[Question, float]]) -> dict:
    out = {}
    for name in ["all", *CATEGORIES.values()]:
        idx = [i for i, (q, _) in enumerate(a) if name == "all" or CATEGORIES[q.category] == name]
        if idx:
            iv = paired([a[i][1] for i in idx], [b[i][1] for i in idx], [a[i][0].conversation for i in idx])
            out[name] = iv.as_dict() | {"verdict": iv.verdict(), "n": len(idx)}
    return out


def machine() -> dict:
    meminfo = Path("/proc/meminfo")
    mem = next((int(line.split()[1]) // 1024 for line in meminfo.read_text().splitlines()
                if line.startswith("MemTotal:")), None) if meminfo.exists() else None
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    return {"cores": os.cpu_count(), "usable_cores": usable, "memory_mb": mem, "platform": platform.platform(),
            "python": platform.python_version()}


def commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parents[2], capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


# -- part 2: recall while growing --------------------------------------------------------------
def haystack(registry: Registry, qs: list[Question], warm: list[str], cfg: GrowConfig, size: int,
             progress: Progress) -> dict:
    """The conversation's questions in-process, every strategy on every question, interleaved."""
    from services.query.context import Ranking
    from services.query.service import QueryService
    from services.views import LiveViews

    views = LiveViews(registry)
    try:
        encoder, extractor = registry.encoder(), registry.extractor()
        bounded = QueryService(views, encoder, extractor)
        bounded.start()
        runs = [("zero-mem", bounded, "zero-mem"), ("bm25", bounded, "bm25"), ("dense", bounded, "dense")]
        if size <= cfg.whole_up_to:
            runs.append(("zero-mem-whole", QueryService(views, encoder, extractor, bounds=None), "zero-mem"))
        candidates: dict[str, set[str]] = {}

        def probe(ctx) -> Ranking:  # the bounded path's candidate turns, ranked by nothing
            corpus = ctx.corpus
            candidates[ctx.request.question] = {ref for i in range(corpus.n) if (ref := corpus.turn_ref(i).source_ref)}
            return Ranking([])

        prober = QueryService(views, encoder, extractor, strategies={"zero-mem": probe})
        for text in warm[:WARMUP]:  # not counted: the whole path's first question builds its corpus
            for _, service, strategy in runs:
                warm_q = Question(cfg.conversation, text, "", 4, frozenset())
                service.search(request(warm_q, strategy, TENANT, max(BUDGETS)))
        rows: dict[str, dict[int, list[tuple[Question, float]]]] = {
            label: {b: [] for b in BUDGETS} for label, _, _ in runs}
        latency: dict[str, list[float]] = {label: [] for label, _, _ in runs}
        stages: dict[str, dict[str, list[float]]] = {label: {} for label, _, _ in runs}
        held: list[tuple[Question, float]] = []
        t_start = time.perf_counter()
        for n, q in enumerate(qs):
            for j in range(len(runs)):
                label, service, strategy = runs[(n + j) % len(runs)]
                ms, resp, recall = ask(service, q, strategy, TENANT, BUDGETS)
                latency[label].append(ms)
                for stage, v in resp.timings_ms.items():
                    stages[label].setdefault(stage, []).append(v)
                for b in BUDGETS:
                    rows[label][b].append((q, recall[b]))
            prober.search(request(q, "zero-mem", TENANT, max(BUDGETS)))
            gold = _gold(q)
            held.append((q, len(gold & candidates.pop(q.question, set())) / len(gold)))
            if (n + 1) % 25 == 0:
                left = (len(qs) - n - 1) * (time.perf_counter() - t_start) / (n + 1)
                progress(f"bench grow: haystack at {size:,}: {n + 1}/{len(qs)} questions x {len(runs)} strategies, "
                         f"~{left / 60:.1f} min left")
    finally:
        views.close()
    out: dict = {"questions": len(qs), "strategies": {}}
    for label, service, strategy in runs:
        out["strategies"][label] = {
            "strategy": strategy, "path": "whole boundary" if service.bounds is None else "bounded",
            "recall": {f"budget_{b}": _by_category(rows[label][b]) for b in BUDGETS},
            "latency_ms": spread(latency[label]),
            "stage_ms_p50": {k: round(float(np.percentile(v, 50)), 2)
                             for k, v in sorted(stages[label].items()) if k != "total"}}
    # Where Zero-Mem on the bounded path loses, per category: to the whole path, to either signal alone.
    out["zero_mem_minus"] = {
        other: {f"budget_{b}": _paired_by_category(rows["zero-mem"][b], rows[other][b]) for b in BUDGETS}
        for other in ("zero-mem-whole", "bm25", "dense") if other in rows}
    out["gold_in_bounded_candidates"] = _by_category(held)
    return out


# -- part 1: the agent loop --------------------------------------------------------------------
def _found(resp, event_id: str) -> bool:
    return any(t.event_id == event_id for e in resp.evidence for t in e.turns)


def loop(url: str, key: str, store: Store, cfg: GrowConfig, dev: list[Question], more: list[str], warm: list[str],
         speakers: tuple[str, str], day: datetime, size: int, progress: Progress) -> dict:
    """`cfg.rounds` rounds of add, wait, search after the write, search with nothing written since."""
    from memstream_client import Client, Turn

    # Dev questions, this conversation's first: even ones after a write, odd ones with nothing written since.
    pool = [*[(q.question, q) for q in dev], *[(text, None) for text in more]]
    after_dev, idle_dev = pool[0::2], pool[1::2]
    first = store.state.get("loop_turns", 0)
    session = f"loop_{first + 1}"
    acc: dict[str, dict[str, dict[str, list[float]]]] = {
        c: {k: {"client": [], "server": []} for k in ("written", "dev")} for c in ("after_write", "idle")}
    add_ms, wait_ms, searchable_ms, misses, errors, dev_rows = [], [], [], [], [], []
    with Client(url, key, tenant_id=TENANT, timeout=300) as client:
        for text in warm[:WARMUP]:
            client.search(text, conversation_id=cfg.conversation, max_turns=max(BUDGETS))
        t_start = time.perf_counter()
        for i in range(cfg.rounds):
            fact = Fact.number(first + i)
            speaker = speakers[i % 2]
            turn = Turn(conversation_id=cfg.conversation, speaker=speaker, agent_id=speaker, text=fact.text,
                        session_id=session, turn_index=i + 1, event_id=f"grow:loop:{cfg.conversation}:{fact.n}",
                        occurred_at=day + timedelta(minutes=i))
            try:
                t0 = time.perf_counter()
                added = client.add([turn])
                t1 = time.perf_counter()
                client.wait(added.positions, timeout=300)
                t2 = time.perf_counter()
            except Exception as exc:  # noqa: BLE001 - a benchmark reports what failed and goes on
                errors.append(f"round {i}: add/wait: {exc!r}"[:300])
                continue
            finally:
                store.state["loop_turns"] = first + i + 1
            add_ms.append((t1 - t0) * 1000)
            wait_ms.append((t2 - t1) * 1000)
            searchable_ms.append((t2 - t0) * 1000)
            if i % 2 == 0:  # ask about the turn just written, then a dev question
                plan = [("after_write", "written", fact.question, None), ("idle", "dev", *idle_dev[i // 2])]
            else:  # a dev question, then the turn this round wrote
                plan = [("after_write", "dev", *after_dev[i // 2]), ("idle", "written", fact.question, None)]
            for condition, kind, question, q in plan:
                try:
                    t = time.perf_counter()
                    resp = client.search(question, conversation_id=cfg.conversation, max_turns=max(BUDGETS))
                    ms = (time.perf_counter() - t) * 1000
                except Exception as exc:  # noqa: BLE001
                    errors.append(f"round {i}: search: {exc!r}"[:300])
                    if kind == "written":
                        misses.append({"round": i, "condition": condition, "question": question, "error": True})
                    continue
                acc[condition][kind]["client"].append(ms)
                if "total" in resp.timings_ms:
                    acc[condition][kind]["server"].append(resp.timings_ms["total"])
                if kind == "written" and not _found(resp, turn.event_id):
                    misses.append({"round": i, "condition": condition, "question": question,
                                   "evidence_units": len(resp.evidence), "notes": resp.notes[:3]})
                elif q is not None and condition == "after_write":
                    gold = _gold(q)
                    dev_rows.append((q, recall_at(_refs(resp.evidence), gold, BUDGETS[0])))
            if (i + 1) % 25 == 0 or i + 1 == cfg.rounds:
                store.save()
                rate = (i + 1) / (time.perf_counter() - t_start)
                progress(f"bench grow: loop at {size:,}: {i + 1}/{cfg.rounds} rounds, {len(misses)} written turns "
                         f"missed, ~{(cfg.rounds - i - 1) / rate / 60:.1f} min left")
    store.save()

    def condition(c: str) -> dict:
        kinds = acc[c].values()
        return {"client_ms": spread([x for v in kinds for x in v["client"]]),
                "server_total_ms": spread([x for v in kinds for x in v["server"]]),
                **{kind: {"client_ms": spread(v["client"]), "server_total_ms": spread(v["server"])}
                   for kind, v in acc[c].items()}}

    return {"rounds": cfg.rounds, "after_write": condition("after_write"), "idle": condition("idle"),
            "add_to_searchable_ms": spread(searchable_ms), "add_ms": spread(add_ms), "wait_ms": spread(wait_ms),
            "written_turn_misses": len(misses), "miss_samples": misses[:10],
            "errors": len(errors), "error_samples": errors[:10],
            "dev_recall_after_write_b10": _by_category(dev_rows).get("all")}


# -- part 3: tenant-wide -----------------------------------------------------------------------
class Writer(threading.Thread):
    """Adds turns to the tenant at `rate` turns/s, in batches of a fifth of a second, until told to
    stop. Open loop: what is due by the clock is sent, so a slow answer delays the next batch but
    does not lower the offered rate; the rate held is what was acknowledged per second."""

    def __init__(self, url: str, key: str, tenant: str, fleet: SyntheticFleet, start: int, rate: float):
        super().__init__(name="bench-grow-writer", daemon=True)
        self.url, self.key, self.tenant, self.fleet, self.first, self.rate = url, key, tenant, fleet, start, rate
        self.stop_event = threading.Event()
        self.sent = self.acked = 0
        self.late = 0  # batches sent more than one interval after they were due
        self.errors: list[str] = []
        self.positions: dict[int, int] = {}
        self.seconds = 0.0

    def run(self) -> None:
        from memstream_client import Client

        interval = 0.2
        with Client(self.url, self.key, tenant_id=self.tenant, timeout=120) as client:
            t0 = time.monotonic()
            while not self.stop_event.is_set():
                due = int(self.rate * (time.monotonic() - t0)) - self.sent
                if due <= 0:
                    self.stop_event.wait(interval / 4)
                    continue
                if due > self.rate * interval * 2:
                    self.late += 1
                n = min(due, max(1, int(self.rate * interval * 5)))  # a backlog drains in bounded batches
                batch = [e.model_dump(mode="json", exclude_none=True)
                         for e in self.fleet.turns(self.first + self.sent, self.first + self.sent + n)]
                self.sent += n
                try:
                    result = client.add(batch)
                except Exception as exc:  # noqa: BLE001
                    self.errors.append(repr(exc)[:300])
                    continue
                self.acked += result.accepted
                for p, o in result.positions.items():
                    self.positions[p] = max(o, self.positions.get(p, 0))
            self.seconds = time.monotonic() - t0


def tenant(store: Store, serve: Serve, cfg: GrowConfig, sample: dict, vocabulary: Vocabulary, warm: list[str],
           qs: list[Question], more: list[str], progress: Progress) -> dict:
    from memstream_client import Client

    dev = list(locomo.events([sample], "unused", {cfg.conversation}))
    per = math.ceil(max(1, cfg.tenant_turns - len(dev)) / max(1, cfg.tenant_conversations - 1))
    shape = FleetShape(seed=cfg.seed, tenants=1, agents_per_tenant=cfg.tenant_agents, turns_per_conversation=per,
                       turns_per_session=cfg.turns_per_session, tenant_prefix="grow-tenant")
    fleet = SyntheticFleet(vocabulary, shape)
    tenant_id = fleet.tenant_id(0)
    dev = [e.model_copy(update={"tenant_id": tenant_id}) for e in dev]
    store.check({"conversation": cfg.conversation, "shape": asdict(shape)})
    fleet_turns = max(0, cfg.tenant_turns - len(dev))
    asyncio.run(store.load("dev_turns", lambda a, b: dev[a:b], len(dev), "dev conversation"))
    asyncio.run(store.load("fleet_turns", lambda a, b: list(fleet.turns(a, b)), fleet_turns, "fleet"))
    stored = store.stored_turns(tenant_id, None)
    agents = [f"agent-0-{a}" for a in range(cfg.tenant_agents)]
    texts = [*[q.question for q in qs], *more]
    by_text = {q.question: q for q in qs}
    wide: dict[str, list[float]] = {"client": [], "server": []}
    scoped: dict[str, list[float]] = {"client": [], "server": []}
    rows, errors = [], []
    load_before = os.getloadavg()
    with serve(store.dir) as (url, key), Client(url, key, tenant_id=tenant_id, timeout=300) as client:
        for text in warm[:WARMUP]:
            client.search(text, max_turns=max(BUDGETS))
            client.search(text, agent_id=agents[0], max_turns=max(BUDGETS))
        writer = Writer(url, key, tenant_id, fleet, fleet_turns + store.state.get("written", 0), cfg.write_rate)
        writer.start()
        progress(f"bench grow: tenant: {stored:,} turns, {cfg.tenant_searches} tenant-wide and {cfg.tenant_searches} "
                 f"agent-scoped searches while writing {cfg.write_rate:g} turns/s")
        try:
            for i in range(cfg.tenant_searches):
                text = texts[i % len(texts)]
                agent = {"agent_id": agents[i % len(agents)]}
                for scope, acc, options in (("tenant", wide, {}), ("agent", scoped, agent)):
                    try:
                        t = time.perf_counter()
                        resp = client.search(text, max_turns=max(BUDGETS), **options)
                        acc["client"].append((time.perf_counter() - t) * 1000)
                    except Exception as exc:  # noqa: BLE001
                        errors.append(f"{scope} search: {exc!r}"[:300])
                        continue
                    if "total" in resp.timings_ms:
                        acc["server"].append(resp.timings_ms["total"])
                    if scope == "tenant" and text in by_text and i < len(texts):
                        q = by_text[text]
                        rows.append((q, recall_at(_refs(resp.evidence), _gold(q), BUDGETS[0])))
                if (i + 1) % 50 == 0:
                    progress(f"bench grow: tenant: {i + 1}/{cfg.tenant_searches} searches of each kind, "
                             f"{writer.acked:,} turns written")
        finally:
            writer.stop_event.set()
            writer.join(300)
        t_stop = time.perf_counter()
        caught_up = None
        try:
            if writer.positions:
                client.wait(writer.positions, timeout=1800)
            caught_up = round(time.perf_counter() - t_stop, 2)
        except Exception as exc:  # noqa: BLE001
            errors.append(f"wait for the writer's turns: {exc!r}"[:300])
    store.state["written"] = store.state.get("written", 0) + writer.sent
    store.save()
    achieved = writer.acked / writer.seconds if writer.seconds else 0.0
    return {"tenant_id": tenant_id, "conversations": math.ceil(fleet_turns / per) + 1, "stored_turns_before": stored,
            "agents": agents, "ingest": store.ingest_rate(),
            "tenant_wide": {"client_ms": spread(wide["client"]), "server_total_ms": spread(wide["server"]),
                            "recall_b10_dev_questions": _by_category(rows).get("all")},
            "agent_scoped": {"client_ms": spread(scoped["client"]), "server_total_ms": spread(scoped["server"])},
            "writer": {"offered_turns_per_s": cfg.write_rate, "achieved_turns_per_s": round(achieved, 2),
                       "kept_up": achieved >= 0.95 * cfg.write_rate, "turns_sent": writer.sent,
                       "turns_acknowledged": writer.acked,
                       "late_batches": writer.late, "seconds": round(writer.seconds, 1), "errors": len(writer.errors),
                       "error_samples": writer.errors[:5],
                       "views_caught_up_s_after_writer_stopped": caught_up},
            "errors": len(errors), "error_samples": errors[:10],
            "load_average": {"before": _load(load_before), "after": _load()}}


# -- the run -----------------------------------------------------------------------------------
def _load(values: tuple[float, ...] | None = None) -> list[float]:
    """The 1, 5 and 15 minute load averages (now, unless given)."""
    return [round(x, 2) for x in (values or os.getloadavg())]


def run(cfg: GrowConfig, serve: Serve, progress: Progress = print,
        on_report: Callable[[dict], None] | None = None) -> dict:
    """Every selected part; `on_report` gets the report so far after each size and part (a long
    run that is stopped keeps what it measured)."""
    samples = locomo.load(cfg.locomo)
    sample = _sample(samples, cfg.conversation)
    dev_events = list(locomo.events([sample], TENANT, {cfg.conversation}))
    vocabulary = Vocabulary.from_turns(dev_events)
    speakers = tuple(dict.fromkeys(e.speaker for e in dev_events))[:2]
    if len(speakers) < 2:
        raise SystemExit(f"{cfg.conversation} has fewer than two speakers")
    qs = questions(samples, {cfg.conversation})
    seen = {q.question for q in qs}
    more = [t for t in dict.fromkeys(q.question for q in questions(samples, None) if q.conversation != cfg.conversation)
            if t not in seen]
    warm, more = more[-WARMUP:], more[:-WARMUP]  # warm-up questions are never measured ones
    if "loop" in cfg.parts and cfg.rounds > len(qs) + len(more):
        raise SystemExit(f"--rounds: at most {len(qs) + len(more)} (the dev split's distinct questions; none is "
                         "asked twice)")

    models = Registry(_settings(cfg.root / "conversation"))
    encoder = models.encoder()
    encoder.start()
    models.extractor().start()
    report: dict = {
        "config": {**{k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items() if k != "extra"},
                   **cfg.extra,
                   "budgets": list(BUDGETS), "chunk": CHUNK, "encoder": encoder.model_name,
                   "ner": getattr(models.extractor(), "model_name", type(models.extractor()).__name__)},
        "commit": commit(), "machine": machine() | {"load_average_before": _load()},
        "sizes": [], "failures": {"written_turn_misses": 0, "errors": 0},
    }

    def emit() -> None:
        report["machine"]["load_average_after"] = _load()
        if on_report:
            on_report(report)

    if {"loop", "haystack"} & set(cfg.parts):
        store = Store(cfg.root, "conversation", models, progress)
        window = Window.around(sample)
        fleet = SyntheticFleet(vocabulary, FleetShape(seed=cfg.seed, turns_per_session=cfg.turns_per_session))
        filler = ConversationFiller(fleet, tenant_id=TENANT, conversation_id=cfg.conversation, speakers=speakers,
                                    day_of=window.day_of, event_prefix=f"grow:{cfg.conversation}:filler")
        store.check({"conversation": cfg.conversation, "seed": cfg.seed, "turns_per_session": cfg.turns_per_session})
        for n, size in enumerate(sorted(cfg.sizes)):
            asyncio.run(store.load("dev_turns", lambda a, b: dev_events[a:b], len(dev_events), "dev conversation"))
            want = size - len(dev_events) - store.state.get("loop_turns", 0)
            asyncio.run(store.load("filler_turns", lambda a, b: list(filler.turns(a, b)), max(0, want), "filler"))
            point: dict = {"size": size, "stored_turns": store.stored_turns(TENANT, cfg.conversation),
                           "filler_turns": store.state.get("filler_turns", 0), "ingest": store.ingest_rate(),
                           "load_average_before": _load()}
            store.ingest = []
            report["sizes"].append(point)
            if point["stored_turns"] > size:
                progress(f"bench grow: the conversation already holds {point['stored_turns']:,} turns (> {size:,})")
            if "haystack" in cfg.parts:
                progress(f"bench grow: haystack at {point['stored_turns']:,} turns")
                point["haystack"] = haystack(store.registry(), qs[: cfg.questions], warm, cfg, point["stored_turns"],
                                             progress)
                emit()
            if "loop" in cfg.parts:
                progress(f"bench grow: loop at {point['stored_turns']:,} turns, {cfg.rounds} rounds")
                day = window.end + timedelta(days=1 + n)
                with serve(store.dir) as (url, key):
                    point["loop"] = loop(url, key, store, cfg, qs, more, warm, speakers, day, size, progress)
                report["failures"]["written_turn_misses"] += point["loop"]["written_turn_misses"]
                report["failures"]["errors"] += point["loop"]["errors"]
            point["load_average_after"] = _load()
            emit()
    if "tenant" in cfg.parts:
        store = Store(cfg.root, "tenant", models, progress)
        report["tenant"] = tenant(store, serve, cfg, sample, vocabulary, warm, qs, more, progress)
        report["failures"]["errors"] += report["tenant"]["errors"] + report["tenant"]["writer"]["errors"]
    emit()
    return report


def plot(report: dict, path: Path) -> None:
    """Latency p50/p95 against size (after a write, with nothing written since; add -> searchable)
    and recall against size per strategy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = report["sizes"]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    looped = [p for p in points if "loop" in p]
    names = {"after_write": "after a write", "idle": "nothing written since"}
    for condition, colour in (("after_write", "tab:red"), ("idle", "tab:green")):
        for q, style in (("p50", "o-"), ("p95", "s--")):
            stats = [(p["stored_turns"], p["loop"][condition]["client_ms"]) for p in looped]
            stats = [(x, st) for x, st in stats if st.get(q) is not None]
            if stats:
                xs, ys = [x for x, _ in stats], [st[q] for _, st in stats]
                err = [[st[q] - st[f"{q}_ci95"][0] for _, st in stats], [st[f"{q}_ci95"][1] - st[q] for _, st in stats]]
                axes[0].errorbar(xs, ys, yerr=err, fmt=style, color=colour, capsize=3, label=f"{q}, {names[condition]}")
    for q, style in (("p50", "o-"), ("p95", "s--")):
        stats = [(p["stored_turns"], p["loop"]["add_to_searchable_ms"].get(q)) for p in looped]
        stats = [(x, y) for x, y in stats if y is not None]
        if stats:
            axes[1].plot(*zip(*stats), style, color="tab:blue", label=f"add -> searchable {q}")
    stacked = [p for p in points if "haystack" in p]
    for n, label in enumerate(sorted({k for p in stacked for k in p["haystack"]["strategies"]})):
        for b, style in ((10, "o-"), (25, "s--")):
            xy = [(p["stored_turns"], p["haystack"]["strategies"][label]["recall"][f"budget_{b}"]["all"]["mean"])
                  for p in stacked if label in p["haystack"]["strategies"]]
            axes[2].plot(*zip(*xy), style, color=f"C{n}", label=f"{label} B={b}")
    labels = ("search latency, client (ms)", "one turn: add -> searchable (ms)", "recall (LoCoMo gold turns)")
    for ax, ylabel in zip(axes, labels):
        ax.set_xscale("log")
        ax.set_xlabel("turns in the conversation")
        ax.set_ylabel(ylabel)
        if ax.has_data():
            ax.legend(fontsize=7)
    fig.suptitle(f"memstream bench grow ({report['config'].get('encoder', '')}, embedded)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
