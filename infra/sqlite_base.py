"""Shared plumbing of the embedded (SQLite) view stores: connections, the turn ledger,
positions, per-conversation versions (for query-side caches) and forget scopes.

Not an adapter itself; `infra/units/sqlite.py`, `infra/vectors/sqlite.py`,
`infra/graph/sqlite.py` and the tantivy lexical index (which keeps its ledger and positions
here) build on it. Every change set is applied in one SQLite transaction together with the
positions, so a view and its position can never disagree.

Erasure at once. Every connection runs with `secure_delete` (SQLite overwrites deleted rows,
freed pages and overflow chains with zeros), and a change set that forgets or deletes turns
ends with a WAL checkpoint in TRUNCATE mode, retried while a reader holds the log back: the
write-ahead log holds page images from before the delete, and truncating it to zero bytes
removes them. So when `apply` returns, a forgotten turn's text is in no file of the store.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Iterable, Iterator

from infra.formats import FormatTooOld, too_new
from schemas import faults
from schemas.errors import StoreError, TransientError
from schemas.ordering import order_turns
from schemas.ports.views import Boundary, ChangeSet, Forget, Positions, TurnRow, ViewName, once_per_request

_LEDGER_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS positions (partition INTEGER PRIMARY KEY, next_offset INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS conv_versions (
    tenant_id TEXT NOT NULL, conversation_id TEXT NOT NULL, version INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, conversation_id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS turns (
    turn_id TEXT PRIMARY KEY, tenant_id TEXT NOT NULL, conversation_id TEXT NOT NULL,
    session_id TEXT NOT NULL, event_id TEXT NOT NULL, agent_id TEXT NOT NULL, speaker TEXT NOT NULL,
    role TEXT NOT NULL, turn_index INTEGER NOT NULL, occurred_at TEXT NOT NULL, text TEXT NOT NULL,
    source_ref TEXT, partition INTEGER NOT NULL, offset INTEGER NOT NULL, content_hash TEXT NOT NULL, supersedes TEXT);
CREATE INDEX IF NOT EXISTS turns_session ON turns (tenant_id, conversation_id, session_id);
CREATE UNIQUE INDEX IF NOT EXISTS turns_event ON turns (tenant_id, conversation_id, event_id);
"""

_TURN_COLS = (
    "turn_id, tenant_id, conversation_id, session_id, event_id, agent_id, speaker, role, turn_index,"
    " occurred_at, text, source_ref, partition, offset, content_hash, supersedes"
)
_N_TURN_COLS = _TURN_COLS.count(",") + 1


def from_micros(us: int) -> datetime:
    return datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(microseconds=us)


def utc_iso(t: datetime) -> str:
    """How the ledger stores a time: ISO 8601 in UTC (a naive time is taken as UTC). For UTC
    times in the events' range these strings sort as the times do ('+' sorts before '.', so a
    whole second precedes its fractions), which lets `occurred_before` be a string comparison."""
    return (t.replace(tzinfo=timezone.utc) if t.tzinfo is None else t.astimezone(timezone.utc)).isoformat()


def row_to_turn(r: tuple) -> TurnRow:
    return TurnRow(
        turn_id=r[0], tenant_id=r[1], conversation_id=r[2], session_id=r[3], event_id=r[4], agent_id=r[5],
        speaker=r[6], role=r[7], turn_index=r[8], occurred_at=datetime.fromisoformat(r[9]), text=r[10],
        source_ref=r[11], partition=r[12], offset=r[13], content_hash=r[14], supersedes=r[15],
    )


def turn_to_row(t: TurnRow) -> tuple:
    return (
        t.turn_id, t.tenant_id, t.conversation_id, t.session_id, t.event_id, t.agent_id, t.speaker, t.role,
        t.turn_index, utc_iso(t.occurred_at), t.text, t.source_ref, t.partition, t.offset, t.content_hash, t.supersedes,
    )


def forget_where(forget: Forget, prefix: str = "") -> tuple[str, list]:
    """SQL condition over the ledger's columns for the turns a forget scope covers — the rule of
    `ForgetScope.covers`. A scope that is not partial (tenant, conversation, session, without
    `occurred_before`) needs only tenant_id/conversation_id/session_id, so view tables that
    carry those columns take the same condition; partial scopes reach view rows through the
    ledger's turn ids instead (`turns_in_scope`)."""
    s = forget.scope
    cond, args = [f"{prefix}tenant_id=?"], [forget.tenant_id]
    if s.level in ("conversation", "session", "turn"):
        cond.append(f"{prefix}conversation_id=?")
        args.append(s.conversation_id)
    if s.level == "session":
        cond.append(f"{prefix}session_id=?")
        args.append(s.session_id)
    if s.level == "turn":
        cond.append(f"{prefix}event_id=?")
        args.append(s.event_id)
    if s.level == "agent":
        cond.append(f"{prefix}agent_id=?")
        args.append(s.agent_id)
    if s.occurred_before is not None:
        cond.append(f"{prefix}occurred_at<?")
        args.append(utc_iso(s.occurred_before))
    return " AND ".join(cond), args


