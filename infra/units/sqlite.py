"""Embedded hierarchy view: trace units with text and provenance in SQLite."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from datetime import datetime

from infra.sqlite_base import SqliteViewBase, _chunks, boundary_where, forget_where
from infra.units.reads import UnitReads
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
-- What changed, in commit order, for the in-memory reads of infra/units/reads.py to follow: every
-- unit and ledger turn written or deleted, with its session. Pruned to the last CHANGES_KEPT rows.
CREATE TABLE IF NOT EXISTS unit_changes (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, unit_id TEXT NOT NULL, tenant_id TEXT NOT NULL,
    conversation_id TEXT NOT NULL, session_id TEXT NOT NULL);
CREATE TRIGGER IF NOT EXISTS units_changes_in AFTER INSERT ON units BEGIN
    INSERT INTO unit_changes (unit_id, tenant_id, conversation_id, session_id)
        VALUES (NEW.unit_id, NEW.tenant_id, NEW.conversation_id, NEW.session_id);
END;
CREATE TRIGGER IF NOT EXISTS units_changes_out AFTER DELETE ON units BEGIN
    INSERT INTO unit_changes (unit_id, tenant_id, conversation_id, session_id)
        VALUES (OLD.unit_id, OLD.tenant_id, OLD.conversation_id, OLD.session_id);
END;
CREATE TRIGGER IF NOT EXISTS turns_changes_in AFTER INSERT ON turns BEGIN
    INSERT INTO unit_changes (unit_id, tenant_id, conversation_id, session_id)
        VALUES (NEW.turn_id, NEW.tenant_id, NEW.conversation_id, NEW.session_id);
END;
CREATE TRIGGER IF NOT EXISTS turns_changes_out AFTER DELETE ON turns BEGIN
    INSERT INTO unit_changes (unit_id, tenant_id, conversation_id, session_id)
        VALUES (OLD.turn_id, OLD.tenant_id, OLD.conversation_id, OLD.session_id);
END;
CREATE INDEX IF NOT EXISTS turns_time ON turns (tenant_id, conversation_id, session_id, occurred_at);
CREATE INDEX IF NOT EXISTS turns_conversation_time ON turns (tenant_id, conversation_id, occurred_at);
CREATE INDEX IF NOT EXISTS turns_latest ON turns (tenant_id, occurred_at);
"""


PARSED_LISTINGS_KEPT = 64  # boundary listings whose parsed units are kept (as many as the query side's corpus cache)


PARSED_UNITS_KEPT = 50_000  # units the bounded query path read by id or key, kept parsed (infra/units/reads.py)
GROUPS_KEPT = 200_000  # turns whose windows and episodes are kept for it
CHANGES_KEPT = 500_000


