"""Export of a tenant's memory — the data subject's right of access — for `memstream export`
(services/export_cli.py) and GET /v1/export (services/routes/export.py).

What goes out is the raw `TurnRecorded` events the log still holds for the tenant (one
conversation, or all of them), read from the log and opened with their data keys
(streams/sealing.py's Opener), as JSON Lines that `memstream ingest jsonl` re-imports:

- forgotten turns are left out: their keys were destroyed, so they do not open; a plain record
  (an older release's, or a foreign producer's on the event topic) is left out when its id has a
  tombstone; and a forget the eraser has not reached yet already counts (the pending requests
  are read from the partitions' tails first, so an export never hands out what was asked to be
  forgotten before it started);
- in log order (partition by partition; a conversation lives in one), each event once — the
  first copy of an event id in its conversation, as the views keep it;
- what the log held when the export started (its end offsets then).

Each export is recorded in the audit trail (`MemoryExported`: who, tenant, conversation, how
many turns, whether it ran to the end) — never what it contained.
"""

from __future__ import annotations

import asyncio
import logging
from typing import AsyncIterator

from schemas.events import ForgetRequested, TurnRecorded, decode_event, partition_key
from schemas.errors import InvalidEvent
from schemas.forgetting import MemoryExported
from schemas.ports.event_log import EventLog, LogRecord, default_partition
from schemas.ports.keystore import KeyStore, key_id
from streams.audit import append_record
from streams.sealing import Opener

log = logging.getLogger(__name__)


def _may_hold(r: LogRecord, tenant_id: str, conversation_id: str | None) -> bool:
    """Whether the record can be one of the tenant's turns, by its headers alone (records without
    headers — plain ones, re-appended dead letters — are opened to find out)."""
    kind = r.header("type")
    if kind is not None and kind != b"TurnRecorded":
        return False
    tenant = r.header("tenant")
    if tenant is not None and tenant != tenant_id.encode():
        return False
    conversation = r.header("conversation")
    return conversation is None or conversation_id is None or conversation == conversation_id.encode()


async def _pending_forgets(log_: EventLog, topic: str, partition: int, start: int, end: int,
                           tenant_id: str) -> list[tuple[int, ForgetRequested]]:
    """The tenant's forget requests at or after the eraser's position: not applied to the log yet."""
    out = []
    offset = start
    while offset < end:
        records = [r for r in await log_.read(topic, partition, offset, max_records=1000) if r.offset < end]
        if not records:
            break
        for r in records:
            if r.header("type") not in (None, b"ForgetRequested") or r.header("tenant") not in (None, tenant_id.encode()):
                continue
            try:
                event = decode_event(r.value)
            except InvalidEvent:  # a sealed turn without headers, or garbage: not a request
                continue
            if isinstance(event, ForgetRequested) and event.tenant_id == tenant_id:
                out.append((r.offset, event))
        offset = records[-1].offset + 1
    return out


async def export_turns(log_: EventLog, topic: str, keystore: KeyStore, tenant_id: str, conversation_id: str | None = None,
                       *, batch: int = 500) -> AsyncIterator[TurnRecorded]:
    """The tenant's turns still held, in log order, each event once (see the module's docstring)."""
    end = await log_.end_offsets(topic)
    if conversation_id is not None:
        partitions = [default_partition(partition_key(tenant_id, conversation_id), len(end))]
    else:
        partitions = sorted(end)
    erased_to = await asyncio.to_thread(keystore.positions)
    opener = Opener(keystore)
    seen: set[tuple[str, str]] = set()
    for p in partitions:
        pending = await _pending_forgets(log_, topic, p, erased_to.get(p, 0), end.get(p, 0), tenant_id)
        offset = 0
        while offset < end.get(p, 0):
            records = [r for r in await log_.read(topic, p, offset, max_records=batch) if r.offset < end[p]]
            if not records:
                break
            offset = records[-1].offset + 1
            candidates = [r for r in records if _may_hold(r, tenant_id, conversation_id)]
            if not candidates:
                continue
            opened = await asyncio.to_thread(opener.open, candidates)
            turns = [(r, o) for r, o in zip(candidates, opened) if isinstance(o.event, TurnRecorded) and o.event.tenant_id == tenant_id
                     and (conversation_id is None or o.event.conversation_id == conversation_id)]
            plain = {key_id(tenant_id, o.event.conversation_id, o.event.event_id) for _, o in turns if not o.sealed}
            gone = await asyncio.to_thread(keystore.destroyed, plain) if plain else {}
            for r, o in turns:
                e = o.event
                if (e.conversation_id, e.event_id) in seen:
                    continue
                seen.add((e.conversation_id, e.event_id))
                if not o.sealed and key_id(tenant_id, e.conversation_id, e.event_id) in gone:
                    continue
                if any(at > r.offset and f.scope.covers(e.tenant_id, e.conversation_id, e.session_id, e.event_id, e.agent_id,
                                                        e.occurred_at, f.tenant_id) for at, f in pending):
                    continue
                yield e


async def record_export(log_: EventLog, topic: str, tenant_id: str, conversation_id: str | None, turns: int, complete: bool,
                        by: str) -> None:
    """The export's entry in the audit trail (best effort: the data already went out)."""
    try:
        await append_record(log_, topic, MemoryExported(tenant_id=tenant_id, conversation_id=conversation_id, turns=turns,
                                                        complete=complete, by=by))
    except Exception:  # noqa: BLE001 - say so loudly, but an export that was delivered is not undone by a failed audit write
        log.exception("export tenant=%s turns=%d was not recorded in the audit trail", tenant_id, turns)
