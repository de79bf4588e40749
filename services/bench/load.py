"""`memstream bench load`: reads while writes pour in, measured in one run.

A benchmark, not a test: bounded (it stops by itself after its phases), loopback only (it refuses
any other address: it is not a load generator for someone else's server). It talks to a running
`memstream serve` over HTTP like any client, so the same run measures the embedded mode (it can
start its own `serve` on a scratch directory) and the distributed one (point `--url` at a serve
whose workers run beside it).

Phases, one run: `idle` — M searchers alone; `load` — N publishers at a fixed offered rate plus
the same M searchers; `idle_after` — once the views have caught up, the searchers alone again, on
all the data the run wrote. Reported: events/s offered and held (acknowledged), event -> searchable
freshness (POST /v1/wait on each batch's positions, from its acknowledgement), search p50/p99 per
phase, errors (anything but 200 and 429; 429 backpressure and publishes re-sent after a dropped
connection are counted apart), and the RSS, open file descriptors and CPU use of the given
processes over time, with the RSS and descriptor slopes over the last half of the run.

Each publisher is an agent writing its own conversations (a new one every `conversation_turns`).
With `scope="conversation"` (the default: an agent searches its own memory) every other search
asks about a conversation being written right now and the rest about a random finished one (so a
search covers at most `conversation_turns` turns in every phase, but the finished conversations
multiply during the run and stop fitting the query caches); `scope="tenant"` searches the whole tenant,
which grows during the run (its latency then grows with the data as well as with the load).
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import random
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from urllib.parse import urlparse

import httpx
import numpy as np

from schemas.errors import BadRequest
from services.bench.procfs import cpu_seconds, rss_mb

QUESTIONS = ["Who planned the ferry to Lisbon?", "What was the weather on day 40?", "Which market did Mira visit in Kyoto?",
             "When did Grace talk about the concert?", "What did Linus say about Nairobi?"]
NAMES = ["Ada", "Bo", "Grace", "Linus", "Mira", "Tomás"]
PLACES = ["Lisbon", "Akureyri", "Porto Alegre", "Kyoto", "Nairobi"]
MAX_IN_FLIGHT = 64  # publishes of one publisher awaiting their answer
WARMUP_SEARCHES = 10  # per searcher, before the idle phase and not counted: a server's first answers pay its warm-up


@dataclass
class LoadConfig:
    url: str
    key: str
    publishers: int = 4
    rate: float = 20.0          # events/s offered per publisher
    batch: int = 10
    searchers: int = 2
    idle: float = 30.0
    duration: float = 300.0
    strategy: str = "zero-mem"
    scope: str = "conversation"  # what a search covers: "conversation" (an agent's own) or "tenant" (all of it)
    conversation_turns: int = 500  # a publisher starts a new conversation after this many turns
    pids: dict[str, int] = field(default_factory=dict)  # name -> pid, for RSS and open files
    seed: int = 7


def check_loopback(url: str) -> None:
    host = urlparse(url).hostname or ""
    try:
        loop = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loop = False
    if not loop:
        raise BadRequest(f"memstream bench runs against a loopback address only, not {host!r}")


def _quantiles(values: list[float]) -> dict:
    if not values:
        return {"n": 0, "p50_ms": None, "p99_ms": None}
    a = np.asarray(values)
    return {"n": len(values), "p50_ms": round(float(np.percentile(a, 50)), 2), "p99_ms": round(float(np.percentile(a, 99)), 2)}


def _slope_per_minute(series: list[tuple[float, float]]) -> float | None:
    """Least-squares slope over the last half of the run, per minute."""
    half = series[len(series) // 2:]
    if len(half) < 3:
        return None
    t = np.array([s[0] for s in half]) / 60.0
    y = np.array([s[1] for s in half])
    return float(np.polyfit(t - t[0], y, 1)[0])


def _proc_sample(pid: int) -> tuple[float, int, float] | None:
    """(RSS MB, open files, CPU seconds so far) of a process."""
    try:
        return rss_mb(pid), len(os.listdir(f"/proc/{pid}/fd")), cpu_seconds(pid)
    except (OSError, KeyError, IndexError, ValueError):
        return None


def _cpu_share(samples: list[tuple], since: float, until: float = float("inf")) -> float | None:
    """Mean CPU use (1.0 = one core) between two moments of the run."""
    window = [x for x in samples if since <= x[0] <= until]
    if len(window) < 2 or window[-1][0] <= window[0][0]:
        return None
    return (window[-1][3] - window[0][3]) / (window[-1][0] - window[0][0])


class LoadRun:
    def __init__(self, cfg: LoadConfig, progress=print):
        check_loopback(cfg.url)
        self.cfg = cfg
        self.progress = progress
        self.rng = random.Random(cfg.seed)
        self.t0 = 0.0
        self.phase = "idle"
        self.search_ms: dict[str, list[float]] = {"idle": [], "load": [], "idle_after": []}
        self.search_by_target: dict[str, list[float]] = {"being_written": [], "finished": []}  # under load
        self.search_trace: list[tuple[float, float, str]] = []  # (t, ms, phase)
        # The server's own account of each search (its timings_ms): what the client saw minus this is
        # queueing, transport and the client's own loop.
        self.server_ms: dict[str, list[float]] = {"idle": [], "load": [], "idle_after": []}
        self.stage_ms: dict[str, dict[str, list[float]]] = {"idle": {}, "load": {}, "idle_after": {}}
        self.offered = 0
        self.acknowledged = 0
        self.throttled = 0
        self.resent = 0
        self.saturated = 0
        self.errors: list[str] = []
        self.freshness: list[tuple[float, float]] = []  # (t, seconds)
        self.procs: dict[str, list[tuple[float, float, int, float]]] = {name: [] for name in cfg.pids}  # (t, rss MB, fds, cpu s)
        self._seq: dict[str, int] = {}  # conversation -> turns written
        self._writing: dict[int, str] = {}  # publisher -> the conversation it writes now
        self._finished: list[str] = []
        self._searches = 0
        self._waits: set[asyncio.Task] = set()

    # -- the run ----------------------------------------------------------------------------
    async def run(self) -> dict:
        cfg = self.cfg
        headers = {"Authorization": f"Bearer {cfg.key}"}
        # Searches and publishes get connections of their own: the freshness waits are long polls
        # (one per acknowledged batch, each held until the views have the batch), and sharing one
        # bounded pool made searches queue client-side behind them whenever freshness passed
        # (pool size / batches per second) seconds - latency the server never saw.
        limits = httpx.Limits(max_connections=cfg.publishers + cfg.searchers + 4)
        async with httpx.AsyncClient(base_url=cfg.url, headers=headers, timeout=120, limits=limits) as http, \
                httpx.AsyncClient(base_url=cfg.url, headers=headers, timeout=330,
                                  limits=httpx.Limits(max_connections=None, max_keepalive_connections=64)) as waits:
            self.http, self.waits = http, waits
            await self._seed_memory()
            await self._warm_up()
            self.t0 = time.monotonic()
            stop = asyncio.Event()
            sampler = asyncio.create_task(self._sample_procs(stop))
            searchers = [asyncio.create_task(self._search(stop)) for _ in range(cfg.searchers)]
            self.progress(f"bench load: idle phase, {cfg.searchers} searchers for {cfg.idle:.0f}s")
            await asyncio.sleep(cfg.idle)
            self.phase = "load"
            self.load_started = time.monotonic() - self.t0
            self.progress(f"bench load: load phase, {cfg.publishers} publishers x {cfg.rate:g} events/s + {cfg.searchers} searchers "
                          f"for {cfg.duration:.0f}s")
            publishing = asyncio.Event()
            publishers = [asyncio.create_task(self._publish(i, publishing)) for i in range(cfg.publishers)]
            ticker = asyncio.create_task(self._tick(publishing))
            await asyncio.sleep(cfg.duration)
            publishing.set()
            self.load_ended = time.monotonic() - self.t0
            await asyncio.gather(*publishers, ticker)
            if self._waits:
                await asyncio.wait(self._waits, timeout=300)
            # The same searches once the views have caught up, on all the data the run wrote: what
            # the data's growth alone costs, apart from the writes.
            self.phase = "idle_after"
            self.progress(f"bench load: idle again (the views caught up), {cfg.searchers} searchers for {cfg.idle:.0f}s")
            await asyncio.sleep(cfg.idle)
            stop.set()
            await asyncio.gather(*searchers, sampler)
        return self.report()

    async def _seed_memory(self) -> None:
        """Something to search from the first idle query on: two whole conversations, waited for."""
        for k in range(2):
            conv = f"seed-{k}"
            for start in range(0, self.cfg.conversation_turns, 100):
                n = min(100, self.cfg.conversation_turns - start)
                r = await self.http.post("/v1/events", json=[self._turn(conv) for _ in range(n)])
                r.raise_for_status()
                w = await self.http.post("/v1/wait", json={"positions": r.json()["positions"], "timeout_seconds": 300})
                w.raise_for_status()
            self._finished.append(conv)

    async def _warm_up(self) -> None:
        async def one_searcher():
            for _ in range(WARMUP_SEARCHES):
                body = {"tenant_id": "bench", "question": self.rng.choice(QUESTIONS), "strategy": self.cfg.strategy, "max_turns": 10}
                if self.cfg.scope == "conversation":
                    body["conversation_id"] = self.rng.choice(self._finished)
                (await self.http.post("/v1/search", json=body)).raise_for_status()

        await asyncio.gather(*(one_searcher() for _ in range(self.cfg.searchers)))

    def _conversation(self, publisher: int) -> str:
        conv = self._writing.get(publisher)
        if conv is None or self._seq.get(conv, 0) >= self.cfg.conversation_turns:
            if conv is not None:
                self._finished.append(conv)
            conv = self._writing[publisher] = f"p{publisher}-{len([c for c in self._seq if c.startswith(f'p{publisher}-')])}"
        return conv

    def _turn(self, conv: str) -> dict:
        i = self._seq.get(conv, 0)
        self._seq[conv] = i + 1
        who = NAMES[i % len(NAMES)]
        t = datetime(2026, 1, 1, tzinfo=timezone.utc) + timedelta(minutes=i)
        return {"type": "TurnRecorded", "event_id": f"bench-{self.cfg.seed}-{conv}-{i}", "tenant_id": "bench", "conversation_id": conv,
                "session_id": f"s{i // 50}", "agent_id": f"agent-{i % 3}", "turn_index": i % 50, "speaker": who,
                "text": f"{who} talked about {self.rng.choice(PLACES)} and {self.rng.choice(NAMES)}'s plan for the "
                        f"{self.rng.choice(['ferry', 'hike', 'concert', 'market'])} on day {i % 90}.",
                "occurred_at": t.isoformat()}

    async def _publish(self, n: int, stop: asyncio.Event) -> None:
        """Open loop: a batch every `batch / rate` seconds whatever the answers take (each publish
        is its own task), so a slow server does not lower the offered rate — up to
        MAX_IN_FLIGHT publishes of this publisher at once; a batch due past that is counted as
        not offered (`client_saturated_events`), not silently dropped."""
        interval = self.cfg.batch / self.cfg.rate
        next_at = time.monotonic() + self.rng.uniform(0, interval)
        in_flight: set[asyncio.Task] = set()
        while not stop.is_set():
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            next_at += interval
            if len(in_flight) >= MAX_IN_FLIGHT:
                self.saturated += self.cfg.batch
                continue
            conv = self._conversation(n)
            batch = [self._turn(conv) for _ in range(self.cfg.batch)]
            self.offered += len(batch)
            task = asyncio.create_task(self._publish_one(batch))
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)
        if in_flight:
            await asyncio.wait(in_flight)

    async def _publish_one(self, batch: list[dict]) -> None:
        try:
            r = await self._post_events(batch)
        except httpx.HTTPError as exc:
            self.errors.append(f"publish: {exc!r}")
            return
        if r.status_code == 429:
            self.throttled += len(batch)
        elif r.status_code != 200:
            self.errors.append(f"publish {r.status_code}: {r.text[:200]}")
        else:
            self.acknowledged += len(batch)
            acked = time.monotonic()
            task = asyncio.create_task(self._freshness(r.json()["positions"], acked))
            self._waits.add(task)
            task.add_done_callback(self._waits.discard)

    async def _post_events(self, batch: list[dict]) -> httpx.Response:
        """A connection the server closed as it was reused (keep-alive expiry racing the request)
        fails before any answer: sent again, as a client does — the same event ids, so a batch
        that did reach the log is not stored twice. Counted apart from errors."""
        for attempt in range(3):
            try:
                return await self.http.post("/v1/events", json=batch)
            except (httpx.ReadError, httpx.RemoteProtocolError, httpx.ConnectError):
                if attempt == 2:
                    raise
                self.resent += 1
        raise AssertionError("unreachable")

    async def _freshness(self, positions: dict, acked: float) -> None:
        try:
            r = await self.waits.post("/v1/wait", json={"positions": positions, "timeout_seconds": 300})
        except httpx.HTTPError as exc:
            self.errors.append(f"wait: {exc!r}")
            return
        if r.status_code == 200:
            self.freshness.append((acked - self.t0, time.monotonic() - acked))
        else:
            self.errors.append(f"wait {r.status_code}: {r.text[:200]}")

    async def _search(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            t = time.monotonic()
            body = {"tenant_id": "bench", "question": self.rng.choice(QUESTIONS), "strategy": self.cfg.strategy, "max_turns": 10}
            target = None
            if self.cfg.scope == "conversation":
                body["conversation_id"], target = self._search_target()
            try:
                r = await self.http.post("/v1/search", json=body)
            except httpx.HTTPError as exc:
                self.errors.append(f"search: {exc!r}")
                continue
            ms = (time.monotonic() - t) * 1000
            if r.status_code != 200:
                self.errors.append(f"search {r.status_code}: {r.text[:200]}")
                continue
            self.search_ms[self.phase].append(ms)
            timings = r.json().get("timings_ms") or {}
            if "total" in timings:
                self.server_ms[self.phase].append(float(timings["total"]))
            for stage, v in timings.items():
                if stage != "total":
                    self.stage_ms[self.phase].setdefault(stage, []).append(float(v))
            if target and self.phase == "load":
                self.search_by_target[target].append(ms)
            self.search_trace.append((t - self.t0, ms, self.phase))

    def _search_target(self) -> tuple[str, str]:
        self._searches += 1
        writing = list(self._writing.values())
        if writing and self._searches % 2:
            return self.rng.choice(writing), "being_written"
        return self.rng.choice(self._finished), "finished"

    async def _sample_procs(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            now = time.monotonic() - self.t0
            for name, pid in self.cfg.pids.items():
                s = _proc_sample(pid)
                if s is not None:
                    self.procs[name].append((now, *s))
            try:
                await asyncio.wait_for(stop.wait(), 1.0)
            except asyncio.TimeoutError:
                pass

    async def _tick(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), 30.0)
            except asyncio.TimeoutError:
                elapsed = time.monotonic() - self.t0 - self.load_started
                self.progress(f"bench load: {elapsed:.0f}/{self.cfg.duration:.0f}s, {self.acknowledged} events held, "
                              f"search p50 {_quantiles(self.search_ms['load'])['p50_ms']} ms, {len(self.errors)} errors")

    # -- the report -------------------------------------------------------------------------
    def report(self) -> dict:
        cfg = self.cfg
        idle, load, after = (_quantiles(self.search_ms[p]) for p in ("idle", "load", "idle_after"))
        fresh = [s for _, s in self.freshness]
        out = {
            "config": {k: v for k, v in cfg.__dict__.items() if k != "key"},
            "offered_events_per_s": round(self.offered / cfg.duration, 2),
            "held_events_per_s": round(self.acknowledged / cfg.duration, 2),
            "throttled_events": self.throttled,
            "resent_publishes": self.resent,
            "client_saturated_events": self.saturated,
            "freshness": {"n": len(fresh), "p50_s": round(float(np.percentile(fresh, 50)), 3) if fresh else None,
                          "p99_s": round(float(np.percentile(fresh, 99)), 3) if fresh else None},
            "search": {"idle": idle, "load": load, "idle_after": after,
                       "load_by_conversation": {k: _quantiles(v) for k, v in self.search_by_target.items() if v},
                       "p99_ratio": _ratio(load["p99_ms"], idle["p99_ms"]), "p99_ratio_to_idle_after": _ratio(load["p99_ms"], after["p99_ms"]),
                       "server_side": {p: {**_quantiles(v), "stages_p99_ms": {k: _quantiles(x)["p99_ms"] for k, x in sorted(self.stage_ms[p].items())}}
                                       for p, v in self.server_ms.items()}},
            "errors": len(self.errors), "error_samples": self.errors[:10],
            "processes": {name: {"rss_mb_first": round(s[0][1], 1) if s else None, "rss_mb_last": round(s[-1][1], 1) if s else None,
                                 "rss_mb_per_min_last_half": _round(_slope_per_minute([(x[0], x[1]) for x in s])),
                                 "fds_first": s[0][2] if s else None, "fds_last": s[-1][2] if s else None,
                                 "fds_per_min_last_half": _round(_slope_per_minute([(x[0], float(x[2])) for x in s])),
                                 "cpu_cores_idle": _round(_cpu_share(s, 0.0, self.load_started)),
                                 "cpu_cores_load": _round(_cpu_share(s, self.load_started, self.load_ended))}
                          for name, s in self.procs.items()},
        }
        return out

    def plot(self, path: Path, title: str) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(3, 1, figsize=(9, 9), sharex=True)
        for phase, colour in (("idle", "tab:green"), ("load", "tab:red"), ("idle_after", "tab:olive")):
            pts = [(t, ms) for t, ms, p in self.search_trace if p == phase]
            if pts:
                axes[0].scatter(*zip(*pts), s=4, c=colour, label=f"search ({phase})")
        axes[0].set_ylabel("search latency (ms)")
        axes[0].set_yscale("log")
        axes[0].legend(loc="upper left")
        if self.freshness:
            axes[1].scatter(*zip(*self.freshness), s=4, c="tab:blue")
        axes[1].set_ylabel("event -> searchable (s)")
        for name, s in self.procs.items():
            if s:
                axes[2].plot([x[0] for x in s], [x[1] for x in s], label=f"{name} RSS (MB)")
                axes[2].plot([x[0] for x in s], [x[2] for x in s], "--", label=f"{name} open files")
        axes[2].set_ylabel("RSS MB / open files")
        axes[2].set_xlabel("seconds since start")
        axes[2].legend(loc="upper left")
        fig.suptitle(title)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a and b else None


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


