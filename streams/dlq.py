"""Dead letters: records a projection could not process, kept with the reason.

A dead letter is a JSON record on `<topic>.dlq` holding the original bytes (base64), where
they came from (topic, partition, offset, append time), which projection gave up and why.
Projections append dead letters *before* their positions move past the record, so nothing is
lost: at worst a crash duplicates a dead letter (listing deduplicates by origin).

`replay` re-drives dead letters after a fix (an upcaster, a relaxed rule, a repaired
producer): each distinct original record is appended again to the source topic — once, however
many projections dead-lettered it — and a `replayed` marker naming the origin is appended to
the dead-letter topic, so the topic alone says what is pending (this works the same on Kafka).
Records that still fail validation, or whose failure replay cannot fix (a conflicting
duplicate event id), are reported and left alone unless forced. Views
deduplicate by event id, so projections that had processed a record before are unaffected.
"""

from __future__ import annotations

import base64
import json
import time
from dataclasses import dataclass

from schemas.errors import InvalidEvent
from schemas.events import decode_event
from schemas.ports.event_log import EventLog, LogRecord, NewRecord
from streams.projections.base import DeadLetter



def dead_letter_records(dead: list[DeadLetter]) -> list[NewRecord]:
    out = []
    for d in dead:
        r = d.record
        body = {
            "source_topic": r.topic, "partition": r.partition, "offset": r.offset, "key": r.key,
            "append_time": r.append_time, "projection": d.projection, "reason": d.reason, "errors": d.errors, "retryable": d.retryable,
            "value_b64": base64.b64encode(r.value).decode("ascii"), "dead_lettered_at": time.time(),
        }
        out.append(NewRecord(key=r.key or f"{r.topic}:{r.partition}", value=json.dumps(body).encode("utf-8"), headers=r.headers))
    return out


@dataclass
class DeadLetterEntry:
    """One original record that one or more projections dead-lettered."""

    source_topic: str
    partition: int
    offset: int
    key: str | None
    reason: str
    errors: list
    projections: list[str]
    value: bytes
    dlq_positions: list[tuple[int, int]]
    replayed: bool
    retryable: bool = True

    @property
    def origin(self) -> str:
        return f"{self.source_topic}/{self.partition}/{self.offset}"


async def _all(log: EventLog, topic: str) -> list[LogRecord]:
    out: list[LogRecord] = []
    for p, end in sorted((await log.end_offsets(topic)).items()):
        offset = 0
        while offset < end:
            batch = await log.read(topic, p, offset, max_records=1000)
            if not batch:
                break
            out.extend(batch)
            offset = batch[-1].offset + 1
    return out


async def list_dead_letters(log: EventLog, dlq_topic: str) -> list[DeadLetterEntry]:
    entries: dict[tuple[str, int, int], DeadLetterEntry] = {}
    replayed: set[tuple[str, int, int]] = set()
    for rec in await _all(log, dlq_topic):
        body = json.loads(rec.value)
        if body.get("kind") == "replayed":
            replayed.add(tuple(body["origin"]))
            continue
        key = (body["source_topic"], body["partition"], body["offset"])
        e = entries.get(key)
        if e is None:
            entries[key] = DeadLetterEntry(
                body["source_topic"], body["partition"], body["offset"], body.get("key"), body["reason"], body.get("errors", []),
                [body["projection"]], base64.b64decode(body["value_b64"]), [(rec.partition, rec.offset)], False,
                body.get("retryable", True),
            )
        else:
            if body["projection"] not in e.projections:
                e.projections.append(body["projection"])
            e.dlq_positions.append((rec.partition, rec.offset))
    for key, e in entries.items():
        e.replayed = key in replayed
    return sorted(entries.values(), key=lambda e: (e.source_topic, e.partition, e.offset))


@dataclass
class ReplayReport:
    replayed: list[DeadLetterEntry]
    still_invalid: list[tuple[DeadLetterEntry, str]]


async def replay_dead_letters(log: EventLog, dlq_topic: str, *, force: bool = False, dry_run: bool = False) -> ReplayReport:
    """Re-append pending dead letters to their source topic (once per original record)."""
    pending = [e for e in await list_dead_letters(log, dlq_topic) if not e.replayed]
    ok, bad = [], []
    for e in pending:
        if not force:
            if not e.retryable:
                bad.append((e, e.reason))
                continue
            try:
                decode_event(e.value)
            except InvalidEvent as exc:
                bad.append((e, str(exc)))
                continue
        ok.append(e)
    if dry_run or not ok:
        return ReplayReport(ok, bad)
    by_topic: dict[str, list[DeadLetterEntry]] = {}
    for e in ok:
        by_topic.setdefault(e.source_topic, []).append(e)
    for topic, entries in by_topic.items():
        await log.append(topic, [NewRecord(key=e.key or "", value=e.value) for e in entries])
    markers = [
        NewRecord(key=e.key or e.origin, value=json.dumps({"kind": "replayed", "origin": [e.source_topic, e.partition, e.offset],
                                                           "at": time.time()}).encode("utf-8"))
        for e in ok
    ]
    await log.append(dlq_topic, markers)
    return ReplayReport(ok, bad)
