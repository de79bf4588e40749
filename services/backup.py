"""Backup and restore of an embedded deployment (`memstream backup DIR`, `memstream restore DIR`).

A backup is consistent while `memstream serve` runs: every SQLite file is copied with SQLite's
online backup API (a snapshot of one transaction), in an order that keeps the copies coherent
with each other —

1. the view catalog (which generation of each view is live);
2. each live view's store (its rows and its positions together): the views' positions are then
   at or behind the log copied next;
3. the event log (so every record a view copy has processed is in the log copy);
4. the data key store (so every record of the log copy has its key, unless it was forgotten).

The lexical view's tantivy index is not copied (its files change under a running writer): its
ledger keeps every document (`docs`), and a restore writes the index afresh from it. A backup
holds memory in the clear and live data keys: keep it as sensitive as the data itself.

A restore brings the backup back into the data directory — the directory it replaces is moved
aside, never deleted — and then **re-applies every forget recorded after the backup was taken**:
the tombstones (ids only) of the key store it replaces, and of any newer key store named with
`--forgets-from`, destroy those turns' keys in the restored key store (so their log records stay
unreadable) and are appended as `ForgetRequested` events, so every view forgets them when it
catches up. A forgotten turn never comes back from a backup.

The server mode is backed up with each engine's own tools (docs/reliability.md).
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from schemas.errors import ConfigurationError, MemstreamError
from schemas.ports.keystore import EventRef
from schemas.ports.views import VIEW_NAMES

FORMAT = 1
# What each embedded view keeps in its generation directory (the lexical index is rebuilt).
VIEW_FILES = {"hierarchy": "units.sqlite", "lexical": "ledger.sqlite", "dense": "vectors.sqlite", "graph": "graph.sqlite"}


class BackupError(MemstreamError):
    code = "backup_failed"


def _embedded_only(settings) -> None:
    urls = [settings.log.url, settings.keys.url, *(getattr(settings.views, f"{v}_url") for v in VIEW_NAMES)]
    if not all(u.split(":", 1)[0] in ("sqlite", "tantivy") for u in urls):
        raise ConfigurationError("memstream backup/restore cover the embedded mode; servers are backed up with each engine's own "
                                 "snapshot tools (docs/reliability.md)")


def _copy_sqlite(src: Path, dst: Path) -> None:
    """A consistent snapshot of a live SQLite database (its WAL included) into a new file."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    source = sqlite3.connect(f"file:{src}?mode=ro", uri=True, timeout=60)
    target = sqlite3.connect(dst)
    try:
        source.execute("PRAGMA busy_timeout=60000")
        source.backup(target)
    finally:
        target.close()
        source.close()


def _live_generations(catalog: Path) -> dict[str, int]:
    c = sqlite3.connect(catalog)
    try:
        return dict(c.execute("SELECT view, generation FROM generations WHERE state='live'").fetchall())
    finally:
        c.close()


def _end_offsets(log: Path) -> dict[str, dict[int, int]]:
    c = sqlite3.connect(log)
    try:
        out: dict[str, dict[int, int]] = defaultdict(dict)
        for topic, partition, offset in c.execute("SELECT topic, partition, next_offset FROM heads"):
            out[topic][partition] = offset
        return dict(out)
    finally:
        c.close()


