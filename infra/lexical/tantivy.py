"""Embedded lexical view: BM25 with tantivy (Rust), ledger and positions in SQLite.

Measured on the LoCoMo dev turns with a conversation filter (benchmarks/lexical_engines.py):
tantivy answers in ~0.3 ms p50 where SQLite FTS5 needs ~3.5 ms, so tantivy it is. Tantivy has
no transactions shared with SQLite, so a change set is applied as: index writes + tantivy
commit, *then* ledger + positions in one SQLite transaction. A crash in between replays the
batch, and since every document is written as delete-by-id + add, the replay is harmless.

Filter clauses (tenant, kind, boundary) are wrapped in constant-score queries so that the
score of a hit is the BM25 score of its text alone.
"""

from __future__ import annotations

import shutil
import threading
from datetime import datetime
from pathlib import Path

import numpy as np
import tantivy

from infra.sqlite_base import SqliteViewBase
from schemas.ports.lexical import LexicalChangeSet, LexicalDoc
from schemas.ports.views import Boundary, Forget, Hit, Positions
from schemas.units import UnitKind, unit_key
from schemas.text import words

_RAW = "raw"


def _micros(t: datetime) -> int:
    return int(t.timestamp() * 1_000_000)


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


class TantivyLexicalIndex:
    backend = "tantivy"
    view = "lexical"

    def __init__(self, directory: str | Path, generation: int, writer_heap: int = 64_000_000):
        self.directory = Path(directory)
        self.generation = generation
        (self.directory / "index").mkdir(parents=True, exist_ok=True)
        self._ledger = _Ledger(self.directory / "ledger.sqlite", generation)
        self.schema = _schema()
        self.index = tantivy.Index(self.schema, path=str(self.directory / "index"))
        self._writer: tantivy.IndexWriter | None = None
        self._writer_heap = writer_heap
        self._lock = threading.RLock()
        self._searcher_version: int | None = None
        self._searcher: tantivy.Searcher | None = None

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
        with self._lock:
            w = self._writer_()
            for forget in change.forgets:
                w.delete_documents_by_query(self._scope_query(forget))
            for uid in [*change.delete_docs, *change.delete_turns]:
                w.delete_documents_by_term("unit_id", uid)
            for doc in change.upsert_docs:
                w.delete_documents_by_term("unit_id", doc.unit_id)
                w.add_document(self._document(doc))
            w.commit()
            with self._ledger._lock, self._ledger._tx() as c:
                touched = self._ledger._apply_ledger(c, change)
                touched.update((d.tenant_id, d.conversation_id) for d in change.upsert_docs)
                self._ledger._write_positions(c, positions)
                self._ledger._bump(c, touched)
                # Readers (in any process) reload their searcher when this counter moves.
                c.execute("INSERT INTO meta VALUES ('commits', '1') ON CONFLICT(key) DO UPDATE SET value=CAST(value AS INTEGER)+1")

    def _writer_(self) -> tantivy.IndexWriter:
        if self._writer is None:
            self._writer = self.index.writer(heap_size=self._writer_heap, num_threads=1)
        return self._writer

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

    def _scope_query(self, forget: Forget) -> tantivy.Query:
        s = forget.scope
        must = [self._term("tenant_id", forget.tenant_id)]
        if s.level in ("conversation", "session", "turn"):
            must.append(self._term("conversation_id", s.conversation_id))
        if s.level == "session":
            must.append(self._term("session_id", s.session_id))
        if s.level == "turn":
            # A forgotten turn's own document; its windows/episodes are recomputed by the projection.
            turns = self._ledger.turns_in_scope(forget)
            ids = [t.turn_id for t in turns] or ["-"]
            must.append(tantivy.Query.term_set_query(self.schema, "unit_id", ids))
        return tantivy.Query.boolean_query([(tantivy.Occur.Must, q) for q in must])

    # -- reads ---------------------------------------------------------------------------
    def _current_searcher(self) -> tantivy.Searcher:
        row = self._ledger._conn().execute("SELECT value FROM meta WHERE key='commits'").fetchone()
        version = int(row[0]) if row else 0
        with self._lock:
            if self._searcher is None or version != self._searcher_version:
                self.index.reload()
                self._searcher = self.index.searcher()
                self._searcher_version = version
            return self._searcher

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
