"""What the embedded hierarchy view keeps in memory for the bounded query path's reads, and how
it follows the writes.

A bounded question reads a few hundred units by key and id, the windows and episodes that hold
its candidate turns, and their sessions' first times. Read with SQL on every question, that is a
sixth of a question's time on a long conversation; kept here, it is dictionary lookups.

Every write to the units or to the ledger's turns leaves a row in the store's `unit_changes`
table (triggers, in the write's own transaction), so writes made by another process are seen too.
Before each read the store hands the rows written since its last read to `changed`: a changed
unit's parse and key go, and so does everything kept for its session (the groups holding the
session's turns, the session's first time) — a session's windows and episodes hold that
session's turns only (streams/segmentation.py). What a read fetches is kept only if no change
arrived while it was fetching (`epoch`), so a stale row is never kept past the change that
replaced it.

Bounded by counts (`max_units` parsed units, `max_turns` turns' groups); least recently used go
first. Nothing here is written to a file: a forget's deletes leave change rows that drop it.
"""

from __future__ import annotations

from collections import OrderedDict
from datetime import datetime
from typing import Iterable

from schemas.units import TraceUnit, unit_key

SessionKey = tuple[str, str, str]  # (tenant, conversation, session)
ChangeRow = tuple  # (seq, unit or turn id, tenant, conversation, session)


class UnitReads:
    def __init__(self, max_units: int, max_turns: int, max_sessions: int = 100_000) -> None:
        self.max_units, self.max_turns, self.max_sessions = max_units, max_turns, max_sessions
        self.epoch = 0  # the last change applied (the store's unit_changes seq)
        # unit id -> (rowid, parsed unit, tenant)
        self._units: OrderedDict[str, tuple[int, TraceUnit, str]] = OrderedDict()
        self._keys: dict[int, str] = {}  # unit_key -> unit id, for the units kept
        # turn -> (its session, [(window or episode id, tenant)])
        self._groups: OrderedDict[str, tuple[SessionKey, list[tuple[str, str]]]] = OrderedDict()
        self._session_turns: dict[SessionKey, set[str]] = {}
        self._starts: dict[SessionKey, datetime] = {}

    # -- following the writes --------------------------------------------------------------
    def changed(self, rows: Iterable[ChangeRow]) -> None:
        for seq, uid, tenant, conversation, session in rows:
            self._drop_unit(uid)
            key = (tenant, conversation, session)
            for turn in self._session_turns.pop(key, ()):
                self._groups.pop(turn, None)
            self._starts.pop(key, None)
            self.epoch = seq

    def restart(self, epoch: int) -> None:
        """Forget everything (the change rows this reader had not seen were pruned)."""
        self._units.clear()
        self._keys.clear()
        self._groups.clear()
        self._session_turns.clear()
        self._starts.clear()
        self.epoch = epoch

    # -- units by id and key ---------------------------------------------------------------
    def unit(self, unit_id: str) -> TraceUnit | None:
        hit = self._units.get(unit_id)
        if hit is None:
            return None
        self._units.move_to_end(unit_id)
        return hit[1]

    def units_of(self, unit_ids: Iterable[str], tenant_id: str) -> tuple[dict[str, TraceUnit], list[str]]:
        """The kept units of `tenant_id` among `unit_ids`, and the ids not kept."""
        kept, touch = self._units.get, self._units.move_to_end
        out: dict[str, TraceUnit] = {}
        missing = []
        for uid in unit_ids:
            hit = kept(uid)
            if hit is None:
                missing.append(uid)
                continue
            touch(uid)
            if hit[2] == tenant_id:
                out[uid] = hit[1]
        return out, missing

    def unit_at(self, unit_id: str, rowid: int) -> TraceUnit | None:
        """The unit kept for `unit_id` if it was parsed from the row `rowid` (a rewritten unit gets
        a new rowid)."""
        hit = self._units.get(unit_id)
        if hit is None or hit[0] != rowid:
            return None
        self._units.move_to_end(unit_id)
        return hit[1]

    def unit_of_key(self, key: int) -> TraceUnit | None:
        uid = self._keys.get(key)
        return None if uid is None else self.unit(uid)

    def keep_unit(self, unit_id: str, rowid: int, unit: TraceUnit) -> None:
        self._units[unit_id] = (rowid, unit, unit.provenance.tenant_id)
        self._units.move_to_end(unit_id)
        self._keys[unit_key(unit_id)] = unit_id
        while len(self._units) > self.max_units:
            old, _ = self._units.popitem(last=False)
            self._keys.pop(unit_key(old), None)

    def _drop_unit(self, unit_id: str) -> None:
        if self._units.pop(unit_id, None) is not None:
            self._keys.pop(unit_key(unit_id), None)

    # -- the windows and episodes holding a turn ---------------------------------------------
    def groups_of(self, turn_id: str) -> list[tuple[str, str]] | None:
        """(group id, tenant) of every window and episode holding the turn, or None if not kept."""
        hit = self._groups.get(turn_id)
        if hit is None:
            return None
        self._groups.move_to_end(turn_id)
        return hit[1]

    def keep_groups(self, turn_id: str, session: SessionKey, groups: list[tuple[str, str]]) -> None:
        self._groups[turn_id] = (session, groups)
        self._session_turns.setdefault(session, set()).add(turn_id)
        while len(self._groups) > self.max_turns:
            old, (where, _) = self._groups.popitem(last=False)
            turns = self._session_turns.get(where)
            if turns is not None:
                turns.discard(old)
                if not turns:
                    del self._session_turns[where]

    # -- sessions' first times ---------------------------------------------------------------
    def start_of(self, session: SessionKey) -> datetime | None:
        return self._starts.get(session)

    def keep_start(self, session: SessionKey, start: datetime) -> None:
        if len(self._starts) >= self.max_sessions:
            self._starts.clear()
        self._starts[session] = start

    def contents(self) -> dict:
        """What is kept, for the contract suite to compare with what the tables say."""
        return {
            "units": {uid: unit.model_dump_json() for uid, (_, unit, _) in self._units.items()},
            "keys": dict(self._keys),
            "groups": {t: (s, list(g)) for t, (s, g) in self._groups.items()},
            "starts": dict(self._starts),
        }
