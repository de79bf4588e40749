"""Format versions of the embedded data directory's files.

Every SQLite file memstream writes records the format it was written in: the log, the data key
store and the view catalog in SQLite's `PRAGMA user_version`, each view generation in its `meta`
table (key `format`). On open:

- no version recorded: the file was written by a release before format versions (format 1); it
  is migrated in place where needed and stamped with the current format;
- a version newer than this release knows: refused with a message naming the file (a newer
  release wrote it; opening it here could misread it), never rewritten;
- a view older than this release still reads (`min_format`): views are derived data, so the
  pipeline rebuilds the view from the log into a new generation and says so (streams/pipeline.py).
  The log, the keys and the catalog are the record and are never rebuilt: their old formats stay
  readable.

Servers (Kafka, OpenSearch, Qdrant, Neo4j) keep their own formats; memstream's documents there
carry their schema in each record.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from schemas.errors import FormatTooNew, FormatTooOld

__all__ = ["FormatTooNew", "FormatTooOld", "too_new", "stamp_user_version"]

LOG_FORMAT = 1
KEYS_FORMAT = 1
CATALOG_FORMAT = 1


def too_new(path: Path, found: int, known: int) -> FormatTooNew:
    return FormatTooNew(f"{path} was written by a newer memstream (format {found}; this release reads formats up to {known}): "
                        f"run that release, or move the data directory aside and restore from a backup")


def stamp_user_version(conn: sqlite3.Connection, path: Path, current: int) -> int:
    """Check and record the format of a record file (log, keys, catalog); returns the format found
    (1 for a file written before format versions, `current` for a new one)."""
    found = conn.execute("PRAGMA user_version").fetchone()[0]
    if found > current:
        raise too_new(path, found, current)
    if found < current:
        conn.execute(f"PRAGMA user_version={int(current)}")  # a pragma takes no parameter; `current` is ours
    return found or (1 if _has_tables(conn) else current)


def _has_tables(conn: sqlite3.Connection) -> bool:
    return conn.execute("SELECT COUNT(*) FROM sqlite_master WHERE type='table'").fetchone()[0] > 0