class SqliteUnitStore(SqliteViewBase):
    view = "hierarchy"
    extra_schema = _SCHEMA
    # 3: unit_members and speakers (kept by triggers; filled from the units on migration).
    format_version = 3

    def __init__(self, path, generation: int):
        super().__init__(path, generation)
        self._parsed: OrderedDict[tuple, dict[str, TraceUnit]] = OrderedDict()
        self._parsed_lock = threading.Lock()
        self._reads = UnitReads(PARSED_UNITS_KEPT, GROUPS_KEPT)
        self._reads.epoch = self._last_change()

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
            c.execute("DELETE FROM unit_changes WHERE seq <= (SELECT MAX(seq) FROM unit_changes) - ?", (CHANGES_KEPT,))

    def _forget(self, c, forget: Forget):
        touched = super()._forget(c, forget)
        if not forget.scope.partial:  # a partial scope's sessions survive: the projection recomputes their units
            where, args = forget_where(forget)
            c.execute(f"DELETE FROM units WHERE {where}", args)
        return touched

    # -- the bounded query path's reads (schemas/ports/unit_store.py), kept in memory ----------
    def _last_change(self) -> int:
        return int(self._conn().execute("SELECT MAX(seq) FROM unit_changes").fetchone()[0] or 0)

    def _sync(self) -> int:
        """Apply what was written since the last read (under the lock); the epoch a read starts at."""
        reads = self._reads
        rows = self._conn().execute("SELECT seq, unit_id, tenant_id, conversation_id, session_id FROM unit_changes "
                                    "WHERE seq > ? ORDER BY seq", (reads.epoch,)).fetchall()
        if rows:
            oldest = self._conn().execute("SELECT MIN(seq) FROM unit_changes").fetchone()[0]
            if oldest > reads.epoch + 1:  # pruned past this reader
                reads.restart(rows[-1][0])
            else:
                reads.changed(rows)
        return reads.epoch

    def kept_reads(self) -> dict:
        """What the in-memory reads hold once the writes so far are applied (the contract suite
        compares it with what a store opened afresh reads)."""
        with self._parsed_lock:
            self._sync()
            return self._reads.contents()

    def get_units(self, tenant_id: str, unit_ids: list[str]) -> dict[str, TraceUnit]:
        with self._parsed_lock:
            epoch = self._sync()
            out, missing = self._reads.units_of(dict.fromkeys(unit_ids), tenant_id)
        for chunk in _chunks(missing, 500):
            # By the primary key, the tenant checked on the rows (a tenant condition in SQL makes the
            # planner walk the tenant's index instead).
            rows = self._conn().execute(
                f"SELECT unit_id, rowid, tenant_id FROM units WHERE unit_id IN ({','.join('?' * len(chunk))})", chunk).fetchall()
            out.update(self._parsed_rows([(uid, rowid) for uid, rowid, tenant in rows if tenant == tenant_id], epoch))
        return out

    def _parsed_rows(self, rows: list[tuple[str, int]], epoch: int) -> dict[str, TraceUnit]:
        """The units of (unit id, rowid) rows, parsed once while their row stays the same: a unit
        rewritten (a window re-cut) gets a new rowid, so a kept parse of the old text is never
        served. Only the rows not kept are read (units are frozen: sharing them is safe), and what
        is read is kept if no change arrived since `epoch`."""
        out: dict[str, TraceUnit] = {}
        missing = []
        with self._parsed_lock:
            for uid, rowid in rows:
                unit = self._reads.unit_at(uid, rowid)
                if unit is not None:
                    out[uid] = unit
                else:
                    missing.append(rowid)
        for chunk in _chunks(missing, 500):
            parsed = [(rowid, uid, TraceUnit.model_validate_json(data)) for rowid, uid, data in self._conn().execute(
                f"SELECT rowid, unit_id, data FROM units WHERE rowid IN ({','.join('?' * len(chunk))})", chunk).fetchall()]
            with self._parsed_lock:
                keep = self._reads.epoch == epoch
                for rowid, uid, unit in parsed:
                    if keep:
                        self._reads.keep_unit(uid, rowid, unit)
                    out[uid] = unit
        return out

    def containing(self, tenant_id: str, turn_ids: list[str]) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        missing = []
        with self._parsed_lock:
            epoch = self._sync()
            for turn_id in dict.fromkeys(turn_ids):
                groups = self._reads.groups_of(turn_id)
                if groups is None:
                    missing.append(turn_id)
                else:
                    found = [g for g, tenant in groups if tenant == tenant_id]
                    if found:
                        out[turn_id] = found
        fetched: dict[str, tuple[tuple, list[tuple[str, str]]]] = {}
        for chunk in _chunks(missing, 500):
            for turn_id, unit_id, tenant, conversation, session in self._conn().execute(
                    f"SELECT m.turn_id, m.unit_id, m.tenant_id, u.conversation_id, u.session_id FROM unit_members m "
                    f"JOIN units u ON u.unit_id = m.unit_id WHERE m.turn_id IN ({','.join('?' * len(chunk))}) "
                    "ORDER BY m.turn_id, m.unit_id", chunk).fetchall():
                fetched.setdefault(turn_id, ((tenant, conversation, session), []))[1].append((unit_id, tenant))
        with self._parsed_lock:
            keep = self._reads.epoch == epoch
            for turn_id in missing:
                hit = fetched.get(turn_id)
                if hit is None:
                    continue
                if keep:
                    self._reads.keep_groups(turn_id, *hit)
                found = [g for g, tenant in hit[1] if tenant == tenant_id]
                if found:
                    out[turn_id] = found
        return {t: out[t] for t in sorted(out)}

    def units_by_keys(self, tenant_id: str, keys: list[int]) -> dict[int, TraceUnit]:
        out: dict[int, TraceUnit] = {}
        missing = []
        with self._parsed_lock:
            epoch = self._sync()
            for key in dict.fromkeys(int(k) for k in keys):
                unit = self._reads.unit_of_key(key)
                if unit is None:
                    missing.append(key)
                elif unit.provenance.tenant_id == tenant_id:
                    out[key] = unit
        for chunk in _chunks(missing, 500):
            rows = [r[:3] for r in self._conn().execute(
                f"SELECT k.unit_key, u.unit_id, u.rowid, u.tenant_id FROM unit_keys k JOIN units u ON u.unit_id = k.unit_id "
                f"WHERE k.unit_key IN ({','.join('?' * len(chunk))})", chunk).fetchall() if r[3] == tenant_id]
            units = self._parsed_rows([(uid, rowid) for _, uid, rowid in rows], epoch)
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
        with self._parsed_lock:
            epoch = self._sync()
            for conversation_id, session_id in dict.fromkeys(sessions):
                start = self._reads.start_of((tenant_id, conversation_id, session_id))
                if start is None:
                    by_conversation.setdefault(conversation_id, []).append(session_id)
                else:
                    out[(conversation_id, session_id)] = start
        fetched = {}
        for conversation_id, session_ids in by_conversation.items():
            for chunk in _chunks(session_ids, 400):
                for session_id, start in self._conn().execute(
                        f"SELECT session_id, MIN(occurred_at) FROM turns WHERE tenant_id=? AND conversation_id=? "
                        f"AND session_id IN ({','.join('?' * len(chunk))}) GROUP BY session_id",
                        (tenant_id, conversation_id, *chunk)).fetchall():
                    fetched[(conversation_id, session_id)] = datetime.fromisoformat(start)
        with self._parsed_lock:
            if self._reads.epoch == epoch:
                for (conversation_id, session_id), start in fetched.items():
                    self._reads.keep_start((tenant_id, conversation_id, session_id), start)
        out.update(fetched)
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
