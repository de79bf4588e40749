"""Embedded data key store on SQLite (`<data_dir>/keys.sqlite`).

Erasure at once: the connection runs with `secure_delete` (SQLite overwrites the freed content
with zeros) and every destroy ends with a WAL checkpoint in TRUNCATE mode (the write-ahead log,
which holds page images of the secrets, is emptied to zero bytes). So when `destroy` returns the
secret's bytes are in no file of the data directory. Tombstones stay in the same table with the
secret column emptied.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable

from infra.formats import KEYS_FORMAT, stamp_user_version
from schemas.errors import StoreError
from schemas.ports.keystore import DataKey, EventRef, Tombstone
from schemas.ports.views import Positions

_SCHEMA = """
CREATE TABLE IF NOT EXISTS keys (
    key_id TEXT PRIMARY KEY, tenant_id TEXT NOT NULL, conversation_id TEXT NOT NULL, event_id TEXT NOT NULL,
    secret BLOB, created_at REAL NOT NULL, destroyed_at REAL, forget_id TEXT) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS keys_tenant ON keys (tenant_id, key_id);
CREATE TABLE IF NOT EXISTS positions (partition INTEGER PRIMARY KEY, next_offset INTEGER NOT NULL);
"""


def _chunks(items: list, n: int = 500):
    for i in range(0, len(items), n):
        yield items[i:i + n]


class SqliteKeyStore:
    backend = "sqlite"
    erasure_deferred_seconds = 0.0

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._local = threading.local()
        self._lock = threading.Lock()  # one writer per process; SQLite's own lock across processes

    def start(self) -> None:
        self._conn()

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            try:
                conn = sqlite3.connect(self.path, timeout=60.0, isolation_level=None, check_same_thread=False)
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=FULL")
                conn.execute("PRAGMA secure_delete=ON")
                stamp_user_version(conn, self.path, KEYS_FORMAT)
                conn.executescript(_SCHEMA)
            except sqlite3.Error as exc:
                raise StoreError(f"cannot open the data key store {self.path}: {exc}") from exc
            self._local.conn = conn
        return conn

    # -- writes ------------------------------------------------------------------------------
    def put(self, keys: Iterable[DataKey]) -> dict[str, DataKey]:
        keys = list({k.key_id: k for k in keys}.values())
        if not keys:
            return {}
        now = time.time()
        with self._lock:
            c = self._conn()
            c.execute("BEGIN IMMEDIATE")
            try:
                c.executemany("INSERT OR IGNORE INTO keys (key_id, tenant_id, conversation_id, event_id, secret, created_at) VALUES (?,?,?,?,?,?)",
                              [(k.key_id, k.tenant_id, k.conversation_id, k.event_id, k.secret, now) for k in keys])
                c.execute("COMMIT")
            except BaseException:
                c.execute("ROLLBACK")
                raise
        return self.get([k.key_id for k in keys])

    def destroy(self, events: Iterable[EventRef], forget_id: str, *, positions: Positions | None = None) -> list[Tombstone]:
        refs = sorted({e.key_id: e for e in events}.items())
        now = time.time()
        out: list[Tombstone] = []
        with self._lock:
            c = self._conn()
            c.execute("BEGIN IMMEDIATE")
            try:
                for chunk in _chunks(refs):
                    marks = ",".join("?" * len(chunk))
                    done = {r[0] for r in c.execute(f"SELECT key_id FROM keys WHERE destroyed_at IS NOT NULL AND key_id IN ({marks})",
                                                    [k for k, _ in chunk])}
                    fresh = [(k, e) for k, e in chunk if k not in done]
                    c.executemany("INSERT INTO keys (key_id, tenant_id, conversation_id, event_id, secret, created_at, destroyed_at, forget_id)"
                                  " VALUES (?,?,?,?,NULL,?,?,?) ON CONFLICT(key_id) DO UPDATE SET secret=NULL,"
                                  " destroyed_at=excluded.destroyed_at, forget_id=excluded.forget_id",
                                  [(k, e.tenant_id, e.conversation_id, e.event_id, now, now, forget_id) for k, e in fresh])
                    out.extend(Tombstone(k, e.tenant_id, e.conversation_id, e.event_id, datetime.fromtimestamp(now, timezone.utc), forget_id)
                               for k, e in fresh)
                if positions:
                    c.executemany("INSERT INTO positions VALUES (?,?) ON CONFLICT(partition) DO UPDATE SET next_offset=excluded.next_offset",
                                  sorted(positions.items()))
                c.execute("COMMIT")
            except BaseException:
                c.execute("ROLLBACK")
                raise
            if out:
                self._truncate_wal(c)
        return out

    def _truncate_wal(self, c: sqlite3.Connection) -> None:
        """Empty the WAL: it holds page images of the destroyed secrets. A reader in another
        process can hold it back for a moment; the checkpoint is retried until it is complete."""
        deadline = time.monotonic() + 30
        while True:
            busy, _, _ = c.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            if not busy:
                return
            if time.monotonic() > deadline:
                raise StoreError(f"the data key store {self.path} could not truncate its write-ahead log for 30 s (a reader holds it); "
                                 "the destroyed keys are gone from the table but may remain in the -wal file until the next destroy")
            time.sleep(0.05)

    def write_positions(self, positions: Positions) -> None:
        with self._lock:
            self._conn().executemany("INSERT INTO positions VALUES (?,?) ON CONFLICT(partition) DO UPDATE SET next_offset=excluded.next_offset",
                                     sorted(positions.items()))

    # -- reads -------------------------------------------------------------------------------
    def get(self, key_ids: Iterable[str]) -> dict[str, DataKey]:
        ids = sorted(set(key_ids))
        out: dict[str, DataKey] = {}
        c = self._conn()
        for chunk in _chunks(ids):
            for r in c.execute(f"SELECT key_id, tenant_id, conversation_id, event_id, secret FROM keys WHERE destroyed_at IS NULL"
                               f" AND key_id IN ({','.join('?' * len(chunk))})", chunk):
                out[r[0]] = DataKey(r[0], r[1], r[2], r[3], bytes(r[4]))
        return out

    def destroyed(self, key_ids: Iterable[str]) -> dict[str, Tombstone]:
        ids = sorted(set(key_ids))
        out: dict[str, Tombstone] = {}
        c = self._conn()
        for chunk in _chunks(ids):
            for r in c.execute(f"SELECT key_id, tenant_id, conversation_id, event_id, destroyed_at, forget_id FROM keys WHERE destroyed_at IS NOT NULL"
                               f" AND key_id IN ({','.join('?' * len(chunk))})", chunk):
                out[r[0]] = Tombstone(r[0], r[1], r[2], r[3], datetime.fromtimestamp(r[4], timezone.utc), r[5])
        return out

    def positions(self) -> Positions:
        return dict(self._conn().execute("SELECT partition, next_offset FROM positions").fetchall())

    def tombstones(self, tenant_id: str, *, after: str | None = None, limit: int = 1000) -> list[Tombstone]:
        rows = self._conn().execute(
            "SELECT key_id, tenant_id, conversation_id, event_id, destroyed_at, forget_id FROM keys WHERE tenant_id=? AND destroyed_at IS NOT NULL"
            " AND key_id > ? ORDER BY key_id LIMIT ?", (tenant_id, after or "", limit)).fetchall()
        return [Tombstone(r[0], r[1], r[2], r[3], datetime.fromtimestamp(r[4], timezone.utc), r[5]) for r in rows]

    def canonical_dump(self) -> dict:
        rows = self._conn().execute("SELECT key_id, tenant_id, conversation_id, event_id, destroyed_at IS NOT NULL FROM keys ORDER BY key_id").fetchall()
        return {"keys": [{"key_id": r[0], "tenant": r[1], "conversation": r[2], "event_id": r[3], "destroyed": bool(r[4])} for r in rows]}
