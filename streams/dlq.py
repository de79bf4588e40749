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

A dead letter is bounded, whatever the record: it must fit where the record came from (Kafka
refuses messages over 1 MB, and the original travels base64-encoded, 4/3 of its size), or the
append fails and the projection cannot move past the record — one foreign record of 800 kB
stopped a view for good. A record over MAX_ENCODED_BYTES is invalid whatever it holds, so of
such a record only a prefix is kept, with its length and SHA-256 (the original stays at its
origin on the source topic), and it is not replayable; a key over 1 kB is cut the same way.
Reasons and field errors are cut to a few kB, and headers over 16 kB are not copied. A dead
letter is thus at most about 750 kB.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import time
from dataclasses import dataclass

from schemas.errors import InvalidEvent
from schemas.events import MAX_ENCODED_BYTES, decode_event
from schemas.ports.event_log import EventLog, LogRecord, NewRecord
from streams.projections.base import DeadLetter



_log = logging.getLogger(__name__)  # `log` is the event log in this module's functions

KEPT_PREFIX = 64 * 1024     # of a record over MAX_ENCODED_BYTES, what a dead letter keeps
MAX_KEY_CHARS = 1024
MAX_REASON_CHARS = 2000
MAX_ERRORS_BYTES = 32 * 1024
MAX_HEADER_BYTES = 16 * 1024


def _cut(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def _bounded_errors(errors: list[dict]) -> list[dict]:
    out, size = [], 2
    for e in errors:
        e = {"loc": [_cut(p, 200) if isinstance(p, str) else p for p in e.get("loc", [])][:70],
             "msg": _cut(str(e.get("msg", "")), 500), "type": _cut(str(e.get("type", "")), 100)}
        size += len(json.dumps(e)) + 2
        if size > MAX_ERRORS_BYTES:
            break
        out.append(e)
    return out


def dead_letter_records(dead: list[DeadLetter]) -> list[NewRecord]:
    out = []
    for d in dead:
        r = d.record
        value, key, cut = r.value, r.key, False
        if len(value) > MAX_ENCODED_BYTES:
            value, cut = value[:KEPT_PREFIX], True
        if key is not None and len(key) > MAX_KEY_CHARS:
            key, cut = key[:MAX_KEY_CHARS], True
        body = {
            "source_topic": r.topic, "partition": r.partition, "offset": r.offset, "key": key,
            "append_time": r.append_time, "projection": d.projection, "reason": _cut(d.reason, MAX_REASON_CHARS),
            "errors": _bounded_errors(d.errors), "retryable": d.retryable and not cut,
            "value_b64": base64.b64encode(value).decode("ascii"), "dead_lettered_at": time.time(),
        }
        if cut:
            body.update(truncated=True, value_bytes=len(r.value), value_sha256=hashlib.sha256(r.value).hexdigest())
        headers = r.headers if sum(len(k) + len(v) for k, v in r.headers) <= MAX_HEADER_BYTES else ()
        out.append(NewRecord(key=key or f"{r.topic}:{r.partition}", value=json.dumps(body).encode("utf-8"), headers=headers))
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
    truncated: bool = False  # `value` is only a prefix of the record (see the module docstring)

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
        try:
            body = json.loads(rec.value)
            if body.get("kind") == "replayed":
                replayed.add(tuple(body["origin"]))
                continue
            key = (body["source_topic"], body["partition"], body["offset"])
            projection = body["projection"]
            e = entries.get(key)
            if e is None:
                e = entries[key] = DeadLetterEntry(
                    body["source_topic"], body["partition"], body["offset"], body.get("key"), body["reason"], body.get("errors", []),
                    [projection], base64.b64decode(body["value_b64"]), [], False, body.get("retryable", True), body.get("truncated", False),
                )
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
            # Not written by memstream (anyone who can write to the topic can write anything):
            # a foreign record must not make the listing, the API's or the CLI's, fail.
            _log.warning("dead-letter topic %s: the record at partition=%d offset=%d is not a dead letter; skipped",
                         dlq_topic, rec.partition, rec.offset)
            continue
        if projection not in e.projections:
            e.projections.append(projection)
        e.dlq_positions.append((rec.partition, rec.offset))
    for key, e in entries.items():
        e.replayed = key in replayed
    return sorted(entries.values(), key=lambda e: (e.source_topic, e.partition, e.offset))


@dataclass
class ReplayReport:
    replayed: list[DeadLetterEntry]
    still_invalid: list[tuple[DeadLetterEntry, str]]


async def replay_dead_letters(log: EventLog, dlq_topic: str, *, force: bool = False, dry_run: bool = False,
                              opener=None) -> ReplayReport:
    """Re-append pending dead letters to their source topic (once per original record). With an
    `opener` (streams/sealing.py) sealed records are judged by what they open to, and a record of
    forgotten memory (its key destroyed) is never replayed, forced or not."""
    pending = [e for e in await list_dead_letters(log, dlq_topic) if not e.replayed]
    ok, bad = [], []
    for e in pending:
        if e.truncated:  # forced or not: the bytes are not in the dead letter (the original is at its origin)
            bad.append((e, "only a prefix of this record is kept in its dead letter (it is over the size limit); "
                           f"the original is at {e.origin}"))
            continue
        opened = opener.open([LogRecord(e.source_topic, e.partition, e.offset, e.key, e.value, 0.0)])[0] if opener else None
        if opened is not None and opened.forgotten:
            bad.append((e, "forgotten memory (its data key was destroyed): never replayed"))
            continue
        if not force:
            if not e.retryable:
                bad.append((e, e.reason))
                continue
            if opened is not None and opened.error is not None:
                bad.append((e, str(opened.error)))
                continue
            if opened is None:
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
