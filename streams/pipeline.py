"""The write path assembled: the log, one runner per view, replay and status.

Built from a `Backends` object (infra/registry.py implements it), so this module never names a
backend. Each view's live generation comes from the catalog; a fresh data directory gets
generation 1. Only one process at a time may write a given view generation (a file lock), so
`memstream process` and `memstream serve` cannot both drive the same view.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol

from schemas import faults
from schemas.errors import ConfigurationError, FormatTooOld, MemstreamError, StoreError, TransientError
from schemas.ports.event_log import EventLog
from schemas.ports.views import ENCODED_VIEWS, VIEW_NAMES, Positions, ViewCatalog, ViewName
from schemas.units import HierarchyPolicy
from streams.control import ControlState
from streams.projections.base import Projection
from streams.projections.dense import DenseProjection
from streams.projections.graph import GraphProjection
from streams.projections.hierarchy import HierarchyProjection
from streams.projections.lexical import LexicalProjection
from streams.audit import AuditTrail, CompletionRecorder
from streams.eraser import EraserRunner
from streams.intake import IntakeRelay, intake_topic
from streams.retention import RetentionSweeper, ViewProbe
from streams.runner import NoMetrics, ProjectionRunner, RunnerMetrics
from streams.sealing import Opener

log = logging.getLogger(__name__)


class Backends(Protocol):
    def event_log(self) -> EventLog: ...

    def catalog(self) -> ViewCatalog: ...

    def open_view(self, view: ViewName, generation: int): ...

    def drop_view(self, view: ViewName, generation: int) -> None: ...

    def lock_path(self, view: ViewName, generation: int) -> Path: ...

    def shared_writers(self, view: ViewName) -> bool: ...

    def encoder(self, name: str | None = None): ...

    @property
    def encoder_name(self) -> str: ...

    def extractor(self): ...

    def keystore(self): ...


@dataclass(frozen=True)
class PipelineConfig:
    topic: str = "memstream.events"
    dlq_topic: str = "memstream.events.dlq"
    partitions: int = 8
    batch_size: int = 256
    idle_poll: float = 0.05
    policy: HierarchyPolicy = field(default_factory=HierarchyPolicy)
    speaker_prefix: bool = True
    speaker_as_entity: bool = True
    intake_retention_seconds: float = 3600.0
    retire_grace_seconds: float = 5.0  # a replaced generation is dropped this long after the switch
    retention_sweep_seconds: float = 3600.0  # how often tenants with a retention setting are checked (streams/retention.py)


class ViewBusy(MemstreamError):
    code = "view_busy"
    http_status = 409


class _WriterLock:
    """An exclusive, advisory file lock: one writer per view generation across processes."""

    def __init__(self, path: Path):
        self.path = path
        self._fd: int | None = None

    def acquire(self, view: str) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise ViewBusy(
                f"view {view!r} is already being processed by pid {holder}; stop it (or let it run: "
                "`memstream serve` processes in-process) before running this command"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


@dataclass
class ViewStatus:
    view: str
    backend: str
    generation: int
    positions: Positions
    end_offsets: Positions
    lag_events: int
    lag_seconds: float
    rebuilding: list[int]
    paused: bool = False
    partition_lag_seconds: dict[int, float] = field(default_factory=dict)
    unavailable: str | None = None  # why the view's store or catalog could not be read (its last known state is shown)


class _LiveView:
    def __init__(self, view: ViewName, generation: int, runner: ProjectionRunner, lock: _WriterLock):
        self.view = view
        self.generation = generation
        self.runner = runner
        self.lock = lock


class Pipeline:
    def __init__(self, backends: Backends, config: PipelineConfig, *, views: tuple[ViewName, ...] = VIEW_NAMES,
                 metrics: RunnerMetrics | None = None):
        unknown = set(views) - set(VIEW_NAMES)
        if unknown:
            raise ConfigurationError(f"unknown view(s) {sorted(unknown)}; known: {', '.join(VIEW_NAMES)}")
        self.backends = backends
        self.config = config
        self.views = views
        self.metrics = metrics or NoMetrics()
        self.log: EventLog = backends.event_log()
        self.catalog = backends.catalog()
        self.control = ControlState(self.log, config.topic)
        self.keystore = backends.keystore()
        self._live: dict[ViewName, _LiveView] = {}
        self._model_noted: set[tuple[ViewName, int]] = set()
        self.eraser: EraserRunner | None = None  # started with the views (start()); on Kafka, by the workers
        self.intake: IntakeRelay | None = None
        self.retention: RetentionSweeper | None = None  # beside the eraser
        self.model_load_seconds = 0.0
        self._last_status: dict[str, tuple[int, str, Positions]] = {}  # view -> last known (generation, backend, positions)

    # -- lifecycle -----------------------------------------------------------------------
    async def start_log(self) -> None:
        await asyncio.to_thread(self.keystore.start)
        await self.log.start()
        await self.log.ensure_topic(self.config.topic, self.config.partitions)
        await self.log.ensure_topic(self.config.dlq_topic, self.config.partitions)
        await self.control.ensure_topic()
        await self.log.ensure_topic(intake_topic(self.config.topic), self.config.partitions,
                                    retention_seconds=self.config.intake_retention_seconds)

    async def start(self) -> None:
        """Open the log and every view's live generation, taking the writer locks."""
        await self.start_log()
        t0 = time.perf_counter()
        if "dense" in self.views or "graph" in self.views:
            await asyncio.to_thread(self.backends.encoder().start)
        if "graph" in self.views:
            await asyncio.to_thread(self.backends.extractor().start)
        self.model_load_seconds = time.perf_counter() - t0
        for view in self.views:
            generation = self.catalog.current(view)
            if generation is None:
                generation = self.catalog.new_generation(view, self.model_for(view))
                self.catalog.activate(view, generation)
            try:
                self._live[view] = self._open_live(view, generation)
            except FormatTooOld as exc:
                self._live[view] = self._rebuild_unreadable(view, generation, exc)
        if "hierarchy" in self.views:
            # One eraser and one intake relay per deployment are enough (both are idempotent, so
            # more are harmless): they run beside the hierarchy view — in `serve`/`process`, and in
            # the worker that runs it.
            # The eraser records each completion on the control topic (the audit trail); the
            # retention sweeper asks it to forget what a tenant's retention no longer keeps.
            self.eraser = self.new_eraser(on_erased=CompletionRecorder(self.log, self.config.topic))
            self.intake = IntakeRelay(self.log, self.config.topic, self.config.dlq_topic, self.publisher(),
                                      batch_size=self.config.batch_size)
            self.retention = RetentionSweeper(AuditTrail(self.log, self.config.topic), self.publisher(), ViewProbe(self.backends),
                                              interval=self.config.retention_sweep_seconds)

    def new_eraser(self, on_erased=None) -> EraserRunner:
        return EraserRunner(self.log, self.config.topic, self.keystore, batch_size=self.config.batch_size, on_erased=on_erased)

    def publisher(self):
        """A publisher that seals what it appends with this pipeline's data keys."""
        from streams.ingest import Publisher

        return Publisher(self.log, self.config.topic, keystore=self.keystore)

    def _open_live(self, view: ViewName, generation: int) -> _LiveView:
        lock = _WriterLock(self.backends.lock_path(view, generation))
        if not self.backends.shared_writers(view):  # else the consumer group splits partitions between writers
            lock.acquire(view)
        try:
            store = self.backends.open_view(view, generation)
        except BaseException:
            lock.release()
            raise
        return _LiveView(view, generation, self._runner(view, store, f"memstream.{view}", self.generation_model(view, generation)), lock)

    def model_for(self, view: ViewName) -> str | None:
        """The encoder a new generation of `view` is built with: the configured one for the views
        that hold vectors, none for the others."""
        return self.backends.encoder_name if view in ENCODED_VIEWS else None

    def generation_model(self, view: ViewName, generation: int) -> str | None:
        """The encoder `generation` keeps projecting with: the one it was built with (a generation
        from before models were recorded: the configured one). A configuration that names another
        takes effect through a replay, which builds a new generation with it (the old serves until
        the switch)."""
        if view not in ENCODED_VIEWS:
            return None
        model = self.catalog.model(view, generation) or self.backends.encoder_name
        if model != self.backends.encoder_name and (view, generation) not in self._model_noted:
            self._model_noted.add((view, generation))
            print(f"memstream: the {view} view's generation {generation} was built with encoder {model}; the configuration names "
                  f"{self.backends.encoder_name}: it keeps {model} until `memstream replay --projection {view}` builds a generation with "
                  f"{self.backends.encoder_name}", file=sys.stderr, flush=True)
        return model

    def _rebuild_unreadable(self, view: ViewName, generation: int, why: FormatTooOld) -> _LiveView:
        """A live generation in a format this release no longer reads (infra/formats.py) is derived
        data: a new generation replaces it at once and is built from the log as the view catches up
        (queries fall back meanwhile, as for a view that is down)."""
        new = self.catalog.new_generation(view, self.model_for(view))
        log.warning("the %s view's generation %d is in a format this release no longer reads; rebuilding it from the log into "
                    "generation %d (%s)", view, generation, new, why)
        live = self._open_live(view, new)
        self.catalog.activate(view, new)
        self.backends.drop_view(view, generation)
        return live

    def projection(self, view: ViewName, store, model: str | None = None) -> Projection:
        c = self.config
        encoder = self.backends.encoder(model) if view in ENCODED_VIEWS else None
        if view == "hierarchy":
            p: Projection = HierarchyProjection(store, c.policy)
        elif view == "lexical":
            p = LexicalProjection(store, c.policy, c.speaker_prefix)
        elif view == "dense":
            p = DenseProjection(store, encoder, c.policy, c.speaker_prefix)
        elif view == "graph":
            p = GraphProjection(store, self.backends.extractor(), encoder, c.speaker_as_entity)
        else:
            raise ConfigurationError(f"unknown view {view!r}")
        p.opener = Opener(self.keystore)
        return p

    def _runner(self, view: ViewName, store, group: str, model: str | None = None) -> ProjectionRunner:
        return ProjectionRunner(
            log_=self.log, topic=self.config.topic, dlq_topic=self.config.dlq_topic, projection=self.projection(view, store, model),
            group=group, batch_size=self.config.batch_size, metrics=self.metrics,
        )

    async def close(self) -> None:
        for live in self._live.values():
            await asyncio.to_thread(live.runner.store.close)
            live.lock.release()
        self._live.clear()
        await self.log.close()

    def store(self, view: ViewName):
        return self._live[view].runner.store

    # -- processing ----------------------------------------------------------------------
    async def _follow_catalog(self, live: _LiveView) -> _LiveView:
        """Switch to a generation another process (or `replay`) activated. A catalog that cannot be
        read right now (its server is down) leaves the view on its generation: its runner then meets
        the outage itself and reports it."""
        try:
            current = await asyncio.to_thread(self.catalog.current, live.view)
        except (TransientError, StoreError) as exc:
            log.debug("view=%s catalog unavailable, staying on generation %d: %s", live.view, live.generation, exc)
            return live
        if current is None or current == live.generation:
            return live
        log.info("view=%s switching generation %d -> %d", live.view, live.generation, current)
        await asyncio.to_thread(live.runner.store.close)
        live.lock.release()
        new = self._open_live(live.view, current)
        self._live[live.view] = new
        return new

    async def live_runner(self, view: ViewName) -> ProjectionRunner:
        """The runner of the view's active generation (following a switch another process or
        `replay` made), for a driver that feeds it batches itself (the Faust worker)."""
        return (await self._follow_catalog(self._live[view])).runner

    async def step(self, view: ViewName) -> int:
        return (await (await self.live_runner(view)).step()).records

    async def process_until_caught_up(self, on_progress: Callable[[str, Positions], None] | None = None,
                                      target: Positions | None = None) -> Positions:
        """Run every view until it has processed everything appended before this call. A paused
        view is left where it is (see `paused_views()`)."""
        target = target if target is not None else await self.log.end_offsets(self.config.topic)
        await self.control.refresh(force=True)

        async def drive(view: ViewName) -> None:
            while not self.control.paused(view):
                live = await self._follow_catalog(self._live[view])
                if await live.runner.caught_up(target):
                    return
                result = await live.runner.step()
                if on_progress is not None:
                    on_progress(view, await live.runner.positions())
                if result.records == 0:
                    await asyncio.sleep(self.config.idle_poll)

        async def erase() -> None:
            if self.intake is not None:
                while await self.intake.step():
                    pass
            if self.eraser is not None:
                await self.eraser.run_until(target)

        await asyncio.gather(*(drive(v) for v in self.views), erase())
        return target

    async def run(self, stop: asyncio.Event) -> None:
        """Follow the log until `stop` is set (the views, and the eraser beside them)."""

        async def follow(view: ViewName) -> None:
            while not stop.is_set():
                try:
                    await self.control.refresh()
                    n = 0 if self.control.paused(view) else await self.step(view)
                except Exception:  # noqa: BLE001 - the runner isolates bad records; this guards the loop itself
                    log.exception("view=%s step failed; retrying", view)
                    n = 0
                    await asyncio.sleep(1.0)
                if n == 0:
                    await self._live[view].runner.erase_if_due()  # deferred erasure (streams/runner.py)
                    try:
                        await asyncio.wait_for(stop.wait(), timeout=self.config.idle_poll)
                    except asyncio.TimeoutError:
                        pass

        eraser = [self.eraser.run(stop, self.config.idle_poll), self.intake.run(stop, self.config.idle_poll)] if self.eraser is not None else []
        if self.retention is not None:
            eraser.append(self.retention.run(stop))
        await asyncio.gather(*(follow(v) for v in self.views), *eraser)

    async def wait_for(self, target: Positions, timeout: float) -> bool:
        """Read-your-writes: wait until every view (and the eraser: a forget is complete only
        when its keys are destroyed) has processed up to `target`."""
        deadline = time.monotonic() + timeout
        while True:
            done = True
            runners = [live.runner for live in self._live.values()] + ([self.eraser] if self.eraser is not None else [])
            for runner in runners:
                if not await runner.caught_up(target):
                    done = False
                    break
            if done:
                return True
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.02)

    async def erase_deferred(self) -> dict[str, float]:
        """Run every view's deferred erasure that is due now (streams/runner.py); returns the
        views whose erasure still waits, with the seconds until it may proceed."""
        out = {}
        for view, live in self._live.items():
            pending = await live.runner.erase_if_due()
            if pending is not None:
                out[view] = pending
        return out

    async def paused_views(self) -> list[str]:
        await self.control.refresh(force=True)
        return [v for v in self.views if self.control.paused(v)]

    # -- replay --------------------------------------------------------------------------
    async def replay(self, view: ViewName, on_progress: Callable[[str, Positions], None] | None = None) -> int:
        """Rebuild `view` from offset 0 into a fresh generation, then switch readers to it.

        The live generation keeps serving queries (and keeps processing, if a runner follows
        it) during the rebuild. The switch is one catalog transaction; the live runner moves to
        the new generation at its next step, readers within their catalog refresh (0.2 s). After
        `retire_grace_seconds` — time for those to move and for queries already running on the
        old generation to end — the replaced generation is dropped: its storage reclaimed, and
        whatever a forget had left in it (nothing, once the forget was processed) gone with it."""
        for old in self.catalog.retired(view):
            self.backends.drop_view(view, old)
        self._drop_abandoned_builds(view)
        generation = self.catalog.new_generation(view, self.model_for(view))  # built with the configured encoder
        lock = _WriterLock(self.backends.lock_path(view, generation))
        lock.acquire(view)
        store = self.backends.open_view(view, generation)
        runner = self._runner(view, store, f"memstream.{view}.rebuild", self.model_for(view))
        try:
            while True:
                target = await self.log.end_offsets(self.config.topic)
                await runner.run_until(target, on_progress, idle_poll=self.config.idle_poll)
                # New records may have arrived meanwhile; finish them before switching.
                if await runner.caught_up(await self.log.end_offsets(self.config.topic)):
                    break
        finally:
            await asyncio.to_thread(store.close)
            lock.release()
        faults.hit("replay-built")  # crash tests (schemas/faults.py): built, not switched
        self.catalog.activate(view, generation)
        faults.hit("replay-switched")  # switched, the old generation not dropped yet
        if view in self._live:
            await self._follow_catalog(self._live[view])
        await asyncio.sleep(self.config.retire_grace_seconds)
        for old in self.catalog.retired(view):
            self.backends.drop_view(view, old)
        return generation

    def _drop_abandoned_builds(self, view: ViewName) -> None:
        """A generation still `building` whose writer lock nobody holds was left by a replay that
        died (a crash, a kill): nobody will finish it, so its storage is reclaimed. Only where the
        lock can tell (one machine); a distributed deployment's operator drops one by hand."""
        if not self.backends.single_machine():
            return
        for generation in self.catalog.building(view):
            lock = _WriterLock(self.backends.lock_path(view, generation))
            try:
                lock.acquire(view)
            except ViewBusy:
                continue  # another replay is building it right now
            try:
                log.warning("view=%s dropping generation %d, left half-built by a replay that did not finish", view, generation)
                self.backends.drop_view(view, generation)
            finally:
                lock.release()

    # -- status --------------------------------------------------------------------------
    async def status(self) -> list[ViewStatus]:
        """Each view's positions and lag. A view whose store or catalog cannot be read right now (its
        server is down) is reported with its last known state and the reason, never as an error of
        the whole status: the other views' health must stay visible."""
        end = await self.log.end_offsets(self.config.topic)
        await self.control.refresh(force=True)
        oldest: dict[tuple[int, int], float] = {}  # (partition, offset) -> append time, shared by the views
        out = []
        for view in self.views:
            try:
                out.append(await self._view_status(view, end, oldest))
            except (TransientError, StoreError) as exc:
                generation, backend, positions = self._last_status.get(view, (0, "-", {}))
                lag = sum(max(0, off - positions.get(p, 0)) for p, off in end.items())
                lags = await self._fill_oldest(end, positions, oldest)
                out.append(ViewStatus(view, backend, generation, positions, end, lag, max(lags.values(), default=0.0), [],
                                      self.control.paused(view), lags, unavailable=str(exc).splitlines()[0][:300]))
        return out

    async def _view_status(self, view: ViewName, end: Positions, oldest: dict) -> ViewStatus:
        live = self._live.get(view)
        if live is not None:
            store, generation = live.runner.store, live.generation
            positions = await live.runner.positions()
        else:
            generation = self.catalog.current(view)
            if generation is None:
                lags = await self._fill_oldest(end, {}, oldest)
                return ViewStatus(view, "-", 0, {}, end, sum(end.values()), max(lags.values(), default=0.0),
                                  self.catalog.building(view), self.control.paused(view), lags)
            store = self.backends.open_view(view, generation)
            try:
                positions = await asyncio.to_thread(store.positions)
            finally:
                await asyncio.to_thread(store.close)
        self._last_status[view] = (generation, store.backend, positions)
        lag = sum(max(0, off - positions.get(p, 0)) for p, off in end.items())
        lags = await self._fill_oldest(end, positions, oldest)
        return ViewStatus(view, store.backend, generation, positions, end, lag, max(lags.values(), default=0.0),
                          self.catalog.building(view), self.control.paused(view), lags)

    async def _fill_oldest(self, end: Positions, positions: Positions, cache: dict[tuple[int, int], float]) -> dict[int, float]:
        """Per partition, the age of the oldest record the view has not processed yet (0 when
        caught up): lag in seconds is measured from the log's append time, never occurred_at.
        One clock reading for the whole status call, so views compare exactly."""
        now = cache.setdefault((-1, -1), time.time())
        out: dict[int, float] = {}
        for p, off in end.items():
            pos = positions.get(p, 0)
            if pos >= off:
                out[p] = 0.0
                continue
            if (p, pos) not in cache:
                rec = await self.log.read(self.config.topic, p, pos, max_records=1)
                cache[(p, pos)] = rec[0].append_time if rec else now
            out[p] = round(max(0.0, now - cache[(p, pos)]), 3)
        return out
