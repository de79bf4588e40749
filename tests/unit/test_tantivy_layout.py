"""The tantivy lexical view's on-disk layout: one index per tenant, and the move to it of a
generation written with one shared index (what releases before per-tenant indexes left)."""

from __future__ import annotations

import shutil
import sqlite3
from datetime import timedelta

import tantivy

from infra.lexical.tantivy import TantivyLexicalIndex, _row_doc, _schema
from schemas.ports.lexical import LexicalChangeSet, LexicalDoc
from schemas.ports.views import Boundary
from tests.contracts.builders import T0


def _doc(uid: str, text: str, tenant: str) -> LexicalDoc:
    return LexicalDoc(uid, "turn", text, tenant, "c1", "s1", ("a1",), T0, T0 + timedelta(seconds=1))


def _scores(index, tenant: str) -> dict[str, float]:
    return {h.unit_id: h.score for h in index.search("turn", "falcon launch", Boundary(tenant), 10)}


def _as_shared_generation(directory) -> None:
    """Rewrite a generation's files the way the shared-index layout left them: one `index`
    directory with every tenant's documents, no per-tenant pointers, no layout mark."""
    c = sqlite3.connect(directory / "ledger.sqlite")
    rows = c.execute("SELECT unit_id, kind, tenant_id, conversation_id, session_id, agent_ids, occurred_from, occurred_to, body FROM docs").fetchall()
    with c:
        c.execute("DELETE FROM tenant_index")
        c.execute("DELETE FROM meta WHERE key='layout'")
    c.close()
    shutil.rmtree(directory / "tenants")
    (directory / "index").mkdir()
    w = tantivy.Index(_schema(), path=str(directory / "index")).writer(heap_size=16_000_000, num_threads=1)
    probe = TantivyLexicalIndex.__new__(TantivyLexicalIndex)  # only for its document builder
    for r in rows:
        w.add_document(TantivyLexicalIndex._document(probe, _row_doc(r)))
    w.commit()
    w.wait_merging_threads()


def test_each_tenant_has_its_own_index_directory(tmp_path):
    index = TantivyLexicalIndex(tmp_path / "lexical", 1)
    try:
        index.apply(LexicalChangeSet(upsert_docs=[_doc("a1", "falcon launch", "a"), _doc("b1", "falcon", "b")]), {0: 1})
        assert len([p for p in (tmp_path / "lexical" / "tenants").iterdir() if p.is_dir()]) == 2
        assert set(_scores(index, "a")) == {"a1"} and set(_scores(index, "b")) == {"b1"}
        assert _scores(index, "nobody") == {}
    finally:
        index.close()


def test_a_shared_index_generation_is_read_then_moved_to_one_index_per_tenant(tmp_path):
    d = tmp_path / "lexical"
    index = TantivyLexicalIndex(d, 1)
    docs = [_doc("a1", "falcon launch plan", "a"), _doc("a2", "lunch menu", "a"), _doc("a3", "falcon falcon everywhere", "a"),
            *(_doc(f"b{i}", "falcon launch " * (i + 1), "b") for i in range(5))]
    index.apply(LexicalChangeSet(upsert_docs=docs), {0: 1})
    own = _scores(index, "a")
    index.close()

    _as_shared_generation(d)
    old = TantivyLexicalIndex(d, 1)
    try:
        shared = _scores(old, "a")  # read as it is: the same documents, with the shared index's statistics
        assert set(shared) == set(own) and shared != own
        old.apply(LexicalChangeSet(upsert_docs=[_doc("a4", "a falcon launch", "a")]), {0: 2})  # the writer moves it
        moved = _scores(old, "a")
        assert {k: moved[k] for k in own} != own  # (a4 changed tenant a's own statistics)
        assert not (d / "index").exists() and len(list((d / "tenants").iterdir())) == 2
        assert old.positions() == {0: 2}
    finally:
        old.close()
    fresh = TantivyLexicalIndex(tmp_path / "fresh", 1)  # the same documents written per tenant from the start
    try:
        fresh.apply(LexicalChangeSet(upsert_docs=[*docs, _doc("a4", "a falcon launch", "a")]), {0: 2})
        assert _scores(fresh, "a") == moved
    finally:
        fresh.close()
