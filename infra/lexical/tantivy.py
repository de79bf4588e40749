"""Embedded lexical view: BM25 with tantivy (Rust), ledger and positions in SQLite.

Measured on the LoCoMo dev turns with a conversation filter (benchmarks/lexical_engines.py):
tantivy answers in ~0.3 ms p50 where SQLite FTS5 needs ~3.5 ms, so tantivy it is. Tantivy has
no transactions shared with SQLite, so a change set is applied as: index writes + tantivy
commit, *then* ledger + positions in one SQLite transaction. A crash in between replays the
batch — but a replay need not write the same documents: a turn whose key a forget destroyed
meanwhile is skipped, so an episode or turn document the crashed attempt committed might never
be rewritten or deleted. So the index is treated as a copy of the ledger's `docs` table (below)
with a dirty list: before the index writes, the ids they touch are recorded in the ledger
(`pending`, made durable first), and the ledger transaction that follows clears it. A writer
that finds it set (the previous one died in between) first makes those ids in the index equal
to the `docs` table again (or rebuilds, for a forget), then goes on.

Filter clauses (tenant, kind, boundary) are wrapped in constant-score queries so that the
score of a hit is the BM25 score of its text alone.

Erasure by rebuild. A tantivy delete only marks documents: their stored body (LZ4 blocks, in
which a word is readable) and their terms stay in the segment files until a merge, which
tantivy-py 0.27 cannot force. So a change set that forgets or deletes turns is followed by a
rebuild: every live document is also kept in the ledger's `docs` table (SQLite, which erases
physically: infra/sqlite_base.py), a fresh index is written from it into a new directory
(`index-<n>`), the ledger's `index_dir` pointer and `commits` counter switch readers to it in
one transaction (readers in any process follow `commits` and reopen), and the old directory is
deleted. The positions are written in that same switching transaction, so when they show the
forget, no file of the store holds it (a reader process that still has the old files open keeps
their blocks allocated until it reopens, at its next query, but no path leads to them). A crash
before the switch replays the step; the writer deletes an unfinished or replaced directory when
it starts. Cost: the whole index is rewritten per forget — 0.53 s per forgotten turn on the
LoCoMo dev split's 2,760 turns vs 0.02 s without the rebuild (`benchmarks/forget_erasure.py`).
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
from datetime import datetime
from pathlib import Path

import numpy as np
import tantivy

from infra.sqlite_base import SqliteViewBase, _chunks, erases, forget_where
from schemas.errors import StoreError
from schemas.ports.lexical import LexicalChangeSet, LexicalDoc
from schemas.ports.views import Boundary, Forget, Hit, Positions
from schemas.units import UnitKind, unit_key
from schemas.text import words

log = logging.getLogger(__name__)

_RAW = "raw"
_FIRST_DIR = "index"
_DOCS_SCHEMA = """
CREATE TABLE IF NOT EXISTS docs (
    unit_id TEXT PRIMARY KEY, kind TEXT NOT NULL, tenant_id TEXT NOT NULL, conversation_id TEXT NOT NULL,
    session_id TEXT NOT NULL, agent_ids TEXT NOT NULL, occurred_from TEXT NOT NULL, occurred_to TEXT NOT NULL, body TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS docs_scope ON docs (tenant_id, conversation_id, session_id);
"""


def _micros(t: datetime) -> int:
    return int(t.timestamp() * 1_000_000)


def _row_doc(r: tuple) -> LexicalDoc:
    """A `docs` row (unit_id, kind, tenant_id, conversation_id, session_id, agent_ids, occurred_from, occurred_to, body)."""
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
        self._ledger = _Ledger(self.directory / "ledger.sqlite", generation)
        self.schema = _schema()
        self._writer: tantivy.IndexWriter | None = None
        self._writer_heap = writer_heap
        self._lock = threading.RLock()
        self._searcher_version: int | None = None
        self._searcher: tantivy.Searcher | None = None
        self._index_dir, self.index = self._open(self._pointer()[0])
        self._rebuildable = self._docs_kept()

    # -- index directories -----------------------------------------------------------------
    def _pointer(self) -> tuple[str, int]:
        """(index directory, commits counter), read together: readers follow both."""
        rows = dict(self._ledger._conn().execute("SELECT key, value FROM meta WHERE key IN ('index_dir', 'commits')").fetchall())
        return rows.get("index_dir", _FIRST_DIR), int(rows.get("commits", 0))

    def _open(self, name: str) -> tuple[str, tantivy.Index]:
        """(directory name, index) of the pointer's directory. A fresh generation's first index
        is made on first open; nothing else is ever created here, so a directory a rebuild just
        deleted is not brought back empty (the pointer, read again, names its successor)."""
        path = self.directory / name
        if name == _FIRST_DIR and not (path / "meta.json").exists():
            current = self._pointer()[0]
            if current != _FIRST_DIR:
                return self._open(current)
            path.mkdir(parents=True, exist_ok=True)
            return name, tantivy.Index(self.schema, path=str(path))
        return name, tantivy.Index.open(str(path))

    def _docs_kept(self) -> bool:
        """Whether the ledger's `docs` table holds every document (so a rebuild loses nothing):
        true for generations created since it exists. An older generation's index is erased only
        by a replay (a warning says so at each forget)."""
        if self._ledger.meta("docs") == "1":
            return True
        c = self._ledger._conn()
        if c.execute("SELECT 1 FROM turns LIMIT 1").fetchone() is None and self.index.searcher().num_docs == 0:
            c.execute("INSERT OR REPLACE INTO meta VALUES ('docs', '1')")
            return True
        return False

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

    # -- writes --------------------------------------------------------------------------
    def apply(self, change: LexicalChangeSet, positions: Positions) -> None:
        """Index writes + commit, then ledger, docs table and versions in one SQLite
        transaction; then, for a change set that forgets or deletes turns, the rebuild (module
        docstring). The positions go with the last of those writes."""
        if erases(change) and not self._rebuildable:
            log.warning("lexical generation %d predates the docs table: forgotten text stays in its tantivy segments "
                        "until a replay (memstream replay --projection lexical) rebuilds it", self.generation)
        with self._lock:
            w = self._writer_()
            if self._rebuildable:
                self._mark_pending(change)
            scoped = [(forget, self._ledger.turns_in_scope(forget)) for forget in change.forgets]
            for forget, turns in scoped:
                w.delete_documents_by_query(self._scope_query(forget, turns))
            for uid in [*change.delete_docs, *change.delete_turns]:
                w.delete_documents_by_term("unit_id", uid)
            for doc in change.upsert_docs:
                w.delete_documents_by_term("unit_id", doc.unit_id)
                w.add_document(self._document(doc))
            w.commit()
            with self._ledger._lock, self._ledger._tx() as c:
                touched = self._ledger._apply_ledger(c, change)
                removed = self._apply_docs(c, change, scoped)
                # A rebuild when documents were removed or replaced (a replaced window held the
                # forgotten turn's text too); a forget that found nothing here costs nothing.
                erase = erases(change) and self._rebuildable and bool(removed or change.upsert_docs)
                touched.update((d.tenant_id, d.conversation_id) for d in change.upsert_docs)
                if not erase:  # (an erasing change keeps `pending` until its rebuild switches)
                    self._ledger._write_positions(c, positions)
                    c.execute("DELETE FROM meta WHERE key='pending'")
                self._ledger._bump(c, touched)
                # Readers (in any process) reload their searcher when this counter moves.
                c.execute("INSERT INTO meta VALUES ('commits', '1') ON CONFLICT(key) DO UPDATE SET value=CAST(value AS INTEGER)+1")
            if erase:
                self._rebuild(positions)
            if erases(change):
                self._ledger._truncate_wal(self._ledger._conn())

    def _apply_docs(self, c, change: LexicalChangeSet, scoped: list[tuple[Forget, list]]) -> int:
        """The docs table follows the index exactly (it is what a rebuild reads). Returns how
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

    @classmethod
    def restore(cls, directory: str | Path, generation: int) -> bool:
        """Bring back a generation from its ledger alone — what a backup keeps (services/backup.py):
        the index is written afresh from the docs table. False when the generation keeps no docs
        table (it predates it): then a replay must rebuild it."""
        ledger = _Ledger(Path(directory) / "ledger.sqlite", generation)
        try:
            if ledger.meta("docs") != "1":
                return False
            with ledger._lock, ledger._tx() as c:  # the backup has no index directory: start from an empty one
                c.execute("INSERT OR REPLACE INTO meta VALUES ('index_dir', ?)", (_FIRST_DIR,))
        finally:
            ledger.close()
        index = cls(directory, generation)
        try:
            with index._lock:
                index._rebuild(index.positions())
        finally:
            index.close()
        return True

    def _rebuild(self, positions: Positions) -> None:
        """Write a fresh index from the docs table into a new directory, switch the pointer and
        the positions in one transaction, delete the old directory."""
        old = self._index_dir
        seq = int(self._ledger.meta("index_seq") or 0) + 1
        name = f"index-{seq}"
        path = self.directory / name
        shutil.rmtree(path, ignore_errors=True)  # an unfinished attempt
        path.mkdir()
        fresh = tantivy.Index(self.schema, path=str(path))
        w = fresh.writer(heap_size=self._writer_heap, num_threads=1)
        rows = self._ledger._conn().execute("SELECT unit_id, kind, tenant_id, conversation_id, session_id, agent_ids, occurred_from, "
                                            "occurred_to, body FROM docs ORDER BY unit_id")
        for r in rows:
            w.add_document(self._document(_row_doc(r)))
        w.commit()
        w.wait_merging_threads()  # (consumes the writer) the new directory is complete and closed
        if self._writer is not None:
            self._writer.wait_merging_threads()
            self._writer = None
        with self._ledger._lock, self._ledger._tx() as c:
            c.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", [("index_dir", name), ("index_seq", str(seq))])
            c.execute("DELETE FROM meta WHERE key='pending'")  # the new index is the docs table exactly
            c.execute("INSERT INTO meta VALUES ('commits', '1') ON CONFLICT(key) DO UPDATE SET value=CAST(value AS INTEGER)+1")
            self._ledger._write_positions(c, positions)
        self.index, self._index_dir, self._searcher, self._searcher_version = fresh, name, None, None
        shutil.rmtree(self.directory / old, ignore_errors=True)

    def _writer_(self) -> tantivy.IndexWriter:
        if self._writer is None:
            # The one writer (the pipeline's writer lock) removes what a crashed rebuild left:
            # an unfinished new directory or a replaced old one.
            for stale in self.directory.glob("index*"):
                if stale.is_dir() and stale.name != self._index_dir:
                    shutil.rmtree(stale, ignore_errors=True)
            self._writer = self.index.writer(heap_size=self._writer_heap, num_threads=1)
            if self._ledger.meta("pending") is not None:
                self._recover()
                if self._writer is None:  # it rebuilt: a new directory, a new writer
                    self._writer = self.index.writer(heap_size=self._writer_heap, num_threads=1)
        return self._writer

    # -- the dirty list (module docstring) ------------------------------------------------
    def _mark_pending(self, change: LexicalChangeSet) -> None:
        """Record, durably, which documents the index writes that follow may touch: their ids, or
        every document ("*") when the change erases (a forget's scope is found by query, and an
        interrupted erasure must still end in a rebuild)."""
        if not (change.forgets or change.delete_turns or change.delete_docs or change.upsert_docs):
            return
        if erases(change):
            pending = "*"
        else:
            pending = json.dumps(sorted({*change.delete_docs, *change.delete_turns, *(d.unit_id for d in change.upsert_docs)}))
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
        """Undo what a writer that died between its index commit and its ledger transaction left
        in the index: the recorded ids are made equal to the docs table (the ledger's truth,
        consistent with the positions), or the whole index is rebuilt from it."""
        pending = self._ledger.meta("pending")
        if pending is None:
            return
        if pending == "*":
            log.warning("lexical generation %d: a forget was interrupted; rebuilding the index from its ledger", self.generation)
            self._rebuild(self.positions())
            return
        ids = json.loads(pending)
        log.warning("lexical generation %d: the last write was interrupted; restoring %d documents from the ledger", self.generation, len(ids))
        w = self._writer
        for uid in ids:
            w.delete_documents_by_term("unit_id", uid)
        for chunk in _chunks(ids, 500):
            rows = self._ledger._conn().execute(
                "SELECT unit_id, kind, tenant_id, conversation_id, session_id, agent_ids, occurred_from, occurred_to, body "
                f"FROM docs WHERE unit_id IN ({','.join('?' * len(chunk))})", chunk)
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
    def _current_searcher(self) -> tantivy.Searcher:
        for attempt in range(5):
            name, version = self._pointer()
            with self._lock:
                if self._searcher is not None and version == self._searcher_version:
                    return self._searcher
                try:
                    if name != self._index_dir:  # a rebuild switched directories (in this process or another)
                        self._index_dir, self.index = self._open(name)
                    self.index.reload()
                    self._searcher = self.index.searcher()
                except (OSError, ValueError) as exc:  # the directory read was replaced meanwhile: read the pointer again
                    last = exc
                    self._searcher = None
                    continue
                self._searcher_version = version
                return self._searcher
        raise StoreError(f"the lexical index in {self.directory} could not be opened ({last}); check the directory's files")

    # -- erasure (schemas/ports/views.py) ------------------------------------------------
    erasure_deferred_seconds = 0.0  # the rebuild runs in apply

    def erase_pending(self) -> float | None:
        return None

    def erase_due(self) -> float | None:
        return None

    def _query(self, kind: UnitKind | None, query: str, boundary: Boundary) -> tantivy.Query | None:
        terms = [w.replace("'", "").replace("’", "") for w in words(query)]
        terms = [t for t in terms if t]
        if not terms:
            return None
        text_q = self.index.parse_query_lenient(" ".join(terms), ["body"])[0]
        filters = [self._term("tenant_id", boundary.tenant_id)] + ([self._term("kind", kind)] if kind is not None else [])
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
        return tantivy.Query.boolean_query(
            [(tantivy.Occur.Must, text_q)] + [(tantivy.Occur.Must, tantivy.Query.const_score_query(f, 0.0)) for f in filters]
        )

    def score_units(self, kind: UnitKind | None, query: str, boundary: Boundary, limit: int) -> tuple[np.ndarray, np.ndarray]:
        q = self._query(kind, query, boundary)
        if q is None or limit <= 0:
            return np.zeros(0, np.int64), np.zeros(0)
        searcher = self._current_searcher()
        hits = searcher.search(q, limit, count=False).hits
        if not hits:
            return np.zeros(0, np.int64), np.zeros(0)
        keys = searcher.fast_field_values("key", [addr for _, addr in hits])
        return np.asarray(keys, dtype=np.int64), np.asarray([score for score, _ in hits], dtype=float)

    def search(self, kind: UnitKind, query: str, boundary: Boundary, k: int) -> list[Hit]:
        q = self._query(kind, query, boundary)
        if q is None or k <= 0:
            return []
        searcher = self._current_searcher()
        result = searcher.search(q, k)
        hits = [Hit(searcher.doc(addr)["unit_id"][0], float(score)) for score, addr in result.hits]
        hits.sort(key=lambda h: (-h.score, h.unit_id))
        return hits

    def canonical_dump(self) -> dict:
        searcher = self._current_searcher()
        result = searcher.search(tantivy.Query.all_query(), max(searcher.num_docs, 1))
        docs = sorted((d["unit_id"][0], d["body"][0]) for d in (searcher.doc(addr) for _, addr in result.hits))
        return {"view": self.view, "turns": self._ledger.ledger_dump(), "docs": [list(d) for d in docs]}

    def close(self) -> None:
        with self._lock:
            if self._writer is not None:
                self._writer.wait_merging_threads()
                self._writer = None
        self._ledger.close()

    def destroy(self) -> None:
        self.close()
        shutil.rmtree(self.directory, ignore_errors=True)
