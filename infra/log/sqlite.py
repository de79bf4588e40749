"""Embedded event log on SQLite (WAL): the single-machine twin of the Kafka adapter.

Why SQLite: durable (WAL + synchronous=FULL fsyncs every commit), safe with several processes
(file locks; appends take the write lock with BEGIN IMMEDIATE so offsets are assigned without
races), and in Python's standard library. Offsets are assigned per partition from a head
table inside the append transaction, so they are dense, monotonic and never reused.

SQLite calls are blocking, so each adapter owns one worker thread (and connection) for writes
and one for reads; the async methods hand work to them.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from infra.formats import LOG_FORMAT, stamp_user_version
from schemas.errors import LogError, TransientError
from schemas.ports.event_log import AppendFailed, Appended, LogRecord, NewRecord, place

_SCHEMA = """
CREATE TABLE IF NOT EXISTS topics (
    name TEXT PRIMARY KEY, partitions INTEGER NOT NULL, created_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS heads (
    topic TEXT NOT NULL, partition INTEGER NOT NULL, next_offset INTEGER NOT NULL,
    PRIMARY KEY (topic, partition)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS records (
    topic TEXT NOT NULL, partition INTEGER NOT NULL, offset INTEGER NOT NULL,
    key TEXT, value BLOB NOT NULL, headers TEXT, append_time REAL NOT NULL,
    PRIMARY KEY (topic, partition, offset)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS group_offsets (
    grp TEXT NOT NULL, topic TEXT NOT NULL, partition INTEGER NOT NULL,
    next_offset INTEGER NOT NULL, updated_at REAL NOT NULL,
    PRIMARY KEY (grp, topic, partition)) WITHOUT ROWID;
"""


def _connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, timeout=60.0, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("PRAGMA busy_timeout=60000")
    conn.execute("PRAGMA secure_delete=ON")  # erased records leave no bytes in the file (erase())
    return conn


def _encode_headers(headers: Sequence[tuple[str, bytes]]) -> str | None:
    return json.dumps([[k, v.hex()] for k, v in headers]) if headers else None


def _decode_headers(raw: str | None) -> tuple[tuple[str, bytes], ...]:
    return tuple((k, bytes.fromhex(v)) for k, v in json.loads(raw)) if raw else ()


class SqliteEventLog:
    backend = "sqlite"

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._writer: ThreadPoolExecutor | None = None
        self._reader: ThreadPoolExecutor | None = None
        self._local = threading.local()
        self._partitions: dict[str, int] = {}
        self._appended: asyncio.Event | None = None

    # -- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="log-writer")
        self._reader = ThreadPoolExecutor(1, thread_name_prefix="log-reader")
        self._appended = asyncio.Event()
        await self._write(lambda c: (stamp_user_version(c, self.path, LOG_FORMAT), c.executescript(_SCHEMA)))

    async def close(self) -> None:
        for pool in (self._writer, self._reader):
            if pool is not None:
                pool.submit(self._close_conn).result()
                pool.shutdown(wait=True)
        self._writer = self._reader = None

    def _close_conn(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = _connect(self.path)
        return conn

    async def _run(self, pool: ThreadPoolExecutor | None, fn: Callable[[sqlite3.Connection], Any]) -> Any:
        if pool is None:
            raise LogError("the event log is not started; call start() first")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(pool, lambda: fn(self._conn()))

    async def _write(self, fn: Callable[[sqlite3.Connection], Any]) -> Any:
        return await self._run(self._writer, fn)

    async def _read(self, fn: Callable[[sqlite3.Connection], Any]) -> Any:
        return await self._run(self._reader, fn)

    # -- topics --------------------------------------------------------------------------
    async def ensure_topic(self, topic: str, partitions: int, *, retention_seconds: float | None = None) -> int:
        """`retention_seconds` is accepted for the port's sake; the embedded log keeps nothing it
        is not told to (records of a topic with retention are erased by `erase_before`)."""
        if partitions < 1:
            raise LogError("a topic needs at least one partition")

        def create(c: sqlite3.Connection) -> int:
            c.execute("BEGIN IMMEDIATE")
            try:
                row = c.execute("SELECT partitions FROM topics WHERE name=?", (topic,)).fetchone()
                if row is None:
                    c.execute("INSERT INTO topics VALUES (?,?,?)", (topic, partitions, time.time()))
                    c.executemany("INSERT INTO heads VALUES (?,?,0)", [(topic, p) for p in range(partitions)])
                    n = partitions
                else:
                    n = row[0]
                c.execute("COMMIT")
                return n
            except BaseException:
                c.execute("ROLLBACK")
                raise

        n = await self._write(create)
        self._partitions[topic] = n
        return n

    async def partitions(self, topic: str) -> int:
        if topic not in self._partitions:
            row = await self._read(lambda c: c.execute("SELECT partitions FROM topics WHERE name=?", (topic,)).fetchone())
            if row is None:
                raise LogError(f"unknown topic {topic!r}: create it first (memstream creates its topics on start)")
            self._partitions[topic] = row[0]
        return self._partitions[topic]

    # -- append --------------------------------------------------------------------------
    async def append(self, topic: str, records: Sequence[NewRecord]) -> list[Appended]:
        if not records:
            return []
        placed = place(topic, records, await self.partitions(topic))

        def insert(c: sqlite3.Connection) -> list[Appended]:
            c.execute("BEGIN IMMEDIATE")
            try:
                heads = dict(c.execute("SELECT partition, next_offset FROM heads WHERE topic=?", (topic,)).fetchall())
                now = time.time()
                rows, out = [], []
                for p, r in placed:
                    off = heads[p]
                    heads[p] = off + 1
                    rows.append((topic, p, off, r.key, r.value, _encode_headers(r.headers), now))
                    out.append(Appended(topic, p, off, now))
                c.executemany("INSERT INTO records VALUES (?,?,?,?,?,?,?)", rows)
                c.executemany("UPDATE heads SET next_offset=? WHERE topic=? AND partition=?", [(o, topic, p) for p, o in heads.items()])
                c.execute("COMMIT")
                return out
            except BaseException:
                c.execute("ROLLBACK")
                raise

        try:
            out = await self._write(insert)
        except (sqlite3.Error, OSError) as exc:  # one transaction: nothing of it is in the log
            cause = TransientError(f"the embedded log {self.path} could not append ({exc}); nothing was appended; retry")
            raise AppendFailed([None] * len(records), cause) from exc
        if self._appended is not None:
            self._appended.set()
        return out

    # -- read ----------------------------------------------------------------------------
    async def read(self, topic: str, partition: int, offset: int, *, max_records: int = 500, max_wait: float = 0.0) -> list[LogRecord]:
        n = await self.partitions(topic)
        if not 0 <= partition < n:
            raise LogError(f"topic {topic!r} has partitions 0..{n - 1}, not {partition}")
        deadline = time.monotonic() + max_wait

        def fetch(c: sqlite3.Connection) -> list[LogRecord]:
            rows = c.execute(
                "SELECT offset, key, value, headers, append_time FROM records"
                " WHERE topic=? AND partition=? AND offset>=? ORDER BY offset LIMIT ?",
                (topic, partition, max(offset, 0), max_records),
            ).fetchall()
            return [LogRecord(topic, partition, o, k, bytes(v), t, _decode_headers(h)) for o, k, v, h, t in rows]

        while True:
            got = await self._read(fetch)
            remaining = deadline - time.monotonic()
            if got or remaining <= 0:
                return got
            # Woken early by appends from this process; other processes are seen by polling.
            assert self._appended is not None
            self._appended.clear()
            try:
                await asyncio.wait_for(self._appended.wait(), timeout=min(remaining, 0.05))
            except asyncio.TimeoutError:
                pass

    async def end_offsets(self, topic: str) -> dict[int, int]:
        await self.partitions(topic)
        rows = await self._read(lambda c: c.execute("SELECT partition, next_offset FROM heads WHERE topic=?", (topic,)).fetchall())
        return dict(rows)

    # -- erasure ---------------------------------------------------------------------------
    async def erase(self, topic: str, partition: int, offsets: list[int]) -> int:
        """Remove these records for good (plain records of forgotten turns: sealed ones need not
        be, their key is gone): deleted with secure_delete, then the WAL truncated, so their bytes
        are in no file. Offsets are never reused; readers see the gap. Kafka cannot do this — see
        docs/forgetting.md."""
        if not offsets:
            return 0

        def delete(c: sqlite3.Connection) -> int:
            n = 0
            for i in range(0, len(offsets), 500):
                chunk = offsets[i:i + 500]
                n += c.execute(f"DELETE FROM records WHERE topic=? AND partition=? AND offset IN ({','.join('?' * len(chunk))})",
                               (topic, partition, *chunk)).rowcount
            deadline = time.monotonic() + 30
            while c.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0] and time.monotonic() < deadline:
                time.sleep(0.05)  # a reader in another process holds the WAL for a moment
            return n

        return await self._write(delete)

    async def erase_before(self, topic: str, partition: int, offset: int) -> None:
        """Delete the partition's records below `offset` for good (secure_delete, WAL truncated)."""

        def delete(c: sqlite3.Connection) -> None:
            c.execute("DELETE FROM records WHERE topic=? AND partition=? AND offset<?", (topic, partition, offset))
            deadline = time.monotonic() + 30
            while c.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0] and time.monotonic() < deadline:
                time.sleep(0.05)

        await self._write(delete)

    # -- consumer groups -----------------------------------------------------------------
    async def commit(self, group: str, topic: str, offsets: Mapping[int, int]) -> None:
        await self.partitions(topic)
        now = time.time()
        rows = [(group, topic, p, o, now) for p, o in offsets.items()]

        def upsert(c: sqlite3.Connection) -> None:
            c.executemany(
                "INSERT INTO group_offsets VALUES (?,?,?,?,?) ON CONFLICT(grp, topic, partition)"
                " DO UPDATE SET next_offset=excluded.next_offset, updated_at=excluded.updated_at",
                rows,
            )

        await self._write(upsert)

    async def committed(self, group: str, topic: str) -> dict[int, int]:
        rows = await self._read(
            lambda c: c.execute("SELECT partition, next_offset FROM group_offsets WHERE grp=? AND topic=?", (group, topic)).fetchall()
        )
        return dict(rows)
