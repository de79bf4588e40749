"""The eraser: follows the log and, at each ForgetRequested, destroys the data keys of every turn
inside its scope that came before it in that partition — which shreds those turns' sealed copies
in the log, in the dead letters and in the stores that keep only sealed text. It leaves a
tombstone per forgotten event id (the "refused forever" list) and, on a log that can erase
(the embedded one), physically removes the forgotten records too.

Order is the guarantee: a forget at offset o of partition p covers exactly the turns of p before
o; a tenant or agent forget is one request per partition, each covering its own partition. A turn
published after the forget (a new event id) is new memory; the same event id again is refused by
the publisher (its key is a tombstone) and skipped by every projection.

The scan is over the partition's records before the forget (their headers carry the ids and
time; sealed records that lost their headers — re-appended dead letters — are opened with their
key; plain ones decoded): exact, and a cost paid once per forget, proportional to the partition.

Positions live in the key store, written once a forget's keys are destroyed, its plain records
erased and its completion recorded (`on_erased`), so the eraser resumes where it stopped, a
crash in between repeats the forget (harmless), and POST /v1/wait can tell when it is complete.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from dataclasses import dataclass

from schemas.errors import InvalidEvent, TransientError
from schemas.events import ForgetRequested, TurnRecorded, decode_event
from schemas.ports.event_log import EventLog, LogRecord
from schemas.ports.keystore import EventRef, KeyStore, Tombstone
from schemas.ports.views import Positions
from schemas.sealing import envelope
from streams.sealing import header_ids, occurred

log = logging.getLogger(__name__)


@dataclass
class Erasure:
    """One forget request, as the eraser completed it on one partition."""

    forget: ForgetRequested
    partition: int
    offset: int
    tombstones: list[Tombstone]
    records_erased: int
    seconds: float


class EraserRunner:
    name = "eraser"

    def __init__(self, log_: EventLog, topic: str, keystore: KeyStore, *, batch_size: int = 256, on_erased=None, max_backoff: float = 30.0):
        self.log = log_
        self.topic = topic
        self.keystore = keystore
        self.batch_size = batch_size
        self.on_erased = on_erased  # callback(Erasure), sync or async: the audit trail (streams/audit.py)
        self.max_backoff = max_backoff
        self._positions: Positions | None = None

    async def positions(self) -> Positions:
        if self._positions is None:
            self._positions = await asyncio.to_thread(self.keystore.positions)
        return dict(self._positions)

    async def caught_up(self, target: Positions) -> bool:
        positions = await self.positions()
        return all(positions.get(p, 0) >= off for p, off in target.items())

    async def step(self) -> int:
        """Read the next records of every partition and complete the forgets among them."""
        positions = await self.positions()
        end = await self.log.end_offsets(self.topic)
        done = 0
        for p in sorted(end):
            start = positions.get(p, 0)
            if start >= end[p]:
                continue
            records = await self.log.read(self.topic, p, start, max_records=self.batch_size)
            done += await self._process(p, records)
        return done

    async def _process(self, partition: int, records: list[LogRecord]) -> int:
        last = None
        for r in records:
            forget = _forget_of(r)
            if forget is not None:
                await self._erase(forget, r)
            last = r
        if last is not None:
            new = {partition: last.offset + 1}
            await asyncio.to_thread(self.keystore.write_positions, new)
            self._positions = {**(self._positions or {}), **new}
        return len(records)

    async def _erase(self, forget: ForgetRequested, at: LogRecord) -> None:
        t0 = time.perf_counter()
        refs: dict[str, EventRef] = {}
        plain: list[int] = []  # offsets of unsealed records in scope, erased where the log can
        offset = 0
        while offset < at.offset:
            batch = await self.log.read(self.topic, at.partition, offset, max_records=1000)
            batch = [r for r in batch if r.offset < at.offset]
            if not batch:
                break
            for r in batch:
                hit = await asyncio.to_thread(self._in_scope, r, forget)
                if hit is not None:
                    ref, sealed = hit
                    refs[ref.key_id] = ref
                    if not sealed:
                        plain.append(r.offset)
            offset = batch[-1].offset + 1
        tombstones = await asyncio.to_thread(self.keystore.destroy, list(refs.values()), forget.event_id)
        erased = 0
        if plain and hasattr(self.log, "erase"):
            erased = await self.log.erase(self.topic, at.partition, plain)
        erasure = Erasure(forget, at.partition, at.offset, tombstones, erased, time.perf_counter() - t0)
        log.info("forget=%s partition=%d scope=%s keys_destroyed=%d plain_records_erased=%d seconds=%.3f", forget.event_id, at.partition,
                 forget.scope.level, len(tombstones), erased, erasure.seconds)
        if self.on_erased is not None:
            done = self.on_erased(erasure)
            if inspect.isawaitable(done):
                await done
        # The position moves past the forget last — after its keys are destroyed, its plain records
        # erased and its completion recorded (the audit trail's ForgetCompleted): a crash before
        # this line repeats the forget, which is harmless (destroy and erase are idempotent), so
        # each of them happens at least once, and POST /v1/wait on the position means all of them.
        await asyncio.to_thread(self.keystore.write_positions, {at.partition: at.offset + 1})
        self._positions = {**(self._positions or {}), at.partition: at.offset + 1}

    def _in_scope(self, r: LogRecord, forget: ForgetRequested) -> tuple[EventRef, bool] | None:
        """(the event, whether it is sealed) if the record is a turn inside the forget's scope."""
        scope = forget.scope
        h = header_ids(r)
        if h is not None and (when := occurred(h["occurred_at"])) is not None:
            if scope.covers(h["tenant"], h["conversation"], h["session"], h["event_id"], h["agent"], when, forget.tenant_id):
                return EventRef(h["tenant"], h["conversation"], h["event_id"]), r.header("key_id") is not None
            return None
        try:
            env = envelope(r.value)
            if env is not None:
                if env.tenant_id != forget.tenant_id:
                    return None
                keys = self.keystore.get([env.key_id])
                if env.key_id not in keys:  # destroyed already, or never held: nothing left to open
                    ref = EventRef(env.tenant_id, env.conversation_id, env.event_id)
                    coarse = scope.level == "tenant" and scope.occurred_before is None
                    fits = coarse or (scope.level == "conversation" and scope.occurred_before is None
                                      and env.conversation_id == scope.conversation_id)
                    return (ref, True) if fits else None
                event = decode_event(env.open(keys[env.key_id].secret))
                sealed = True
            else:
                event = decode_event(r.value)
                sealed = False
        except InvalidEvent:
            return None
        if not isinstance(event, TurnRecorded):
            return None
        if scope.covers(event.tenant_id, event.conversation_id, event.session_id, event.event_id, event.agent_id, event.occurred_at,
                        forget.tenant_id):
            return EventRef(event.tenant_id, event.conversation_id, event.event_id), sealed
        return None

    async def run(self, stop: asyncio.Event, idle: float = 0.1) -> None:
        backoff = 0.5
        while not stop.is_set():
            try:
                n = await self.step()
                backoff = 0.5
            except TransientError as exc:
                log.warning("eraser: %s; retrying in %.1fs", exc, backoff)
                n = 0
                await asyncio.sleep(backoff)
                backoff = min(self.max_backoff, backoff * 2)
            except Exception:  # noqa: BLE001 - the loop must survive; the forget is retried
                log.exception("eraser step failed; retrying")
                n = 0
                await asyncio.sleep(1.0)
            if n == 0:
                try:
                    await asyncio.wait_for(stop.wait(), timeout=idle)
                except asyncio.TimeoutError:
                    pass

    async def run_until(self, target: Positions) -> None:
        while not await self.caught_up(target):
            if await self.step() == 0:
                await asyncio.sleep(0.02)


def _forget_of(r: LogRecord) -> ForgetRequested | None:
    if r.header("type") not in (None, b"ForgetRequested"):
        return None
    try:
        event = decode_event(r.value)
    except InvalidEvent:
        return None
    return event if isinstance(event, ForgetRequested) else None