def erases(change: ChangeSet) -> bool:
    """Whether a change set removes turn data (a forget or turn deletions), after which the
    store erases physically. Re-segmentation deletes (a window or episode re-cut) remove no
    text that is not kept elsewhere, so they do not pay for it."""
    return bool(change.forgets or change.delete_turns)


def boundary_where(b: Boundary, prefix: str = "") -> tuple[str, list]:
    """SQL condition for the tenant/conversation/session parts of a boundary. Agent and time
    filters are applied by the caller on the rows (they depend on the unit kind)."""
    cond, args = [f"{prefix}tenant_id=?"], [b.tenant_id]
    if b.conversation_ids is not None:
        cond.append(f"{prefix}conversation_id IN ({','.join('?' * len(b.conversation_ids))})")
        args.extend(b.conversation_ids)
    if b.session_ids is not None:
        cond.append(f"{prefix}session_id IN ({','.join('?' * len(b.session_ids))})")
        args.extend(b.session_ids)
    return " AND ".join(cond), args


class SqliteViewBase:
    """Base for one generation of one embedded view, stored in one SQLite file."""

    backend = "sqlite"
    remote = False
    view: ViewName
    extra_schema = ""

    def __init__(self, path: str | Path, generation: int):
        self.path = Path(path)
        self.generation = generation
        self._local = threading.local()
        self._lock = threading.RLock()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        found = self._format_found()
        # executescript commits implicitly, so the schema is created outside a transaction.
        self._conn().executescript(_LEDGER_SCHEMA + self.extra_schema)
        if found < self.format_version:
            self._migrate()
        self._conn().execute("CREATE INDEX IF NOT EXISTS turns_supersedes ON turns (tenant_id, conversation_id, supersedes) "
                             "WHERE supersedes IS NOT NULL")
        stamped = self._conn().execute("SELECT value FROM meta WHERE key='format'").fetchone()
        if stamped is None or stamped[0] != str(self.format_version):  # a new or migrated file (readers write nothing)
            with self._tx() as c:
                c.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('format', ?)", (str(self.format_version),))
        self.format_found = found

    # Format of this store's file (infra/formats.py). 1: before format versions; 2: the ledger keeps
    # `supersedes` (migrated in place). Raise `min_format_version` when a change cannot be migrated:
    # older generations are then rebuilt from the log.
    format_version = 2
    min_format_version = 1

    def _format_found(self) -> int:
        """The format the file was written in (the current one for a new file); refuses formats
        this release cannot read (too new: FormatTooNew; older than it reads: FormatTooOld)."""
        c = self._conn()
        tables = {r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if "turns" not in tables:
            return self.format_version  # a new generation
        row = c.execute("SELECT value FROM meta WHERE key='format'").fetchone() if "meta" in tables else None
        found = int(row[0]) if row else 1
        if found > self.format_version:
            raise too_new(self.path, found, self.format_version)
        if found < self.min_format_version:
            raise FormatTooOld(f"{self.path} holds the {self.view} view in format {found}; this release reads formats "
                               f"{self.min_format_version} to {self.format_version}")
        return found

    def _migrate(self) -> None:
        """Columns added since a store's file was made (its rows keep NULL there)."""
        c = self._conn()
        if "supersedes" not in {r[1] for r in c.execute("PRAGMA table_info(turns)")}:
            c.execute("ALTER TABLE turns ADD COLUMN supersedes TEXT")

    # -- connections & transactions ------------------------------------------------------
    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=60.0, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")  # WAL+NORMAL: durable at checkpoints; views are rebuildable from the log
            conn.execute("PRAGMA busy_timeout=60000")
            conn.execute("PRAGMA secure_delete=ON")  # deleted content is overwritten with zeros (module docstring)
            # A row that INSERT OR REPLACE replaces fires its delete triggers too: the tables the
            # stores maintain with triggers (members, degrees, counts) then follow replacements.
            conn.execute("PRAGMA recursive_triggers=ON")
            self._local.conn = conn
        return conn

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        c = self._conn()
        c.execute("BEGIN IMMEDIATE")
        try:
            yield c
        except BaseException:
            c.execute("ROLLBACK")
            raise
        else:
            c.execute("COMMIT")

    @contextmanager
    def _change_tx(self, change: ChangeSet) -> Iterator[sqlite3.Connection]:
        """The transaction of one change set; when it forgets or deletes turns, the WAL is
        truncated after the commit (module docstring)."""
        with self._lock:
            with self._tx() as c:
                yield c
            if erases(change):
                self._truncate_wal(c)

    def _truncate_wal(self, c: sqlite3.Connection, timeout: float = 30.0) -> None:
        """Checkpoint the WAL into the database and truncate it to zero bytes. A reader (in any
        process) in the middle of a read transaction holds frames back; the checkpoint is
        retried until it completes. If it cannot for `timeout` seconds, the change set is
        committed but its erasure is not: TransientError, so the runner retries the step
        (re-applying it is harmless) and the checkpoint with it."""
        deadline = time.monotonic() + timeout
        while True:
            busy, _, _ = c.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            if not busy:
                return
            if time.monotonic() > deadline:
                raise TransientError(f"the {self.view} view {self.path} could not truncate its write-ahead log for {timeout:.0f} s "
                                     "(a reader holds it): the forget is applied but its deleted text may remain in the -wal file; "
                                     "the step is retried")
            time.sleep(0.02)

    # -- erasure (schemas/ports/views.py) ------------------------------------------------
    erasure_deferred_seconds = 0.0

    def erase_pending(self) -> float | None:
        """Nothing is ever pending: erasure happens in `apply`."""
        return None

    def erase_due(self) -> float | None:
        return None

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    # -- positions & versions ------------------------------------------------------------
    def positions(self) -> Positions:
        return dict(self._conn().execute("SELECT partition, next_offset FROM positions").fetchall())

    @once_per_request
    def conversation_version(self, tenant_id: str, conversation_id: str | None) -> int:
        if conversation_id is None:
            row = self._conn().execute("SELECT COALESCE(SUM(version), 0) FROM conv_versions WHERE tenant_id=?", (tenant_id,)).fetchone()
        else:
            row = self._conn().execute(
                "SELECT version FROM conv_versions WHERE tenant_id=? AND conversation_id=?", (tenant_id, conversation_id)
            ).fetchone()
        return int(row[0]) if row else 0

    def known_tenant(self, tenant_id: str) -> bool:
        return self._conn().execute("SELECT 1 FROM turns WHERE tenant_id=? LIMIT 1", (tenant_id,)).fetchone() is not None

    def _write_positions(self, c: sqlite3.Connection, positions: Positions) -> None:
        faults.hit("view-written")  # crash tests (schemas/faults.py): the view's rows written, the positions not
        c.executemany(
            "INSERT INTO positions VALUES (?,?) ON CONFLICT(partition) DO UPDATE SET next_offset=excluded.next_offset",
            list(positions.items()),
        )

    def _bump(self, c: sqlite3.Connection, conversations: Iterable[tuple[str, str]]) -> None:
        c.executemany(
            "INSERT INTO conv_versions VALUES (?,?,1) ON CONFLICT(tenant_id, conversation_id) DO UPDATE SET version=version+1",
            sorted(set(conversations)),
        )

    # -- ledger --------------------------------------------------------------------------
    def find_turns(self, tenant_id: str, conversation_id: str, event_ids: list[str]) -> dict[str, TurnRow]:
        out: dict[str, TurnRow] = {}
        for chunk in _chunks(event_ids, 500):
            rows = self._conn().execute(
                f"SELECT {_TURN_COLS} FROM turns WHERE tenant_id=? AND conversation_id=? AND event_id IN ({','.join('?' * len(chunk))})",
                (tenant_id, conversation_id, *chunk),
            ).fetchall()
            out.update({r[4]: row_to_turn(r) for r in rows})
        return out

    def session_turns(self, tenant_id: str, conversation_id: str, session_id: str) -> list[TurnRow]:
        rows = self._conn().execute(
            f"SELECT {_TURN_COLS} FROM turns WHERE tenant_id=? AND conversation_id=? AND session_id=?",
            (tenant_id, conversation_id, session_id),
        ).fetchall()
        return order_turns(row_to_turn(r) for r in rows)

    def turns_in_scope(self, forget: Forget) -> list[TurnRow]:
        where, args = forget_where(forget)
        rows = self._conn().execute(f"SELECT {_TURN_COLS} FROM turns WHERE {where} ORDER BY turn_id", args).fetchall()
        return [row_to_turn(r) for r in rows]

    def turns_in_boundary(self, boundary: Boundary) -> list[TurnRow]:
        where, args = boundary_where(boundary)
        rows = self._conn().execute(f"SELECT {_TURN_COLS} FROM turns WHERE {where}", args).fetchall()
        return [row_to_turn(r) for r in rows]

    # -- turns as the API lists them (schemas/ports/unit_store.py) ------------------------------
    _SUPERSEDED = ("EXISTS (SELECT 1 FROM turns c WHERE c.tenant_id=t.tenant_id AND c.conversation_id=t.conversation_id "
                   "AND c.supersedes=t.event_id AND c.event_id<>t.event_id)")

    def superseded(self, boundary: Boundary) -> set[str]:
        # From the corrections (few; the partial index turns_supersedes) to the turns they replace
        # (the unique index turns_event), not a correlated EXISTS per turn of the boundary: that
        # cost grew with the boundary on every corpus rebuild (a fifth of a query under writes).
        where, args = boundary_where(boundary, "c.")
        rows = self._conn().execute(
            "SELECT t.turn_id FROM turns c INDEXED BY turns_supersedes JOIN turns t ON t.tenant_id=c.tenant_id AND t.conversation_id=c.conversation_id "
            f"AND t.event_id=c.supersedes WHERE c.supersedes IS NOT NULL AND c.event_id<>t.event_id AND {where}", args).fetchall()
        return {r[0] for r in rows}

    def page_turns(self, boundary: Boundary, after: tuple[int, str] | None, limit: int, *,
                   include_superseded: bool = False) -> list[TurnRow]:
        where, args = boundary_where(boundary, "t.")
        if boundary.agent_ids is not None:
            where += f" AND t.agent_id IN ({','.join('?' * len(boundary.agent_ids))})"
            args.extend(boundary.agent_ids)
        if not include_superseded:
            where += f" AND NOT {self._SUPERSEDED}"
        if after is not None:
            where += " AND (t.occurred_at > ? OR (t.occurred_at = ? AND t.turn_id > ?))"
            at = utc_iso(from_micros(after[0]))
            args.extend([at, at, after[1]])
        cols = ", ".join(f"t.{c.strip()}" for c in _TURN_COLS.split(","))
        rows = self._conn().execute(f"SELECT {cols} FROM turns t WHERE {where} ORDER BY t.occurred_at, t.turn_id LIMIT ?",
                                    [*args, limit]).fetchall()
        return [row_to_turn(r) for r in rows]

    def turns_by_event(self, tenant_id: str, event_id: str, conversation_id: str | None = None) -> list[TurnRow]:
        where, args = "tenant_id=? AND event_id=?", [tenant_id, event_id]
        if conversation_id is not None:
            where += " AND conversation_id=?"
            args.append(conversation_id)
        rows = self._conn().execute(f"SELECT {_TURN_COLS} FROM turns WHERE {where} ORDER BY conversation_id", args).fetchall()
        return [row_to_turn(r) for r in rows]

    def corrections(self, tenant_id: str, conversation_id: str, event_id: str) -> list[TurnRow]:
        rows = self._conn().execute(f"SELECT {_TURN_COLS} FROM turns WHERE tenant_id=? AND conversation_id=? AND supersedes=? "
                                    "AND event_id<>?", (tenant_id, conversation_id, event_id, event_id)).fetchall()
        return order_turns(row_to_turn(r) for r in rows)

    def _apply_ledger(self, c: sqlite3.Connection, change: ChangeSet) -> set[tuple[str, str]]:
        """Apply forgets, turn deletions and turn puts; return the conversations touched."""
        touched: set[tuple[str, str]] = set()
        for forget in change.forgets:
            touched.update(self._forget(c, forget))
        if change.delete_turns:
            for chunk in _chunks(change.delete_turns, 500):
                q = ",".join("?" * len(chunk))
                touched.update(c.execute(f"SELECT DISTINCT tenant_id, conversation_id FROM turns WHERE turn_id IN ({q})", chunk).fetchall())
                c.execute(f"DELETE FROM turns WHERE turn_id IN ({q})", chunk)
        if change.put_turns:
            c.executemany(f"INSERT OR REPLACE INTO turns ({_TURN_COLS}) VALUES ({','.join('?' * _N_TURN_COLS)})", [turn_to_row(t) for t in change.put_turns])
            touched.update((t.tenant_id, t.conversation_id) for t in change.put_turns)
        return touched

    def _forget(self, c: sqlite3.Connection, forget: Forget) -> set[tuple[str, str]]:
        """Delete the scope's turns from the ledger. Subclasses delete their own rows too."""
        where, args = forget_where(forget)
        touched = set(c.execute(f"SELECT DISTINCT tenant_id, conversation_id FROM turns WHERE {where}", args).fetchall())
        c.execute(f"DELETE FROM turns WHERE {where}", args)
        return touched

    def ledger_dump(self) -> list[dict]:
        """The shape of infra/turn_docs.py's ledger_dump: ids, positions and the content hash,
        not the text (stores that keep it sealed, or not at all, dump the same)."""
        rows = self._conn().execute(f"SELECT {_TURN_COLS} FROM turns ORDER BY turn_id").fetchall()
        return [
            {"turn_id": r[0], "tenant": r[1], "conversation": r[2], "session": r[3], "event_id": r[4],
             "partition": r[12], "offset": r[13], "hash": r[14]}
            for r in rows
        ]


def _chunks(items: list, size: int) -> Iterator[list]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


def require(cond: bool, message: str) -> None:
    if not cond:
        raise StoreError(message)
