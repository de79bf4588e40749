"""Embedded hierarchy view: trace units with text and provenance in SQLite."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from datetime import datetime

from infra.sqlite_base import SqliteViewBase, _chunks, boundary_where, forget_where
from schemas.ports.unit_store import UnitChangeSet
from schemas.ports.views import Boundary, Forget, Positions
from schemas.units import TraceUnit, UnitKind, unit_key

_SCHEMA = """
CREATE TABLE IF NOT EXISTS units (
    unit_id TEXT PRIMARY KEY, tenant_id TEXT NOT NULL, conversation_id TEXT NOT NULL,
    session_id TEXT NOT NULL, kind TEXT NOT NULL, turn_start INTEGER NOT NULL,
    occurred_from TEXT NOT NULL, occurred_to TEXT NOT NULL, agent_ids TEXT NOT NULL, data TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS units_scope ON units (tenant_id, conversation_id, session_id, kind);
-- unit_key(unit_id) (schemas/units.py): what the lexical and dense views answer with
CREATE TABLE IF NOT EXISTS unit_keys (unit_key INTEGER PRIMARY KEY, unit_id TEXT NOT NULL);
CREATE TRIGGER IF NOT EXISTS units_keys_out AFTER DELETE ON units BEGIN
    DELETE FROM unit_keys WHERE unit_id = OLD.unit_id;
END;
-- Which windows and episodes hold a turn, and each conversation's speakers: kept by triggers in the
-- writes' own transactions, so that a query reads a handful of rows, never a whole boundary.
CREATE TABLE IF NOT EXISTS unit_members (
    turn_id TEXT NOT NULL, unit_id TEXT NOT NULL, tenant_id TEXT NOT NULL, PRIMARY KEY (turn_id, unit_id)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS unit_members_unit ON unit_members (unit_id);
CREATE TRIGGER IF NOT EXISTS units_members_in AFTER INSERT ON units WHEN NEW.kind <> 'turn' BEGIN
    INSERT OR IGNORE INTO unit_members SELECT value, NEW.unit_id, NEW.tenant_id FROM json_each(NEW.data, '$.turn_ids');
END;
CREATE TRIGGER IF NOT EXISTS units_members_out AFTER DELETE ON units WHEN OLD.kind <> 'turn' BEGIN
    DELETE FROM unit_members WHERE unit_id = OLD.unit_id;
END;
CREATE TABLE IF NOT EXISTS speakers (
    tenant_id TEXT NOT NULL, conversation_id TEXT NOT NULL, speaker TEXT NOT NULL, turns INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, conversation_id, speaker)) WITHOUT ROWID;
CREATE TRIGGER IF NOT EXISTS turns_speakers_in AFTER INSERT ON turns BEGIN
    INSERT INTO speakers VALUES (NEW.tenant_id, NEW.conversation_id, NEW.speaker, 1)
        ON CONFLICT (tenant_id, conversation_id, speaker) DO UPDATE SET turns = turns + 1;
END;
CREATE TRIGGER IF NOT EXISTS turns_speakers_out AFTER DELETE ON turns BEGIN
    UPDATE speakers SET turns = turns - 1
        WHERE tenant_id = OLD.tenant_id AND conversation_id = OLD.conversation_id AND speaker = OLD.speaker;
    DELETE FROM speakers WHERE tenant_id = OLD.tenant_id AND conversation_id = OLD.conversation_id
        AND speaker = OLD.speaker AND turns <= 0;
END;
CREATE INDEX IF NOT EXISTS turns_time ON turns (tenant_id, conversation_id, session_id, occurred_at);
CREATE INDEX IF NOT EXISTS turns_conversation_time ON turns (tenant_id, conversation_id, occurred_at);
CREATE INDEX IF NOT EXISTS turns_latest ON turns (tenant_id, occurred_at);
"""


PARSED_LISTINGS_KEPT = 64  # boundary listings whose parsed units are kept (as many as the query side's corpus cache)


PARSED_UNITS_KEPT = 50_000  # units parsed by get_units, kept by their stored text (the bounded query path's reads)


class SqliteUnitStore(SqliteViewBase):
    view = "hierarchy"
    extra_schema = _SCHEMA
    # 3: unit_members and speakers (kept by triggers; filled from the units on migration).
    format_version = 3

    def __init__(self, path, generation: int):
        super().__init__(path, generation)
        self._parsed: OrderedDict[tuple, dict[str, TraceUnit]] = OrderedDict()
        self._parsed_lock = threading.Lock()
        self._by_id: OrderedDict[str, tuple[int, TraceUnit]] = OrderedDict()  # unit id -> (rowid, parsed unit)

    def _migrate(self) -> None:
        super()._migrate()
        c = self._conn()
        with self._tx() as tx:
            tx.execute("DELETE FROM unit_members")
            tx.execute("INSERT OR IGNORE INTO unit_members SELECT j.value, u.unit_id, u.tenant_id FROM units u, "
                       "json_each(u.data, '$.turn_ids') j WHERE u.kind <> 'turn'")
            tx.execute("DELETE FROM unit_keys")
            tx.executemany("INSERT OR REPLACE INTO unit_keys VALUES (?,?)",
                           [(unit_key(r[0]), r[0]) for r in tx.execute("SELECT unit_id FROM units").fetchall()])
            tx.execute("DELETE FROM speakers")
            tx.execute("INSERT INTO speakers SELECT tenant_id, conversation_id, speaker, COUNT(*) FROM turns "
                       "GROUP BY tenant_id, conversation_id, speaker")
        del c

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
            c.executemany("INSERT OR REPLACE INTO unit_keys VALUES (?,?)", [(unit_key(u.unit_id), u.unit_id) for u in change.upsert_units])
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
            # By the primary key, the tenant checked on the rows (a tenant condition in SQL makes the
            # planner walk the tenant's index instead).
            rows = self._conn().execute(
                f"SELECT unit_id, rowid, tenant_id FROM units WHERE unit_id IN ({','.join('?' * len(chunk))})", chunk).fetchall()
            out.update(self._parsed_rows([(uid, rowid) for uid, rowid, tenant in rows if tenant == tenant_id]))
        return out

    def _parsed_rows(self, rows: list[tuple[str, int]]) -> dict[str, TraceUnit]:
        """The units of (unit id, rowid) rows, parsed once while their row stays the same: a unit
        rewritten (a window re-cut) gets a new rowid, so a cached parse of the old text is never
        served. Only the rows not cached are read (units are frozen: sharing them is safe)."""
        out: dict[str, TraceUnit] = {}
        missing = []
        with self._parsed_lock:
            for uid, rowid in rows:
                hit = self._by_id.get(uid)
                if hit is not None and hit[0] == rowid:
                    self._by_id.move_to_end(uid)
                    out[uid] = hit[1]
                else:
                    missing.append(rowid)
        for chunk in _chunks(missing, 500):
            parsed = [(rowid, uid, TraceUnit.model_validate_json(data)) for rowid, uid, data in self._conn().execute(
                f"SELECT rowid, unit_id, data FROM units WHERE rowid IN ({','.join('?' * len(chunk))})", chunk).fetchall()]
            with self._parsed_lock:
                for rowid, uid, unit in parsed:
                    self._by_id[uid] = (rowid, unit)
                    out[uid] = unit
                while len(self._by_id) > PARSED_UNITS_KEPT:
                    self._by_id.popitem(last=False)
        return out

    # -- the bounded query path's reads (schemas/ports/unit_store.py) -------------------------
    def containing(self, tenant_id: str, turn_ids: list[str]) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for chunk in _chunks(list(dict.fromkeys(turn_ids)), 500):
            for turn_id, unit_id, tenant in self._conn().execute(
                    f"SELECT turn_id, unit_id, tenant_id FROM unit_members WHERE turn_id IN ({','.join('?' * len(chunk))}) "
                    "ORDER BY turn_id, unit_id", chunk).fetchall():
                if tenant == tenant_id:
                    out.setdefault(turn_id, []).append(unit_id)
        return out

    def units_by_keys(self, tenant_id: str, keys: list[int]) -> dict[int, TraceUnit]:
        out: dict[int, TraceUnit] = {}
        for chunk in _chunks([int(k) for k in dict.fromkeys(keys)], 500):
            rows = [r[:3] for r in self._conn().execute(
                f"SELECT k.unit_key, u.unit_id, u.rowid, u.tenant_id FROM unit_keys k JOIN units u ON u.unit_id = k.unit_id "
                f"WHERE k.unit_key IN ({','.join('?' * len(chunk))})", chunk).fetchall() if r[3] == tenant_id]
            units = self._parsed_rows([(uid, rowid) for _, uid, rowid in rows])
            out.update({key: units[uid] for key, uid, _ in rows if uid in units})
        return out

    def speakers(self, boundary: Boundary) -> list[str]:
        where, args = boundary_where(Boundary(boundary.tenant_id, boundary.conversation_ids))
        rows = self._conn().execute(f"SELECT DISTINCT speaker FROM speakers WHERE {where} ORDER BY speaker", args).fetchall()
        return [r[0] for r in rows]

    def size(self, boundary: Boundary) -> int:
        """Turns in the boundary's conversations (from the speakers' counts: no scan of the turns)."""
        where, args = boundary_where(Boundary(boundary.tenant_id, boundary.conversation_ids))
        row = self._conn().execute(f"SELECT COALESCE(SUM(turns), 0) FROM speakers WHERE {where}", args).fetchone()
        return int(row[0])

    def latest(self, boundary: Boundary):
        where, args = boundary_where(Boundary(boundary.tenant_id, boundary.conversation_ids, boundary.session_ids))
        row = self._conn().execute(f"SELECT MAX(occurred_at) FROM turns WHERE {where}", args).fetchone()
        return datetime.fromisoformat(row[0]) if row and row[0] else None

    def session_starts(self, tenant_id: str, sessions: list[tuple[str, str]]) -> dict[tuple[str, str], datetime]:
        out = {}
        by_conversation: dict[str, list[str]] = {}
        for conversation_id, session_id in dict.fromkeys(sessions):
            by_conversation.setdefault(conversation_id, []).append(session_id)
        for conversation_id, session_ids in by_conversation.items():
            for chunk in _chunks(session_ids, 400):
                for session_id, start in self._conn().execute(
                        f"SELECT session_id, MIN(occurred_at) FROM turns WHERE tenant_id=? AND conversation_id=? "
                        f"AND session_id IN ({','.join('?' * len(chunk))}) GROUP BY session_id",
                        (tenant_id, conversation_id, *chunk)).fetchall():
                    out[(conversation_id, session_id)] = datetime.fromisoformat(start)
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
