"""The intake topic: where producers that are not memstream (kcat, a Kafka client in another
language) publish plain events, to be sealed and moved onto the event topic.

Why a topic of its own: the event topic holds only sealed turns (their data keys are what a
forget destroys), and a foreign producer has no keys. So it writes JSON events to
`<topic>.intake` (any key, any partition); the relay validates each record exactly as POST
/v1/events does, refuses forgotten event ids, seals and appends the valid ones to the event topic
(placed by conversation, as memstream's own producer places them), dead-letters the rest with
their reason, commits its position — and then erases what it relayed from the intake topic: at
once on the embedded log, by DeleteRecords on Kafka (the broker deletes the segments below the
new log start when they roll). The topic is also created with a short retention
(`MEMSTREAM_LOG_INTAKE_RETENTION_SECONDS`), the bound for anything the relay never reached.

Delivery: append to the event topic, then commit the intake position, then erase: a crash in
between relays a record twice, which views deduplicate by event id (and which reuses its key).
"""

from __future__ import annotations

import asyncio
import logging

from schemas.errors import InvalidEvent, TransientError
from schemas.events import decode_event
from schemas.ports.event_log import EventLog, LogRecord
from streams.dlq import dead_letter_records
from streams.projections.base import DeadLetter

log = logging.getLogger(__name__)


def intake_topic(topic: str) -> str:
    return topic + ".intake"


class IntakeRelay:
    name = "intake"

    def __init__(self, log_: EventLog, topic: str, dlq_topic: str, publisher, *, batch_size: int = 256, group: str = "memstream.intake"):
        self.log = log_
        self.topic = intake_topic(topic)
        self.dlq_topic = dlq_topic
        self.publisher = publisher  # streams.ingest.Publisher (it seals, and refuses forgotten ids)
        self.batch_size = batch_size
        self.group = group

    async def ensure_topic(self, partitions: int, retention_seconds: float) -> None:
        await self.log.ensure_topic(self.topic, partitions, retention_seconds=retention_seconds)

    async def step(self) -> int:
        committed = await self.log.committed(self.group, self.topic)
        end = await self.log.end_offsets(self.topic)
        done = 0
        for p in sorted(end):
            start = committed.get(p, 0)
            if start >= end[p]:
                continue
            records = await self.log.read(self.topic, p, start, max_records=self.batch_size)
            if not records:
                continue
            await self._relay(records)
            nxt = records[-1].offset + 1
            await self.log.commit(self.group, self.topic, {p: nxt})
            await self.log.erase_before(self.topic, p, nxt)
            done += len(records)
        return done

    async def _relay(self, records: list[LogRecord]) -> None:
        read, dead = [], []
        for r in records:
            try:
                read.append((r, decode_event(r.value, edge=True)))
            except InvalidEvent as exc:
                dead.append(DeadLetter(r, "intake", str(exc), exc.errors))
        if read:
            refused = await asyncio.to_thread(self.publisher.sealer.refused, [e for _, e in read])
            for i in refused:
                # Dropped, not dead-lettered: a dead letter would keep the forgotten text's bytes.
                log.warning("intake: dropped event_id=%s reason=forgotten_event_id", read[i][1].event_id)
            await self.publisher.publish([e for i, (_, e) in enumerate(read) if i not in refused])
        if dead:
            await self.log.append(self.dlq_topic, dead_letter_records(dead))

    async def run(self, stop: asyncio.Event, idle: float = 0.1) -> None:
        backoff = 0.5
        while not stop.is_set():
            try:
                n = await self.step()
                backoff = 0.5
            except TransientError as exc:
                log.warning("intake relay: %s; retrying in %.1fs", exc, backoff)
                n = 0
                await asyncio.sleep(backoff)
                backoff = min(30.0, backoff * 2)
            except Exception:  # noqa: BLE001 - the relay must survive; the batch is retried
                log.exception("intake relay step failed; retrying")
                n = 0
                await asyncio.sleep(1.0)
            if n == 0:
                try:
                    await asyncio.wait_for(stop.wait(), timeout=idle)
                except asyncio.TimeoutError:
                    pass
