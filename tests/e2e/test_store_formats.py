"""Store format versions (infra/formats.py) on a real embedded data directory: a directory written
before format versions (the previous release: no version recorded, no `supersedes` column) opens,
is migrated in place and stamped, and holds the same views; a file from a newer release is refused
with a message naming it and is left as it was; a view generation in a format this release no
longer reads is rebuilt from the log automatically, with a message, into views equal to the
originals, and the unreadable generation's files are gone."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from schemas.errors import FormatTooNew
from schemas.ports.views import VIEW_NAMES
from infra.graph.sqlite import SqliteGraphStore
from infra.sqlite_base import SqliteViewBase
from infra.units.sqlite import SqliteUnitStore
from infra.vectors.sqlite import SqliteVectorStore
from tests.e2e.helpers import assert_same_views, dumps, make_pipeline, publish, sample_items

pytestmark = pytest.mark.e2e


# The format each embedded view's generation is stamped with by this release (the lexical view's
# SQLite file is tantivy's ledger, a plain view base).
FORMATS = {"hierarchy": SqliteUnitStore.format_version, "graph": SqliteGraphStore.format_version,
           "dense": SqliteVectorStore.format_version, "lexical": SqliteViewBase.format_version}


def current_format(path: Path) -> str:
    return str(FORMATS[path.parent.parent.name])


def view_files(data_dir: Path) -> list[Path]:
    return sorted((data_dir / "views").glob("*/gen-*/*.sqlite"))


def sql(path: Path, *statements: str, read: str | None = None):
    c = sqlite3.connect(path)
    try:
        for s in statements:
            c.execute(s)
        c.commit()
        return c.execute(read).fetchone()[0] if read else None
    finally:
        c.close()


def run(data_dir, models, *, items=None, check=None):
    async def go():
        pipeline, _ = make_pipeline(data_dir, models)
        await pipeline.start()
        try:
            if items:
                await publish(pipeline, items)
            await pipeline.process_until_caught_up()
            if check is not None:
                check(pipeline)
            return dumps(pipeline)
        finally:
            await pipeline.close()
    return asyncio.run(go())


def test_previous_release_opens_newer_is_refused_older_view_is_rebuilt(tmp_path, models, caplog):
    data = tmp_path / "data"
    reference = run(data, models, items=sample_items())
    files = view_files(data)
    assert {f.parent.parent.name for f in files} == set(VIEW_NAMES)
    assert all(sql(f, read="SELECT value FROM meta WHERE key='format'") == current_format(f) for f in files)
    records = [data / "log.sqlite", data / "keys.sqlite", data / "views" / "catalog.sqlite"]
    records = [p for p in records if p.exists()] or pytest.fail(f"no record files in {sorted(data.iterdir())}")
    assert all(sql(p, read="PRAGMA user_version") == 1 for p in records)

    # What the previous release wrote: no format anywhere, the ledger without `supersedes`.
    for f in files:
        sql(f, "DELETE FROM meta WHERE key='format'", "DROP INDEX IF EXISTS turns_supersedes", "ALTER TABLE turns DROP COLUMN supersedes")
    for p in records:
        sql(p, "PRAGMA user_version=0")
    assert_same_views(reference, run(data, models))
    assert all(sql(f, read="SELECT value FROM meta WHERE key='format'") == current_format(f) for f in files)
    assert all(sql(f, read="SELECT COUNT(*) FROM pragma_table_info('turns') WHERE name='supersedes'") == 1 for f in files)
    assert all(sql(p, read="PRAGMA user_version") == 1 for p in records)

    # A newer release's files: refused, named, untouched.
    hierarchy = next(f for f in files if "/hierarchy/" in f.as_posix())
    sql(hierarchy, "UPDATE meta SET value='99' WHERE key='format'")
    with pytest.raises(FormatTooNew, match=f"{hierarchy}.*newer memstream.*format 99"):
        run(data, models)
    assert sql(hierarchy, read="SELECT value FROM meta WHERE key='format'") == "99"
    sql(hierarchy, f"UPDATE meta SET value='{current_format(hierarchy)}' WHERE key='format'")
    log_file = data / "log.sqlite"
    sql(log_file, "PRAGMA user_version=7")
    with pytest.raises(FormatTooNew, match="log.sqlite.*newer memstream.*format 7"):
        run(data, models)
    assert sql(log_file, read="PRAGMA user_version") == 7
    sql(log_file, "PRAGMA user_version=1")

    # A view generation older than this release reads: rebuilt from the log, automatically.
    graph = next(f for f in files if "/graph/" in f.as_posix())
    sql(graph, "UPDATE meta SET value='0' WHERE key='format'")
    caplog.clear()
    generations = {}
    rebuilt = run(data, models, check=lambda p: generations.update({v: p.catalog.current(v) for v in VIEW_NAMES}))
    assert "graph view's generation 1 is in a format this release no longer reads; rebuilding it from the log into generation 2" \
        in caplog.text
    assert generations == {"hierarchy": 1, "lexical": 1, "dense": 1, "graph": 2}
    assert not graph.parent.exists()
    assert_same_views(reference, rebuilt)