def backup(settings, dest: Path, *, attempts: int = 3) -> dict:
    """Write a backup of the data directory into `dest` (new or empty); returns its manifest."""
    _embedded_only(settings)
    data = Path(settings.data_dir)
    if not (data / "log.sqlite").exists():
        raise BackupError(f"{data} holds no memstream log: nothing to back up (MEMSTREAM_DATA_DIR?)")
    if dest.exists() and any(dest.iterdir()):
        raise BackupError(f"{dest} is not empty: back up into a new directory")
    for attempt in range(attempts):
        work = dest.with_name(dest.name + ".partial")
        shutil.rmtree(work, ignore_errors=True)
        t0 = time.time()
        views: dict[str, dict] = {}
        if (data / "views" / "catalog.sqlite").exists():
            _copy_sqlite(data / "views" / "catalog.sqlite", work / "views" / "catalog.sqlite")
            live = _live_generations(work / "views" / "catalog.sqlite")
        else:
            live = {}
        try:
            for view, generation in sorted(live.items()):
                name = VIEW_FILES[view]
                rel = Path("views") / view / f"gen-{generation}" / name
                if not (data / rel).exists():
                    raise FileNotFoundError(rel)
                _copy_sqlite(data / rel, work / rel)
                views[view] = {"generation": generation, "file": str(rel)}
        except FileNotFoundError:  # a replay switched and dropped a generation meanwhile: again
            shutil.rmtree(work, ignore_errors=True)
            continue
        _copy_sqlite(data / "log.sqlite", work / "log.sqlite")
        if (data / "keys.sqlite").exists():
            _copy_sqlite(data / "keys.sqlite", work / "keys.sqlite")
        manifest = {"format": FORMAT, "kind": "memstream embedded backup", "created_at": datetime.now(timezone.utc).isoformat(),
                    "source": str(data.resolve()), "seconds": round(time.time() - t0, 3), "views": views,
                    "log_end_offsets": _end_offsets(work / "log.sqlite")}
        (work / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
        dest.parent.mkdir(parents=True, exist_ok=True)
        if dest.exists():
            dest.rmdir()
        os.replace(work, dest)
        return manifest
    raise BackupError(f"the views kept switching generation during {attempts} attempts (a replay running?): try again")


@dataclass
class Restored:
    manifest: dict
    replaced: Path | None
    forgets_reapplied: int = 0
    lexical_rebuilt: bool = True
    notes: list[str] = field(default_factory=list)


def _held_locks(data: Path) -> list[Path]:
    """Writer locks some process holds (a serve or process running on the directory)."""
    import fcntl

    held = []
    for lock in data.glob("views/*/gen-*/writer.lock"):
        fd = os.open(lock, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(fd, fcntl.LOCK_UN)
        except BlockingIOError:
            held.append(lock)
        finally:
            os.close(fd)
    return held


def _tombstones(keys_file: Path) -> list[EventRef]:
    from infra.keystore.sqlite import SqliteKeyStore

    store = SqliteKeyStore(keys_file)
    try:
        return [EventRef(r["tenant"], r["conversation"], r["event_id"]) for r in store.canonical_dump()["keys"] if r["destroyed"]]
    finally:
        store.close()


def _forget_sources(paths: list[Path]) -> list[Path]:
    out = []
    for p in paths:
        p = Path(p)
        candidate = p / "keys.sqlite" if p.is_dir() else p
        if not candidate.is_file():
            raise BackupError(f"--forgets-from {p}: no data key store there (a data directory, a backup, or a keys.sqlite)")
        out.append(candidate)
    return out


async def restore(settings, src: Path, *, forgets_from: list[Path] = ()) -> Restored:
    """Restore the backup in `src` into the data directory (module docstring)."""
    _embedded_only(settings)
    src = Path(src)
    try:
        manifest = json.loads((src / "manifest.json").read_text())
    except (OSError, ValueError):
        raise BackupError(f"{src} is not a memstream backup (no readable manifest.json)") from None
    if manifest.get("format") != FORMAT:
        raise BackupError(f"{src} is a backup of format {manifest.get('format')!r}; this memstream reads format {FORMAT}")
    data = Path(settings.data_dir)
    if data.exists() and _held_locks(data):
        raise BackupError(f"a memstream process is running on {data} (it holds a view's writer lock): stop serve/process/worker first")
    sources = _forget_sources([*forgets_from, *([data] if (data / "keys.sqlite").exists() else [])])
    forgotten: dict[str, EventRef] = {}
    for keys_file in sources:
        forgotten.update({e.key_id: e for e in _tombstones(keys_file)})
    replaced = None
    if data.exists() and any(data.iterdir()):
        replaced = data.with_name(f"{data.name}.replaced-{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}")
        os.replace(data, replaced)
    shutil.copytree(src, data, ignore=shutil.ignore_patterns("manifest.json"))
    result = Restored(manifest, replaced)

    lexical = manifest["views"].get("lexical")
    if lexical is not None:
        from infra.lexical.tantivy import TantivyLexicalIndex

        if not TantivyLexicalIndex.restore(data / Path(lexical["file"]).parent, lexical["generation"]):
            result.lexical_rebuilt = False
            result.notes.append("the lexical view's generation predates its docs table: run `memstream replay --projection lexical`")

    # Re-apply the forgets the backup does not know of: shred their keys, then tell the views.
    from infra.keystore.sqlite import SqliteKeyStore
    from schemas.events import ForgetScope
    from services.forget import forget_request
    from services.runtime import build_pipeline

    keystore = SqliteKeyStore(data / "keys.sqlite")
    try:
        already = keystore.destroyed(list(forgotten))
        missing = [e for k, e in sorted(forgotten.items()) if k not in already]
        keystore.destroy(missing, "restore")
    finally:
        keystore.close()
    if missing:
        pipeline = build_pipeline(settings, views=())
        await pipeline.start_log()
        try:
            events = [forget_request(e.tenant_id, ForgetScope(level="turn", conversation_id=e.conversation_id, event_id=e.event_id),
                                     reason="re-applied by memstream restore", requested_by="restore").model_dump(mode="json")
                      for e in missing]
            results = await pipeline.publisher().publish_items(events)
            failed = [r for r in results if r.status != "accepted"]
            if failed:
                raise BackupError(f"{len(failed)} forgets could not be re-applied ({failed[0].errors}); run the restore again")
        finally:
            await pipeline.close()
    result.forgets_reapplied = len(missing)
    return result
