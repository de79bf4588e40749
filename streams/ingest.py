"""Publishing events: validation, keys, and appends to the log.

Validation happens here, before anything is appended, so producers get field errors at once;
records that reach the log another way (a foreign producer) are validated again by every
projection and dead-lettered if invalid.

A batch is not all-or-nothing: valid items are appended, invalid items are returned with
their errors and nothing is appended for them (the caller still holds them). Results come back
in input order so callers can match them.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

from schemas.errors import InvalidEvent
from schemas.events import ForgetRequested, TurnRecorded, validate_event
from schemas.ports.event_log import AppendFailed, Appended, EventLog
from schemas.ports.keystore import KeyStore
from streams.sealing import Sealer

Event = TurnRecorded | ForgetRequested
log = logging.getLogger(__name__)


@dataclass
class ItemResult:
    index: int
    status: str  # "accepted" | "rejected" | "failed" (valid, but the log could not take it: retry)
    event_id: str | None = None
    partition: int | None = None
    offset: int | None = None
    errors: list[dict] = field(default_factory=list)
    code: int = 200  # the HTTP status this item alone would get: 200, 403, 422, 503

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"index": self.index, "status": self.status, "code": self.code}
        if self.event_id is not None:
            d["event_id"] = self.event_id
        if self.status == "accepted":
            d.update(partition=self.partition, offset=self.offset)
        else:
            d["errors"] = self.errors
        return d


# An authorisation check on a validated event: None if the caller may publish it, else why not.
Authorize = Callable[[Any], "str | None"]


def _event_id(raw: Any) -> str | None:
    return raw.get("event_id") if isinstance(raw, dict) and isinstance(raw.get("event_id"), str) else None


def validate_items(items: Sequence[Any], authorize: Authorize | None = None) -> tuple[list[tuple[int, Event]], list[ItemResult]]:
    valid, rejected = [], []
    for i, raw in enumerate(items):
        try:
            event = validate_event(raw)
        except InvalidEvent as exc:
            rejected.append(ItemResult(i, "rejected", event_id=_event_id(raw), code=422,
                                       errors=exc.errors or [{"loc": [], "msg": str(exc), "type": "value_error"}]))
            continue
        reason = authorize(event) if authorize else None
        if reason is not None:
            rejected.append(ItemResult(i, "rejected", event_id=event.event_id, code=403, errors=[{"loc": ["tenant_id"], "msg": reason, "type": "forbidden"}]))
        else:
            valid.append((i, event))
    return valid, rejected


class Publisher:
    """Appends events to the log, sealed (streams/sealing.py) when a data key store is given —
    which every entry point does; a forgotten event id is refused (code 409), never appended."""

    def __init__(self, log: EventLog, topic: str, chunk: int = 5000, keystore: KeyStore | None = None):
        self.log = log
        self.topic = topic
        self.chunk = chunk
        self.sealer = Sealer(keystore)

    async def publish(self, events: Iterable[Event]) -> list[Appended]:
        """Append events (already validated); returns one position per record appended. Events
        whose id was forgotten are left out (logged): a forgotten id is refused forever."""
        partitions = await self.log.partitions(self.topic)
        out: list[Appended] = []
        batch: list[Event] = []

        async def flush() -> None:
            refused = await asyncio.to_thread(self.sealer.refused, batch)
            if refused:
                log.warning("publish refused=%d reason=forgotten_event_ids first=%s", len(refused), next(iter(refused.values())))
            keep = [e for i, e in enumerate(batch) if i not in refused]
            records = [r for rs in await asyncio.to_thread(self.sealer.records, keep, partitions) for r in rs]
            if records:
                out.extend(await self.log.append(self.topic, records))

        for e in events:
            batch.append(e)
            if len(batch) >= self.chunk:
                await flush()
                batch = []
        if batch:
            await flush()
        return out

    async def publish_items(self, items: Sequence[Any], authorize: Authorize | None = None) -> list[ItemResult]:
        """Validate raw items (e.g. from HTTP), check each with `authorize`, and append the valid
        ones. The results say exactly what is in the log: an append that fails part-way marks
        the records it did not commit "failed" (code 503: retry them; event ids make a retry of
        the others harmless too); a forgotten event id is an item error (409)."""
        valid, rejected = validate_items(items, authorize)
        results = {r.index: r for r in rejected}
        if valid:
            refused = await asyncio.to_thread(self.sealer.refused, [e for _, e in valid])
            for n, why in refused.items():
                i, e = valid[n]
                results[i] = ItemResult(i, "rejected", e.event_id, code=409, errors=[{"loc": ["event_id"], "msg": why, "type": "forgotten"}])
            valid = [(i, e) for n, (i, e) in enumerate(valid) if n not in refused]
        if valid:
            partitions = await self.log.partitions(self.topic)
            sealed = await asyncio.to_thread(self.sealer.records, [e for _, e in valid], partitions)
            records, owners = [], []
            for (i, e), rs in zip(valid, sealed):
                records.extend(rs)
                owners.extend([(i, e)] * len(rs))
            try:
                appended: list[Appended | None] = list(await self.log.append(self.topic, records))
                failure = None
            except AppendFailed as exc:
                appended, failure = exc.appended, exc
            for (i, e), a in zip(owners, appended):
                if a is None:  # a broadcast request is committed only if every copy is
                    results[i] = ItemResult(i, "failed", e.event_id, code=503, errors=[{
                        "loc": [], "msg": f"not appended: {failure}", "type": "unavailable"}])
                elif i not in results:  # a broadcast request reports its first partition
                    results[i] = ItemResult(i, "accepted", e.event_id, a.partition, a.offset)
        return [results[i] for i in range(len(items))]


def read_jsonl(lines: Iterable[str]) -> tuple[list[Any], list[ItemResult]]:
    """Parse JSON Lines; unparseable lines become rejected results (index = line number - 1)."""
    items, bad = [], []
    for n, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            items.append((n, json.loads(line)))
        except json.JSONDecodeError as exc:
            bad.append(ItemResult(n, "rejected", code=422, errors=[{"loc": ["line", n + 1], "msg": f"not valid JSON: {exc.msg}", "type": "json_invalid"}]))
    return items, bad
