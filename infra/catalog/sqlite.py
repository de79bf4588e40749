"""Embedded view catalog: which generation of each view is live, in a small SQLite file.

Replay builds generation N+1 next to the live generation N; `activate` flips the live pointer
in one transaction, so a reader sees either the old or the new generation, never a mix.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from infra.formats import CATALOG_FORMAT, stamp_user_version
from schemas.ports.views import ViewName

_SCHEMA = """
CREATE TABLE IF NOT EXISTS generations (
    view TEXT NOT NULL, generation INTEGER NOT NULL, state TEXT NOT NULL,
    created_at REAL NOT NULL, activated_at REAL, PRIMARY KEY (view, generation));
"""


class SqliteViewCatalog:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        with self._connect() as c:
            stamp_user_version(c, self.path, CATALOG_FORMAT)
            c.executescript(_SCHEMA)
            if "model" not in {r[1] for r in c.execute("PRAGMA table_info(generations)")}:  # added in place to older catalogs
                c.execute("ALTER TABLE generations ADD COLUMN model TEXT")

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        c = sqlite3.connect(self.path, timeout=60.0, isolation_level=None)
        try:
            c.execute("PRAGMA journal_mode=WAL")
            c.execute("PRAGMA busy_timeout=60000")
            yield c
        finally:
            c.close()

    def current(self, view: ViewName) -> int | None:
        # Read on every query path (LiveViews re-checks every 0.2 s): a kept connection per thread
        # saves opening the file and setting WAL each time (~0.3 ms). In autocommit mode each
        # SELECT is its own read transaction, so it sees the latest activation.
        c = getattr(self._local, "conn", None)
        if c is None:
            c = self._local.conn = sqlite3.connect(self.path, timeout=60.0, isolation_level=None)
            c.execute("PRAGMA busy_timeout=60000")
        row = c.execute("SELECT generation FROM generations WHERE view=? AND state='live'", (view,)).fetchone()
        return row[0] if row else None

    def new_generation(self, view: ViewName, model: str | None = None) -> int:
        with self._connect() as c:
            c.execute("BEGIN IMMEDIATE")
            n = c.execute("SELECT COALESCE(MAX(generation), 0) + 1 FROM generations WHERE view=?", (view,)).fetchone()[0]
            c.execute("INSERT INTO generations (view, generation, state, created_at, activated_at, model) VALUES (?,?,'building',?,NULL,?)",
                      (view, n, time.time(), model))
            c.execute("COMMIT")
        return n

    def model(self, view: ViewName, generation: int) -> str | None:
        with self._connect() as c:
            row = c.execute("SELECT model FROM generations WHERE view=? AND generation=?", (view, generation)).fetchone()
        return row[0] if row else None

    def activate(self, view: ViewName, generation: int) -> None:
        with self._connect() as c:
            c.execute("BEGIN IMMEDIATE")
            c.execute("UPDATE generations SET state='retired' WHERE view=? AND state='live'", (view,))
            c.execute("UPDATE generations SET state='live', activated_at=? WHERE view=? AND generation=?", (time.time(), view, generation))
            c.execute("COMMIT")

    def building(self, view: ViewName) -> list[int]:
        with self._connect() as c:
            return [r[0] for r in c.execute("SELECT generation FROM generations WHERE view=? AND state='building' ORDER BY generation", (view,))]

    def retired(self, view: ViewName) -> list[int]:
        with self._connect() as c:
            return [r[0] for r in c.execute("SELECT generation FROM generations WHERE view=? AND state='retired' ORDER BY generation", (view,))]

    def drop(self, view: ViewName, generation: int) -> None:
        with self._connect() as c:
            c.execute("UPDATE generations SET state='dropped' WHERE view=? AND generation=? AND state!='live'", (view, generation))
