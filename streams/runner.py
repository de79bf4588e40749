"""The loop that drives one projection over the log: a thin shell around the plain logic.

One step:
1. read up to `batch_size` records per partition from the view's own positions;
2. `projection.handle(records)` computes change sets (model work runs in a worker thread);
3. for each resulting step: append its dead letters to the dead-letter topic, then
   `store.apply(change, positions)` — the view and its positions in one write;
4. commit the positions to the consumer group (for lag tools; the store's copy is the one the
   runner resumes from).

Write the view, then the positions, then the group: that order is the delivery guarantee
(at-least-once delivery, made effectively-once by deterministic ids and upserts).

Deferred erasure: a store that cannot erase a forget's bytes at once (OpenSearch: deleted
documents stay in segments until a merge its retention leases allow) keeps what is pending
durably and says when it is due (`erase_pending`, schemas/ports/views.py); the loops that follow
the log call `erase_if_due()` when idle, which asks the store only when its last answer said
something could be due by now, or after a change set that forgot or deleted turns.

A processor never dies on one bad record: if handling a batch raises, the batch is bisected
until the failing record is isolated, and that record is dead-lettered with the exception as
its reason. TransientError (a store or broker briefly unavailable) is retried with back-off
instead.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Callable, Collection, Protocol, Sequence

from schemas import faults
from schemas.errors import TransientError
from schemas.ports.event_log import EventLog, LogRecord
from schemas.ports.views import Positions
from streams.dlq import dead_letter_records
from streams.projections.base import DeadLetter, Projection, Step, advance

log = logging.getLogger(__name__)


class RunnerMetrics(Protocol):
    """Hooks for observability; the no-op default keeps the runner free of any metrics library."""

    def batch_done(self, view: str, records: int, dead_letters: int, seconds: float, append_times: list[float]) -> None: ...

    def batch_failed(self, view: str, error: BaseException) -> None: ...


class NoMetrics:
    def batch_done(self, view: str, records: int, dead_letters: int, seconds: float, append_times: list[float]) -> None:
        pass

    def batch_failed(self, view: str, error: BaseException) -> None:
        pass


@dataclass
class StepResult:
    records: int
    dead_letters: int


class ProjectionRunner:
    def __init__(
        self,
        *,
        log_: EventLog,
        topic: str,
        dlq_topic: str,
        projection: Projection,
        group: str,
        batch_size: int = 256,
        metrics: RunnerMetrics | None = None,
        max_backoff: float = 30.0,
    ):
        self.log = log_
        self.topic = topic
        self.dlq_topic = dlq_topic
        self.projection = projection
        self.group = group
        self.batch_size = batch_size
        self.metrics = metrics or NoMetrics()
        self.max_backoff = max_backoff
        self._positions: Positions | None = None
        self._lock = asyncio.Lock()  # one batch at a time per view, whoever delivers it
        self.commit_group = True  # False when another consumer (a faust app) owns the group
        self._retry_at, self._outage_backoff = 0.0, 0.5  # try_process/try_step: when the store may be tried again
        self._erase_at: float | None = 0.0  # monotonic time to ask the store about deferred erasure; None: nothing pending

    @property
    def view(self) -> str:
        return self.projection.name

    @property
    def store(self):
        return self.projection.store

    async def positions(self) -> Positions:
        if self._positions is None:
            self._positions = await asyncio.to_thread(self.store.positions)
        return dict(self._positions)

    async def step(self, *, patient: bool = True, partitions: Collection[int] | None = None) -> StepResult:
        """Pull the next batch from the log (embedded runner), process it, commit the group.
        `patient=False`: see `try_step`. `partitions`: read only these (the ones a group member
        owns); their positions are re-read from the store, since another member may have
        advanced them while they were assigned elsewhere."""
        async with self._lock:
            if partitions is not None:
                self._positions = None
            positions = await self.positions()
        end = await self.log.end_offsets(self.topic)
        records: list[LogRecord] = []
        for p in sorted(end if partitions is None else set(end) & set(partitions)):
            start = positions.get(p, 0)
            if start < end[p]:
                records.extend(await self.log.read(self.topic, p, start, max_records=self.batch_size))
        async with self._lock:
            result = await self._process_new(records, patient)
        if result.records:
            faults.hit("position-written")  # crash tests (schemas/faults.py): view and positions written, the group not committed
        if result.records and self.commit_group:
            await self.log.commit(self.group, self.topic, self._positions or {})
        return result

    async def process(self, records: Sequence[LogRecord], *, patient: bool = True) -> StepResult:
        """Process records delivered by any consumer (the embedded loop, a faust agent…).

        The view's own positions decide: records below them were already applied (a redelivery
        after a rebalance or crash) and are dropped; a gap before the first delivered record of
        a partition (the group's commit ran ahead of this view generation) is read from the log
        first, so nothing is skipped.

        Positions are re-read from the store first: with several consumers in a group, another
        process may have advanced a partition this one owned before a rebalance."""
        async with self._lock:
            self._positions = None
            return await self._process_new(records, patient)

    async def _process_new(self, records: Sequence[LogRecord], patient: bool = True) -> StepResult:
        positions = await self.positions()
        by_partition: dict[int, list[LogRecord]] = {}
        for r in records:
            if r.offset >= positions.get(r.partition, 0):
                by_partition.setdefault(r.partition, []).append(r)
        batch: list[LogRecord] = []
        for p, recs in sorted(by_partition.items()):
            recs.sort(key=lambda r: r.offset)
            start = positions.get(p, 0)
            while recs[0].offset > start:
                gap = await self.log.read(self.topic, p, start, max_records=min(self.batch_size, recs[0].offset - start))
                if not gap:
                    break
                batch.extend(gap)
                start = gap[-1].offset + 1
            batch.extend(r for r in recs if r.offset >= start)
        if not batch:
            return StepResult(0, 0)
        t0 = time.perf_counter()
        dead = await self._process(batch, patient)
        self.metrics.batch_done(self.view, len(batch), dead, time.perf_counter() - t0, [r.append_time for r in batch])
        return StepResult(len(batch), dead)

    async def _process(self, records: Sequence[LogRecord], patient: bool = True) -> int:
        """Handle and apply `records`; returns how many were dead-lettered. A TransientError is
        waited out with back-off (`patient`), or raised at once for the caller to come back later."""
        dead, remaining, backoff = 0, list(records), 0.5
        while remaining:
            try:
                steps, consumed = await asyncio.to_thread(self.projection.handle, remaining)
                dead += await self._apply(steps, await self.positions())
                remaining = remaining[consumed:]
                if remaining:
                    faults.hit("mid-batch")  # crash tests: some of the batch's steps applied, not all
                backoff = 0.5
            except TransientError as exc:
                self.metrics.batch_failed(self.view, exc)
                if not patient:
                    exc.counted = True  # (try_process/try_step: already reported)
                    raise
                log.warning("view=%s transient error, retrying in %.1fs: %s", self.view, backoff, exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self.max_backoff)
            except Exception as exc:  # noqa: BLE001 - isolate the record that breaks the projection
                self.metrics.batch_failed(self.view, exc)
                if len(remaining) == 1:
                    bad = remaining[0]
                    log.error("view=%s dead-lettering record partition=%d offset=%d: %r", self.view, bad.partition, bad.offset, exc)
                    reason = f"{self.view} projection failed: {type(exc).__name__}: {exc}"
                    step = Step(self.projection.new_change(), advance({}, [bad]), [DeadLetter(bad, self.view, reason)])
                    dead += await self._apply([step], await self.positions())
                    remaining = []
                else:
                    mid = len(remaining) // 2
                    dead += await self._process(remaining[:mid], patient)
                    remaining = remaining[mid:]
        return dead

    async def _apply(self, steps: list[Step], positions: Positions) -> int:
        dead = 0
        current = dict(positions)
        for s in steps:
            if s.dead_letters:
                await self.log.append(self.dlq_topic, dead_letter_records(s.dead_letters))
                dead += len(s.dead_letters)
            current.update(s.positions)
            # Only the partitions this step advanced: the stores merge positions per partition,
            # and another consumer of the group may own (and be advancing) the others.
            await asyncio.to_thread(self.store.apply, s.change, {p: current[p] for p in s.positions})
            self._positions = dict(current)
            if s.change.forgets or s.change.delete_turns:
                self._erase_at = 0.0 if self._erase_at is None else min(self._erase_at, time.monotonic())
        return dead

    # -- for drivers that must not block (the faust worker: its agents share one consumer) ------
    def available(self) -> bool:
        """False while a store outage's back-off runs (`try_process`/`try_step` skip until then)."""
        return time.monotonic() >= self._retry_at

    def _outage(self, exc: TransientError) -> None:
        if not getattr(exc, "counted", False):  # e.g. the store's positions could not be read
            self.metrics.batch_failed(self.view, exc)
        self._retry_at = time.monotonic() + self._outage_backoff
        log.warning("view=%s store unavailable, records left on the log; next attempt in %.1fs: %s", self.view, self._outage_backoff, exc)
        self._outage_backoff = min(self._outage_backoff * 2, self.max_backoff)

    async def try_process(self, records: Sequence[LogRecord]) -> bool:
        """`process`, except that while the view's store is unavailable the records are left on the
        log (the view's positions, the truth, do not move; `try_step` reads them later) instead of
        blocking the caller. False when skipped."""
        if not self.available():
            return False
        try:
            await self.process(records, patient=False)
        except TransientError as exc:
            self._outage(exc)
            return False
        self._outage_backoff = 0.5
        return True

    async def try_step(self, partitions: Collection[int] | None = None) -> StepResult | None:
        """`step` without waiting out an outage (None: skipped or failed; see `try_process`)."""
        if not self.available():
            return None
        try:
            result = await self.step(patient=False, partitions=partitions)
        except TransientError as exc:
            self._outage(exc)
            return None
        self._outage_backoff = 0.5
        return result

    async def erase_if_due(self) -> float | None:
        """Run the store's deferred erasure if it may be due (module docstring). Returns the
        seconds until it should be asked again, None when nothing is pending. Errors are logged
        and retried later: erasure that waits is still bounded by the store's own record."""
        if self._erase_at is None or time.monotonic() < self._erase_at:
            return None if self._erase_at is None else self._erase_at - time.monotonic()
        try:
            async with self._lock:
                pending = await asyncio.to_thread(self.store.erase_pending)
                if pending == 0:
                    pending = await asyncio.to_thread(self.store.erase_due)
        except Exception as exc:  # noqa: BLE001 - a store outage: ask again later
            log.warning("view=%s deferred erasure failed, retrying in 5s: %s", self.view, exc)
            pending = 5.0
        self._erase_at = None if pending is None else time.monotonic() + max(pending, 0.5)
        if pending is not None:
            log.debug("view=%s deferred erasure pending, next check in %.1fs", self.view, pending)
        return pending

    async def caught_up(self, target: Positions) -> bool:
        positions = await self.positions()
        return all(positions.get(p, 0) >= off for p, off in target.items())

    async def run_until(self, target: Positions, on_progress: Callable[[str, Positions], None] | None = None,
                        stop: asyncio.Event | None = None, idle_poll: float = 0.05) -> None:
        """Process until the view's positions reach `target` (e.g. the end offsets at a moment)."""
        while not await self.caught_up(target):
            if stop is not None and stop.is_set():
                return
            result = await self.step()
            if on_progress is not None:
                on_progress(self.view, await self.positions())
            if result.records == 0:
                await asyncio.sleep(idle_poll)
