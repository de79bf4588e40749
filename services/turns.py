"""Turns as the API reads them back: a boundary's turns a page at a time (GET /v1/turns), one
turn by its event id (GET /v1/turns/{event_id}) and its history (…/history).

The hierarchy view's ledger is the index — which turns exist, in which conversation, where in
the log — and the log is the record: each turn is read back at its position and opened with its
data key, so what comes back is the event as it was published (attachments, metadata,
`supersedes`), never a derived copy. A turn whose key is already destroyed (a forget in
progress) is left out.

Listings are ordered by (occurred_at, turn id); the cursor is that pair (services/paging.py),
stable while turns are added.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from schemas.errors import Ambiguous, InvalidRequest, NotFound
from schemas.events import TurnRecorded
from schemas.ports.event_log import EventLog
from schemas.ports.views import Boundary, TurnRow
from infra.turn_docs import micros
from services.paging import MAX_LIMIT, TURNS
from streams.sealing import Opener

MAX_PAGE = MAX_LIMIT
_HISTORY_DEPTH = 100


def _cursor(turn: TurnRow) -> str:
    return TURNS.render((micros(turn.occurred_at), turn.turn_id))


@dataclass
class TurnReader:
    log: EventLog
    topic: str
    keystore: Any
    units: Any  # the hierarchy view's store (schemas/ports/unit_store.py)

    async def _events(self, rows: list[TurnRow]) -> list[tuple[TurnRow, TurnRecorded]]:
        """Each row's event, read at its log position and opened; rows whose record does not
        open (a destroyed key) are left out."""
        records = []
        for row in rows:
            got = await self.log.read(self.topic, row.partition, row.offset, max_records=1)
            records.append(got[0] if got and got[0].offset == row.offset else None)
        held = [r for r in records if r is not None]
        opened = iter(Opener(self.keystore).open(held))
        out = []
        for row, record in zip(rows, records):
            if record is None:
                continue
            o = next(opened)
            if isinstance(o.event, TurnRecorded) and o.event.event_id == row.event_id and o.event.tenant_id == row.tenant_id:
                out.append((row, o.event))
        return out

    def _as_dict(self, row: TurnRow, event: TurnRecorded) -> dict[str, Any]:
        d = event.model_dump(mode="json", exclude={"type", "schema_version"})
        d["superseded_by"] = [c.event_id for c in self.units.corrections(row.tenant_id, row.conversation_id, row.event_id)]
        d.update(partition=row.partition, offset=row.offset, turn_id=row.turn_id)
        return d

    async def page(self, boundary: Boundary, cursor: str | None, limit: int, include_superseded: bool) -> dict[str, Any]:
        if not 1 <= limit <= MAX_PAGE:
            raise InvalidRequest(f"limit must be in 1..{MAX_PAGE}")
        after = TURNS.parse(cursor) if cursor else None
        rows = self.units.page_turns(boundary, after, limit, include_superseded=include_superseded)
        turns = [self._as_dict(r, e) for r, e in await self._events(rows)]
        return {"turns": turns, "next_cursor": _cursor(rows[-1]) if len(rows) == limit else None}

    def _row(self, tenant_id: str, event_id: str, conversation_id: str | None) -> TurnRow:
        rows = self.units.turns_by_event(tenant_id, event_id, conversation_id)
        if not rows:
            raise NotFound(f"no turn with event id {event_id!r}" + (f" in conversation {conversation_id!r}" if conversation_id else ""))
        if len(rows) > 1:
            raise Ambiguous(f"event id {event_id!r} names a turn in {len(rows)} conversations: name one (conversation_id)")
        return rows[0]

    async def one(self, tenant_id: str, event_id: str, conversation_id: str | None) -> dict[str, Any]:
        row = self._row(tenant_id, event_id, conversation_id)
        got = await self._events([row])
        if not got:
            raise NotFound(f"turn {event_id!r} is being forgotten")
        return self._as_dict(*got[0])

    async def history(self, tenant_id: str, event_id: str, conversation_id: str | None) -> dict[str, Any]:
        """The turn a chain of corrections starts from, then every correction, oldest first."""
        row = self._row(tenant_id, event_id, conversation_id)
        for _ in range(_HISTORY_DEPTH):  # up to the turn the chain corrects
            if not row.supersedes:
                break
            up = self.units.turns_by_event(tenant_id, row.supersedes, row.conversation_id)
            if not up or up[0].turn_id == row.turn_id:
                break
            row = up[0]
        versions, seen, frontier = [row], {row.turn_id}, [row]
        while frontier and len(versions) < _HISTORY_DEPTH:
            nxt = []
            for r in frontier:
                for c in self.units.corrections(tenant_id, r.conversation_id, r.event_id):
                    if c.turn_id not in seen:
                        seen.add(c.turn_id)
                        versions.append(c)
                        nxt.append(c)
            frontier = nxt
        from schemas.ordering import order_turns

        ordered = [versions[0], *order_turns(versions[1:])]
        return {"event_id": ordered[0].event_id, "versions": [self._as_dict(r, e) for r, e in await self._events(ordered)]}
