"""Embedded hierarchy view: trace units with text and provenance in SQLite."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict

from infra.sqlite_base import SqliteViewBase, _chunks, boundary_where, forget_where
from schemas.ports.unit_store import UnitChangeSet
from schemas.ports.views import Boundary, Forget, Positions
from schemas.units import TraceUnit, UnitKind

_SCHEMA = """
CREATE TABLE IF NOT EXISTS units (
    unit_id TEXT PRIMARY KEY, tenant_id TEXT NOT NULL, conversation_id TEXT NOT NULL,
    session_id TEXT NOT NULL, kind TEXT NOT NULL, turn_start INTEGER NOT NULL,
    occurred_from TEXT NOT NULL, occurred_to TEXT NOT NULL, agent_ids TEXT NOT NULL, data TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS units_scope ON units (tenant_id, conversation_id, session_id, kind);
"""


PARSED_LISTINGS_KEPT = 64  # boundary listings whose parsed units are kept (as many as the query side's corpus cache)


class SqliteUnitStore(SqliteViewBase):
    view = "hierarchy"
    extra_schema = _SCHEMA

    def __init__(self, path, generation: int):
        super().__init__(path, generation)
        self._parsed: OrderedDict[tuple, dict[str, TraceUnit]] = OrderedDict()
        self._parsed_lock = threading.Lock()

    def apply(self, change: UnitChangeSet, positions: Positions) -> None:
        with self._change_tx(change) as c:
            touched = self._apply_ledger(c, change)
            for chunk in _chunks(change.delete_units, 500):
                c.execute(f"DELETE FROM units WHERE unit_id IN ({','.join('?' * len(chunk))})", chunk)
            c.executemany(
                "INSERT OR REPLACE INTO units VALUES (?,?,?,?,?,?,?,?,?,?)",
                [
                    (
                        u.unit_id, u.provenance.tenant_id, u.provenance.conversation_id, u.provenance.session_id, u.kind,
                        u.provenance.turn_start, u.provenance.occurred_from.isoformat(), u.provenance.occurred_to.isoformat(),
                        json.dumps(u.provenance.agent_ids), u.model_dump_json(),
                    )
                    for u in change.upsert_units
                ],
            )
            touched.update((u.provenance.tenant_id, u.provenance.conversation_id) for u in change.upsert_units)
            self._write_positions(c, positions)
            self._bump(c, touched)

    def _forget(self, c, forget: Forget):
        touched = super()._forget(c, forget)
        if not forget.scope.partial:  # a partial scope's sessions survive: the projection recomputes their units
            where, args = forget_where(forget)
            c.execute(f"DELETE FROM units WHERE {where}", args)
        return touched

    def get_units(self, tenant_id: str, unit_ids: list[str]) -> dict[str, TraceUnit]:
        out: dict[str, TraceUnit] = {}
        for chunk in _chunks(list(dict.fromkeys(unit_ids)), 500):
            rows = self._conn().execute(
                f"SELECT unit_id, data FROM units WHERE tenant_id=? AND unit_id IN ({','.join('?' * len(chunk))})", (tenant_id, *chunk)
            ).fetchall()
            out.update({uid: TraceUnit.model_validate_json(data) for uid, data in rows})
        return out

    def list_units(self, boundary: Boundary, kind: UnitKind) -> list[TraceUnit]:
        where, args = boundary_where(boundary)
        rows = self._conn().execute(f"SELECT data FROM units WHERE {where} AND kind=?", (*args, kind)).fetchall()
        units = self._parsed_units(boundary, kind, [r[0] for r in rows])
        units = [u for u in units if _inside(u, boundary)]
        session_start: dict[tuple[str, str], object] = {}
        for u in units:
            key = (u.provenance.conversation_id, u.provenance.session_id)
            start = session_start.get(key)
            if start is None or u.provenance.occurred_from < start:
                session_start[key] = u.provenance.occurred_from
        return sorted(
            units,
            key=lambda u: (u.provenance.conversation_id, session_start[(u.provenance.conversation_id, u.provenance.session_id)],
                           u.provenance.session_id, u.provenance.turn_start, u.unit_id),
        )

    def _parsed_units(self, boundary: Boundary, kind: UnitKind, texts: list[str]) -> list[TraceUnit]:
        """Each listing's units parsed once: a conversation being written changes its version with
        every batch and the query side lists it again, while most of its units are unchanged —
        re-validating them was most of that cost. The memo of a listing holds exactly what the
        listing returned, so a forgotten or replaced unit leaves it at the next listing; the
        listings remembered are bounded (units are frozen, so sharing them is safe)."""
        key = (boundary.tenant_id, boundary.conversation_ids, kind)
        with self._parsed_lock:
            before = self._parsed.get(key, {})
        now = {t: before.get(t) or TraceUnit.model_validate_json(t) for t in texts}
        with self._parsed_lock:
            self._parsed[key] = now
            self._parsed.move_to_end(key)
            while len(self._parsed) > PARSED_LISTINGS_KEPT:
                self._parsed.popitem(last=False)
        return list(now.values())  # in the listing's order (each text holds its unique unit id)

    def session_unit_ids(self, tenant_id: str, conversation_id: str, session_id: str) -> set[str]:
        rows = self._conn().execute(
            "SELECT unit_id FROM units WHERE tenant_id=? AND conversation_id=? AND session_id=?", (tenant_id, conversation_id, session_id)
        ).fetchall()
        return {r[0] for r in rows}

    def canonical_dump(self) -> dict:
        rows = self._conn().execute("SELECT data FROM units ORDER BY unit_id").fetchall()
        return {"view": self.view, "turns": self.ledger_dump(), "units": [json.loads(r[0]) for r in rows]}


def _inside(u: TraceUnit, b: Boundary) -> bool:
    p = u.provenance
    if b.agent_ids is not None and not set(p.agent_ids) & set(b.agent_ids):
        return False
    if b.since is not None and p.occurred_to < b.since:
        return False
    if b.until is not None and p.occurred_from > b.until:
        return False
    return True
