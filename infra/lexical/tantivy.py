"""Embedded lexical view: BM25 with tantivy (Rust), one index per tenant; ledger and positions in SQLite.

Measured on the LoCoMo dev turns with a conversation filter (benchmarks/lexical_engines.py):
tantivy answers in ~0.3 ms p50 where SQLite FTS5 needs ~3.5 ms, so tantivy it is.

One tantivy index per tenant. BM25's statistics (document count, each term's document
frequency, average length) are an index's, so with one shared index a tenant's scores moved
whenever another tenant wrote: a side channel (a planted word's score tells how many documents
of all tenants hold it) and a recall that drifted with the fleet around a tenant (docs/results/scale.md).
tantivy-py cannot take statistics from outside the index, so the index is the tenant's. The
`tenant_index` table maps a tenant to its directory under `tenants/`; a tenant's first write
creates it. Writers are opened per tenant and the least recently used are closed past
`_MAX_WRITERS` (~6 MB each); readers keep up to `_MAX_READERS` tenants' searchers open.

Tantivy has no transactions shared with SQLite, so a change set is applied as: index writes +
tantivy commits, *then* ledger + positions in one SQLite transaction. A crash in between replays
the batch — but a replay need not write the same documents: a turn whose key a forget destroyed
meanwhile is skipped, so an episode or turn document the crashed attempt committed might never
be rewritten or deleted. So the indexes are treated as a copy of the ledger's `docs` table
(below) with a dirty list: before the index writes, the (tenant, id) pairs they touch are
recorded in the ledger (`pending`, made durable first), and the ledger transaction that follows
clears it. A writer that finds it set (the previous one died in between) first makes those ids
equal to the `docs` table again (or rebuilds those tenants, for a forget), then goes on.

Filter clauses (kind, boundary) are wrapped in constant-score queries so that the score of a hit
is the BM25 score of its text alone.

Erasure by rebuild. A tantivy delete only marks documents: their stored body (LZ4 blocks, in
which a word is readable) and their terms stay in the segment files until a merge, which
tantivy-py 0.27 cannot force. So a change set that forgets or deletes turns is followed by a
rebuild of the tenants it touched: every live document is also kept in the ledger's `docs` table
(SQLite, which erases physically: infra/sqlite_base.py), a fresh index of the tenant is written
from it into a new directory, the tenant's pointer and the `commits` counter switch readers to
it in one transaction (readers in any process follow `commits` and reopen), and the old
directory is deleted. The positions are written in that same switching transaction, so when they
show the forget, no file of the store holds it (a reader process that still has the old files
open keeps their blocks allocated until it reopens, at its next query, but no path leads to
them). A crash before the switch replays the step; the writer deletes unfinished or replaced
directories when it starts. Cost: the tenant's index is rewritten per forget, so it grows with
the tenant, not with the deployment (`benchmarks/forget_erasure.py`).

Generations written before per-tenant indexes (one shared `index*` directory) are read as they
are until the writer's first write, which rebuilds them per tenant from the `docs` table (one
written before the `docs` table existed refuses writes and asks for a replay).
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
from collections import OrderedDict
from datetime import datetime
from pathlib import Path

import numpy as np
import tantivy

from infra.sqlite_base import SqliteViewBase, _chunks, erases, forget_where
from schemas.errors import StoreError
from schemas.ports.lexical import LexicalChangeSet, LexicalDoc
from schemas.ports.views import Boundary, Forget, Hit, Positions
from schemas.units import UnitKind, tenant_digest, unit_key
from schemas.text import words

log = logging.getLogger(__name__)

_RAW = "raw"
_TENANTS = "tenants"  # per-tenant index directories: tenants/<digest of the tenant id>-<n>
_SHARED = "index"  # the one shared index of generations written before per-tenant indexes
_MAX_WRITERS = 8
_MAX_READERS = 256
_WRITER_HEAP = 16_000_000  # per tenant writer (tantivy's minimum is 15 MB per thread); a rebuild uses writer_heap
_DOCS_SCHEMA = """
CREATE TABLE IF NOT EXISTS docs (
    unit_id TEXT PRIMARY KEY, kind TEXT NOT NULL, tenant_id TEXT NOT NULL, conversation_id TEXT NOT NULL,
    session_id TEXT NOT NULL, agent_ids TEXT NOT NULL, occurred_from TEXT NOT NULL, occurred_to TEXT NOT NULL, body TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS docs_scope ON docs (tenant_id, conversation_id, session_id);
CREATE TABLE IF NOT EXISTS tenant_index (tenant_id TEXT PRIMARY KEY, dir TEXT NOT NULL);
"""
_DOC_COLUMNS = "unit_id, kind, tenant_id, conversation_id, session_id, agent_ids, occurred_from, occurred_to, body"


def _micros(t: datetime) -> int:
    return int(t.timestamp() * 1_000_000)


def _row_doc(r: tuple) -> LexicalDoc:
    """A `docs` row (_DOC_COLUMNS) as a document."""
    return LexicalDoc(r[0], r[1], r[8], r[2], r[3], r[4], tuple(json.loads(r[5])), datetime.fromisoformat(r[6]), datetime.fromisoformat(r[7]))


def _schema() -> tantivy.Schema:
    sb = tantivy.SchemaBuilder()
    sb.add_text_field("unit_id", stored=True, tokenizer_name=_RAW)
    sb.add_integer_field("key", stored=False, indexed=False, fast=True)  # unit_key(unit_id): ranks without doc fetches
    for name in ("kind", "tenant_id", "conversation_id", "session_id", "agent_id"):
        sb.add_text_field(name, stored=False, tokenizer_name=_RAW)
    sb.add_integer_field("occurred_from", stored=False, indexed=True, fast=True)
    sb.add_integer_field("occurred_to", stored=False, indexed=True, fast=True)
    sb.add_text_field("body", stored=True, tokenizer_name="en_stem")
    return sb.build()


class _Ledger(SqliteViewBase):
    view = "lexical"
    extra_schema = _DOCS_SCHEMA

    def meta(self, key: str) -> str | None:
        row = self._conn().execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return row[0] if row else None


class TantivyLexicalIndex:
    backend = "tantivy"
    remote = False
    view = "lexical"

    def __init__(self, directory: str | Path, generation: int, writer_heap: int = 64_000_000):
        self.directory = Path(directory)
        self.generation = generation
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / _TENANTS).mkdir(exist_ok=True)
        self._ledger = _Ledger(self.directory / "ledger.sqlite", generation)
        self.schema = _schema()
        self._parser = tantivy.Index(self.schema)  # in memory: parses query text with the same analyzers
        self._writer_heap = writer_heap
        self._lock = threading.RLock()
        self._writers: OrderedDict[str, tuple[str, tantivy.IndexWriter]] = OrderedDict()  # tenant -> (dir, writer)
        self._readers: OrderedDict[str, tuple[str, int, tantivy.Index, tantivy.Searcher]] = OrderedDict()  # tenant -> (dir, commits, ...)
        self._shared: tuple[int, tantivy.Index, tantivy.Searcher] | None = None  # an old generation's one index, until migrated
        self._prepared = False  # the writer's start-up work (_prepare_writes) done
        self._rebuildable = self._docs_kept()

    def _docs_kept(self) -> bool:
        """Whether the ledger's `docs` table holds every document (so a rebuild loses nothing):
        true for generations created since it exists. A fresh generation starts with the
        per-tenant layout. An older generation without it is read as it is and refuses writes
        until a replay rebuilds it."""
        if self._ledger.meta("docs") == "1":
            return True
        c = self._ledger._conn()
        fresh = c.execute("SELECT 1 FROM turns LIMIT 1").fetchone() is None and not (self.directory / _SHARED / "meta.json").exists() \
            and not any(self.directory.glob(f"{_SHARED}-*"))
        if fresh:
            with self._ledger._lock, self._ledger._tx() as tx:
                tx.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", [("docs", "1"), ("layout", _TENANTS)])
            return True
        return False

    def _per_tenant(self) -> bool:
        return self._ledger.meta("layout") == _TENANTS

    # -- ledger delegation ---------------------------------------------------------------
    def positions(self) -> Positions:
        return self._ledger.positions()

    def find_turns(self, tenant_id, conversation_id, event_ids):
        return self._ledger.find_turns(tenant_id, conversation_id, event_ids)

    def session_turns(self, tenant_id, conversation_id, session_id):
        return self._ledger.session_turns(tenant_id, conversation_id, session_id)

    def turns_in_scope(self, forget: Forget):
        return self._ledger.turns_in_scope(forget)

    def conversation_version(self, tenant_id: str, conversation_id: str | None) -> int:
        return self._ledger.conversation_version(tenant_id, conversation_id)

    def known_tenant(self, tenant_id: str) -> bool:
        return self._ledger.known_tenant(tenant_id)

    # -- index directories -----------------------------------------------------------------
    def _dir_of(self, tenant_id: str) -> str | None:
        row = self._ledger._conn().execute("SELECT dir FROM tenant_index WHERE tenant_id=?", (tenant_id,)).fetchone()
        return row[0] if row else None

    def _new_dir(self, tenant_id: str, seq: int) -> Path:
        path = self.directory / _TENANTS / f"{tenant_digest(tenant_id)}-{seq}"
        shutil.rmtree(path, ignore_errors=True)  # an unfinished attempt
        path.mkdir()
        return path

    def _next_seq(self, n: int = 1) -> int:
        """The first of n fresh directory numbers (recorded at once: a number is never reused)."""
        with self._ledger._lock, self._ledger._tx() as c:
            row = c.execute("SELECT value FROM meta WHERE key='index_seq'").fetchone()
            first = int(row[0]) + 1 if row else 1
            c.execute("INSERT OR REPLACE INTO meta VALUES ('index_seq', ?)", (str(first + n - 1),))
        return first

    # -- writes --------------------------------------------------------------------------
    def apply(self, change: LexicalChangeSet, positions: Positions) -> None:
        """Index writes + commits, then ledger, docs table and versions in one SQLite
        transaction; then, for a change set that forgets or deletes turns, the rebuild of the
        tenants it touched (module docstring). The positions go with the last of those writes."""
        if not self._rebuildable:
            raise StoreError(f"lexical generation {self.generation} predates the ledger's docs table (and one index per tenant); "
                             "rebuild it with: memstream replay --projection lexical")
        with self._lock:
            self._prepare_writes()
            deletes = list(dict.fromkeys([*change.delete_docs, *change.delete_turns]))
            owners = self._owners(deletes)
            tenants = {f.tenant_id for f in change.forgets} | set(owners.values()) | {d.tenant_id for d in change.upsert_docs}
            self._mark_pending(change, owners, tenants)
            scoped = [(forget, self._ledger.turns_in_scope(forget)) for forget in change.forgets]
            touched_writers: dict[str, tantivy.IndexWriter] = {}

            def writer(tenant_id: str) -> tantivy.IndexWriter | None:
                if tenant_id not in touched_writers:
                    touched_writers[tenant_id] = self._writer_for(tenant_id, create=True)
                return touched_writers[tenant_id]

            for forget, turns in scoped:
                if self._dir_of(forget.tenant_id) is not None:
                    writer(forget.tenant_id).delete_documents_by_query(self._scope_query(forget, turns))
            for uid, tenant_id in owners.items():
                writer(tenant_id).delete_documents_by_term("unit_id", uid)
            for doc in change.upsert_docs:
                w = writer(doc.tenant_id)
                w.delete_documents_by_term("unit_id", doc.unit_id)
                w.add_document(self._document(doc))
            for w in touched_writers.values():
                w.commit()
            with self._ledger._lock, self._ledger._tx() as c:
                touched = self._ledger._apply_ledger(c, change)
                removed = self._apply_docs(c, change, scoped)
                # A rebuild when documents were removed or replaced (a replaced window held the
                # forgotten turn's text too); a forget that found nothing here costs nothing.
                erase = erases(change) and bool(removed or change.upsert_docs)
                touched.update((d.tenant_id, d.conversation_id) for d in change.upsert_docs)
                if not erase:  # (an erasing change keeps `pending` until its rebuild switches)
                    self._ledger._write_positions(c, positions)
                    c.execute("DELETE FROM meta WHERE key='pending'")
                self._ledger._bump(c, touched)
                # Readers (in any process) reload their searchers when this counter moves.
                c.execute("INSERT INTO meta VALUES ('commits', '1') ON CONFLICT(key) DO UPDATE SET value=CAST(value AS INTEGER)+1")
            if erase:
                self._rebuild(sorted(tenants), positions)
            if erases(change):
                self._ledger._truncate_wal(self._ledger._conn())
            self._trim_writers()

    def _owners(self, unit_ids: list[str]) -> dict[str, str]:
        """unit id -> its tenant, for the ids the docs table holds (the indexes hold no others)."""
        out: dict[str, str] = {}
        for chunk in _chunks(unit_ids, 500):
            out.update(self._ledger._conn().execute(
                f"SELECT unit_id, tenant_id FROM docs WHERE unit_id IN ({','.join('?' * len(chunk))})", chunk).fetchall())
        return out

    def _apply_docs(self, c, change: LexicalChangeSet, scoped: list[tuple[Forget, list]]) -> int:
        """The docs table follows the indexes exactly (it is what a rebuild reads). Returns how
        many documents were deleted."""
        removed = 0
        for forget, turns in scoped:
            if forget.scope.partial:
                for chunk in _chunks([t.turn_id for t in turns], 500):
                    removed += c.execute(f"DELETE FROM docs WHERE unit_id IN ({','.join('?' * len(chunk))})", chunk).rowcount
            else:
                where, args = forget_where(forget)
                removed += c.execute(f"DELETE FROM docs WHERE {where}", args).rowcount
        for chunk in _chunks(list(dict.fromkeys([*change.delete_docs, *change.delete_turns])), 500):
            removed += c.execute(f"DELETE FROM docs WHERE unit_id IN ({','.join('?' * len(chunk))})", chunk).rowcount
        c.executemany("INSERT OR REPLACE INTO docs VALUES (?,?,?,?,?,?,?,?,?)", [
            (d.unit_id, d.kind, d.tenant_id, d.conversation_id, d.session_id, json.dumps(list(d.agent_ids)), d.occurred_from.isoformat(),
             d.occurred_to.isoformat(), d.text) for d in change.upsert_docs])
        return removed

    def _writer_for(self, tenant_id: str, create: bool) -> tantivy.IndexWriter | None:
        """The tenant's open writer; its index is made (and recorded) on its first write."""
        name = self._dir_of(tenant_id)
        got = self._writers.get(tenant_id)
        if got is not None and got[0] == name:
            self._writers.move_to_end(tenant_id)
            return got[1]
        if got is not None:  # its directory was replaced by a rebuild
            self._close_writer(tenant_id)
        if name is None:
            if not create:
                return None
            path = self._new_dir(tenant_id, self._next_seq())
            index = tantivy.Index(self.schema, path=str(path))
            name = path.name
            # The pointer is durable before any document goes in, so the start-up sweep never
            # takes the directory for an unfinished rebuild.
            with self._ledger._lock, self._ledger._tx() as c:
                c.execute("INSERT INTO tenant_index VALUES (?, ?)", (tenant_id, name))
        else:
            index = tantivy.Index.open(str(self.directory / _TENANTS / name))
        w = index.writer(heap_size=_WRITER_HEAP, num_threads=1)
        self._writers[tenant_id] = (name, w)
        return w

    def _close_writer(self, tenant_id: str) -> None:
        _, w = self._writers.pop(tenant_id)
        w.wait_merging_threads()  # (consumes the writer; every write of it was committed in its apply)

    def _trim_writers(self) -> None:
        while len(self._writers) > _MAX_WRITERS:
            self._close_writer(next(iter(self._writers)))

    @classmethod
    def restore(cls, directory: str | Path, generation: int) -> bool:
        """Bring back a generation from its ledger alone — what a backup keeps (services/backup.py):
        every tenant's index is written afresh from the docs table. False when the generation
        keeps no docs table (it predates it): then a replay must rebuild it."""
        ledger = _Ledger(Path(directory) / "ledger.sqlite", generation)
        try:
            if ledger.meta("docs") != "1":
                return False
            with ledger._lock, ledger._tx() as c:  # the backup has no index directories: start from none
                c.execute("DELETE FROM tenant_index")
                c.execute("DELETE FROM meta WHERE key IN ('index_dir', 'pending')")
                c.execute("INSERT OR REPLACE INTO meta VALUES ('layout', ?)", (_TENANTS,))
        finally:
            ledger.close()
        index = cls(directory, generation)
        try:
            with index._lock:
                index._rebuild(index._docs_tenants(), index.positions())
        finally:
            index.close()
        return True

    def _docs_tenants(self) -> list[str]:
        return [r[0] for r in self._ledger._conn().execute("SELECT DISTINCT tenant_id FROM docs ORDER BY tenant_id")]

    def _rebuild(self, tenants: list[str], positions: Positions | None) -> None:
        """Write each tenant's index afresh from the docs table into a new directory; then switch
        the pointers (and the positions, when given) in one transaction and delete the old
        directories. A tenant with no documents left loses its index."""
        if not tenants:
            return
        first = self._next_seq(len(tenants))
        built: dict[str, str | None] = {}
        for n, tenant_id in enumerate(tenants):
            rows = self._ledger._conn().execute(f"SELECT {_DOC_COLUMNS} FROM docs WHERE tenant_id=? ORDER BY unit_id", (tenant_id,))
            first_row = rows.fetchone()
            if first_row is None:
                built[tenant_id] = None
                continue
            path = self._new_dir(tenant_id, first + n)
            w = tantivy.Index(self.schema, path=str(path)).writer(heap_size=self._writer_heap, num_threads=1)
            w.add_document(self._document(_row_doc(first_row)))
            for r in rows:
                w.add_document(self._document(_row_doc(r)))
            w.commit()
            w.wait_merging_threads()  # (consumes the writer) the new directory is complete and closed
            built[tenant_id] = path.name
        old = {t: self._dir_of(t) for t in tenants}
        for tenant_id in tenants:
            if tenant_id in self._writers:
                self._close_writer(tenant_id)
            self._readers.pop(tenant_id, None)
        with self._ledger._lock, self._ledger._tx() as c:
            for tenant_id, name in built.items():
                if name is None:
                    c.execute("DELETE FROM tenant_index WHERE tenant_id=?", (tenant_id,))
                else:
                    c.execute("INSERT OR REPLACE INTO tenant_index VALUES (?, ?)", (tenant_id, name))
            c.execute("DELETE FROM meta WHERE key='pending'")  # the new indexes are the docs table exactly
            c.execute("INSERT INTO meta VALUES ('commits', '1') ON CONFLICT(key) DO UPDATE SET value=CAST(value AS INTEGER)+1")
            if positions is not None:
                self._ledger._write_positions(c, positions)
        for name in old.values():
            if name is not None:
                shutil.rmtree(self.directory / _TENANTS / name, ignore_errors=True)

    def _prepare_writes(self) -> None:
        """The writer's start-up work, once per process (the pipeline's writer lock makes it the
        only writer): rebuild an old shared-index generation per tenant, remove what a crashed
        rebuild left (unfinished or replaced directories), undo an interrupted write."""
        if self._prepared:
            return
        if not self._per_tenant():
            tenants = self._docs_tenants()
            log.warning("lexical generation %d: moving to one index per tenant (%d tenants), rebuilt from its ledger", self.generation, len(tenants))
            self._rebuild(tenants, None)  # (clears `pending`: the rebuilt indexes are the docs table)
            with self._ledger._lock, self._ledger._tx() as c:
                c.execute("INSERT OR REPLACE INTO meta VALUES ('layout', ?)", (_TENANTS,))
                c.execute("DELETE FROM meta WHERE key='index_dir'")
                # Not redundant: _rebuild bumps none when there are no tenants, and the layout switches here.
                c.execute("INSERT INTO meta VALUES ('commits', '1') ON CONFLICT(key) DO UPDATE SET value=CAST(value AS INTEGER)+1")
        live = {r[0] for r in self._ledger._conn().execute("SELECT dir FROM tenant_index")}
        for stale in [*(self.directory / _TENANTS).iterdir(), *self.directory.glob(f"{_SHARED}*")]:
            if stale.is_dir() and stale.name not in live:
                shutil.rmtree(stale, ignore_errors=True)
        self._recover()
        self._prepared = True

    # -- the dirty list (module docstring) ------------------------------------------------
    def _mark_pending(self, change: LexicalChangeSet, owners: dict[str, str], tenants: set[str]) -> None:
        """Record, durably, which documents the index writes that follow may touch: their
        (tenant, id) pairs, or the tenants to rebuild when the change erases (a forget's scope is
        found by query, and an interrupted erasure must still end in a rebuild). `tenants`: the
        tenants the change touches (apply's set)."""
        if not (change.forgets or change.delete_turns or change.delete_docs or change.upsert_docs):
            return
        if erases(change):
            pending = json.dumps({"rebuild": sorted(tenants)})
        else:
            pairs = {*((t, uid) for uid, t in owners.items()), *((d.tenant_id, d.unit_id) for d in change.upsert_docs)}
            pending = json.dumps({"ids": sorted(pairs)})
        c = self._ledger._conn()
        # FULL for this one commit: the record must be on disk before the index commit is, or a
        # power cut could keep the index's writes and lose the record of them.
        c.execute("PRAGMA synchronous=FULL")
        try:
            with self._ledger._lock, self._ledger._tx() as tx:
                tx.execute("INSERT OR REPLACE INTO meta VALUES ('pending', ?)", (pending,))
        finally:
            c.execute("PRAGMA synchronous=NORMAL")

    def _recover(self) -> None:
        """Undo what a writer that died between its index commits and its ledger transaction
        left in the indexes: the recorded ids are made equal to the docs table (the ledger's
        truth, consistent with the positions), or the recorded tenants are rebuilt from it."""
        pending = self._ledger.meta("pending")
        if pending is None:
            return
        got = json.loads(pending)
        if "rebuild" in got:
            log.warning("lexical generation %d: a forget was interrupted; rebuilding %d tenants' indexes from the ledger",
                        self.generation, len(got["rebuild"]))
            self._rebuild(got["rebuild"], self.positions())
            return
        pairs = got["ids"]
        log.warning("lexical generation %d: the last write was interrupted; restoring %d documents from the ledger", self.generation, len(pairs))
        by_tenant: dict[str, list[str]] = {}
        for tenant_id, uid in pairs:
            by_tenant.setdefault(tenant_id, []).append(uid)
        for tenant_id, ids in by_tenant.items():
            w = self._writer_for(tenant_id, create=False)
            if w is None:  # the tenant's index was never made: nothing of it to undo
                continue
            for uid in ids:
                w.delete_documents_by_term("unit_id", uid)
            for chunk in _chunks(ids, 500):
                rows = self._ledger._conn().execute(
                    f"SELECT {_DOC_COLUMNS} FROM docs WHERE tenant_id=? AND unit_id IN ({','.join('?' * len(chunk))})", [tenant_id, *chunk])
                for r in rows:
                    w.add_document(self._document(_row_doc(r)))
            w.commit()
        with self._ledger._lock, self._ledger._tx() as c:
            c.execute("DELETE FROM meta WHERE key='pending'")
            c.execute("INSERT INTO meta VALUES ('commits', '1') ON CONFLICT(key) DO UPDATE SET value=CAST(value AS INTEGER)+1")

    def _document(self, d: LexicalDoc) -> tantivy.Document:
        doc = tantivy.Document(
            unit_id=d.unit_id, key=unit_key(d.unit_id), kind=d.kind, tenant_id=d.tenant_id, conversation_id=d.conversation_id, session_id=d.session_id,
            occurred_from=_micros(d.occurred_from), occurred_to=_micros(d.occurred_to), body=d.text,
        )
        for a in d.agent_ids:
            doc.add_text("agent_id", a)
        return doc

    def _term(self, field: str, value: str) -> tantivy.Query:
        return tantivy.Query.term_query(self.schema, field, value)

    def _scope_query(self, forget: Forget, turns: list) -> tantivy.Query:
        """The documents a forget removes. A partial scope (turn, agent, occurred_before): the
        covered turns' own documents, found by the ledger's rule (infra/sqlite_base.py's
        forget_where, ForgetScope.covers); their sessions' windows/episodes are recomputed by
        the projection. A whole tenant, conversation or session: every document in it."""
        s = forget.scope
        must = [self._term("tenant_id", forget.tenant_id)]
        if s.partial:
            ids = [t.turn_id for t in turns] or ["-"]
            must.append(tantivy.Query.term_set_query(self.schema, "unit_id", ids))
            return tantivy.Query.boolean_query([(tantivy.Occur.Must, q) for q in must])
        if s.level in ("conversation", "session"):
            must.append(self._term("conversation_id", s.conversation_id))
        if s.level == "session":
            must.append(self._term("session_id", s.session_id))
        return tantivy.Query.boolean_query([(tantivy.Occur.Must, q) for q in must])

    # -- reads ---------------------------------------------------------------------------
    def _searcher(self, tenant_id: str) -> tuple[tantivy.Searcher | None, bool]:
        """(the searcher over the tenant's documents or None when it has none, whether it is an
        old generation's shared index, which needs the tenant filter)."""
        last: Exception | None = None
        for _attempt in range(5):
            commits, layout, name = self._ledger._conn().execute(
                "SELECT (SELECT value FROM meta WHERE key='commits'), (SELECT value FROM meta WHERE key='layout'), "
                "(SELECT dir FROM tenant_index WHERE tenant_id=?)", (tenant_id,)).fetchone()
            version = int(commits or 0)
            try:
                with self._lock:
                    if layout != _TENANTS:
                        return self._shared_searcher(version), True
                    if name is None:
                        return None, False
                    got = self._readers.get(tenant_id)
                    if got is not None and got[0] == name and got[1] == version:
                        self._readers.move_to_end(tenant_id)
                        return got[3], False
                    index = got[2] if got is not None and got[0] == name else tantivy.Index.open(str(self.directory / _TENANTS / name))
                    index.reload()
                    searcher = index.searcher()
                    self._readers[tenant_id] = (name, version, index, searcher)
                    self._readers.move_to_end(tenant_id)
                    while len(self._readers) > _MAX_READERS:
                        self._readers.popitem(last=False)
                    return searcher, False
            except (OSError, ValueError) as exc:  # the directory read was replaced meanwhile: read the pointer again
                last = exc
                with self._lock:
                    self._readers.pop(tenant_id, None)
        raise StoreError(f"the lexical index in {self.directory} could not be opened ({last}); check the directory's files")

    def _shared_searcher(self, version: int) -> tantivy.Searcher:
        """An old generation's one index (until the writer rebuilds it per tenant)."""
        if self._shared is None or self._shared[0] != version:
            name = self._ledger.meta("index_dir") or _SHARED
            index = tantivy.Index.open(str(self.directory / name))
            index.reload()
            self._shared = (version, index, index.searcher())
        return self._shared[2]

    # -- erasure (schemas/ports/views.py) ------------------------------------------------
    erasure_deferred_seconds = 0.0  # the rebuild runs in apply

    def erase_pending(self) -> float | None:
        return None

    def erase_due(self) -> float | None:
        return None

    def _query(self, kind: UnitKind | None, query: str, boundary: Boundary, shared: bool,
               unit_ids: list[str] | None = None) -> tantivy.Query | None:
        terms = [w.replace("'", "").replace("’", "") for w in words(query)]
        terms = [t for t in terms if t]
        if not terms:
            return None
        text_q = self._parser.parse_query_lenient(" ".join(terms), ["body"])[0]
        filters = ([self._term("tenant_id", boundary.tenant_id)] if shared else []) + ([self._term("kind", kind)] if kind is not None else [])
        if boundary.conversation_ids is not None:
            filters.append(tantivy.Query.term_set_query(self.schema, "conversation_id", list(boundary.conversation_ids)))
        if boundary.session_ids is not None:
            filters.append(tantivy.Query.term_set_query(self.schema, "session_id", list(boundary.session_ids)))
        if boundary.agent_ids is not None:
            filters.append(tantivy.Query.term_set_query(self.schema, "agent_id", list(boundary.agent_ids)))
        if boundary.since is not None:
            filters.append(tantivy.Query.range_query(self.schema, "occurred_to", tantivy.FieldType.Integer, _micros(boundary.since), None))
        if boundary.until is not None:
            filters.append(tantivy.Query.range_query(self.schema, "occurred_from", tantivy.FieldType.Integer, None, _micros(boundary.until)))
        if unit_ids is not None:
            filters.append(tantivy.Query.term_set_query(self.schema, "unit_id", list(unit_ids)))
        return tantivy.Query.boolean_query(
            [(tantivy.Occur.Must, text_q)] + [(tantivy.Occur.Must, tantivy.Query.const_score_query(f, 0.0)) for f in filters]
        )

    def score_units(self, kind: UnitKind | None, query: str, boundary: Boundary, limit: int) -> tuple[np.ndarray, np.ndarray]:
        searcher, shared = self._searcher(boundary.tenant_id)
        q = self._query(kind, query, boundary, shared) if searcher is not None else None
        if q is None or limit <= 0:
            return np.zeros(0, np.int64), np.zeros(0)
        hits = searcher.search(q, limit, count=False).hits
        if not hits:
            return np.zeros(0, np.int64), np.zeros(0)
        keys = searcher.fast_field_values("key", [addr for _, addr in hits])
        return np.asarray(keys, dtype=np.int64), np.asarray([score for score, _ in hits], dtype=float)

    def score_ids(self, kind: UnitKind | None, query: str, boundary: Boundary, unit_ids: list[str]) -> tuple[np.ndarray, np.ndarray]:
        searcher, shared = self._searcher(boundary.tenant_id)
        q = self._query(kind, query, boundary, shared, unit_ids) if searcher is not None and unit_ids else None
        if q is None:
            return np.zeros(0, np.int64), np.zeros(0)
        hits = searcher.search(q, len(unit_ids), count=False).hits
        if not hits:
            return np.zeros(0, np.int64), np.zeros(0)
        keys = searcher.fast_field_values("key", [addr for _, addr in hits])
        return np.asarray(keys, dtype=np.int64), np.asarray([score for score, _ in hits], dtype=float)

    def search(self, kind: UnitKind, query: str, boundary: Boundary, k: int) -> list[Hit]:
        searcher, shared = self._searcher(boundary.tenant_id)
        q = self._query(kind, query, boundary, shared) if searcher is not None else None
        if q is None or k <= 0:
            return []
        result = searcher.search(q, k)
        hits = [Hit(searcher.doc(addr)["unit_id"][0], float(score)) for score, addr in result.hits]
        hits.sort(key=lambda h: (-h.score, h.unit_id))
        return hits

    def canonical_dump(self) -> dict:
        docs = []
        tenants = [r[0] for r in self._ledger._conn().execute("SELECT tenant_id FROM tenant_index")] if self._per_tenant() else [None]
        for tenant_id in tenants:
            searcher = self._searcher(tenant_id)[0] if tenant_id is not None else self._shared_searcher(-1)
            result = searcher.search(tantivy.Query.all_query(), max(searcher.num_docs, 1))
            docs.extend((d["unit_id"][0], d["body"][0]) for d in (searcher.doc(addr) for _, addr in result.hits))
        return {"view": self.view, "turns": self._ledger.ledger_dump(), "docs": [list(d) for d in sorted(docs)]}

    def close(self) -> None:
        with self._lock:
            while self._writers:
                self._close_writer(next(iter(self._writers)))
            self._readers.clear()
            self._shared = None
        self._ledger.close()

    def destroy(self) -> None:
        self.close()
        shutil.rmtree(self.directory, ignore_errors=True)
