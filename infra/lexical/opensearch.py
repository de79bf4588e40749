"""Distributed lexical view: BM25 over turns, windows and episodes in OpenSearch.

One generation is two indices (infra/opensearch_base.py): `<prefix>-lexical-g<N>` holds one
document per unit (`_id` = unit id) and `<prefix>-lexical-g<N>-ledger` the turn ledger, the
conversation versions and the positions. See that module for the write order and visibility.

Scoring. Scores are OpenSearch's BM25 (k1 = 1.2, b = 0.75, like tantivy): the text clause is
the only scoring clause, every filter (tenant, kind, boundary) sits in `bool.filter`, which
does not score. The analyzer mirrors tantivy's `en_stem` (split on non-alphanumerics,
lowercase, drop tokens of 40+ characters, Snowball/Porter2 English stemming, no stop words),
so both backends see the same terms and the query side's stemming agrees with the index's.

One index per tenant (`<prefix>-lexical-g<N>-t<digest>`, made at the tenant's first write), for
the reason the tantivy twin gives: BM25's statistics are an index's (a shard's), so in a shared
index a tenant's scores moved whenever another tenant wrote. With one primary shard (the
default) a tenant's statistics are exactly its own. The indices are the generation's (the
catalog's `<index>-<letters>` naming), so a dropped generation takes them with it. A
generation written before this keeps its one shared index `<prefix>-lexical-g<N>` until a replay.
"""

from __future__ import annotations

import numpy as np
from opensearchpy import OpenSearch

from infra.opensearch_base import OpenSearchViewBase, all_hits, boundary_filters, found_docs, scope_filters, term
from infra.turn_docs import micros
from schemas.ports.lexical import LexicalChangeSet, LexicalDoc
from schemas.ports.views import Boundary, Forget, Hit, Positions
from schemas.text import words
from schemas.units import UnitKind, tenant_digest, unit_key

_PAGE = 10_000  # OpenSearch's default max_result_window
_HIT_FIELDS = "hits.hits._score,hits.hits.fields,hits.hits.sort"  # the response carries nothing else
_LETTERS = str.maketrans("0123456789abcdef", "abcdefghijklmnop")  # index suffixes are letters (infra/opensearch_base.generation_of)

_ANALYSIS = {
    "tokenizer": {"memstream_simple": {"type": "pattern", "pattern": "[^\\p{L}\\p{N}]+"}},
    "filter": {
        "memstream_long": {"type": "length", "max": 39},
        "memstream_porter2": {"type": "stemmer", "language": "porter2"},
    },
    "analyzer": {"memstream_en": {"type": "custom", "tokenizer": "memstream_simple", "filter": ["lowercase", "memstream_long", "memstream_porter2"]}},
}

_KEYWORD = {"type": "keyword"}
_MAPPINGS = {
    "dynamic": "strict",
    "properties": {
        "unit_id": _KEYWORD, "key": {"type": "long"}, "kind": _KEYWORD, "tenant_id": _KEYWORD, "conversation_id": _KEYWORD,
        "session_id": _KEYWORD, "agent_id": _KEYWORD,  # multi-valued
        "occurred_from": {"type": "long"}, "occurred_to": {"type": "long"},  # microseconds since the epoch
        "body": {"type": "text", "analyzer": "memstream_en"},
    },
}


def _document(d: LexicalDoc) -> dict:
    return {
        "unit_id": d.unit_id, "key": unit_key(d.unit_id), "kind": d.kind, "tenant_id": d.tenant_id, "conversation_id": d.conversation_id,
        "session_id": d.session_id, "agent_id": list(d.agent_ids), "occurred_from": micros(d.occurred_from),
        "occurred_to": micros(d.occurred_to), "body": d.text,
    }


class OpenSearchLexicalIndex(OpenSearchViewBase):
    view = "lexical"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._shared = False  # an older generation's one shared index (found at start)
        self._made: set[str] = set()  # tenant indices known to exist
        self._written: set[str] = set()  # document indices the change set being applied wrote

    def _mappings(self) -> dict:
        return _MAPPINGS

    def _analysis(self) -> dict:
        return _ANALYSIS

    def _shared_document_index(self, client: OpenSearch) -> bool:
        self._shared = bool(client.indices.exists(index=self.index))
        return self._shared

    def _document_indices(self) -> list[str]:
        return sorted(self._written)

    def _tenant_index(self, tenant_id: str) -> str:
        if self._shared:
            return self.index
        return f"{self.index}-t{tenant_digest(tenant_id).translate(_LETTERS)}"

    def _all_indices(self) -> str:
        return f"{self.index},{self.index}-t*" if self._shared else f"{self.index}-t*"

    def _writing(self, tenant_id: str, create: bool = True) -> str | None:
        """The tenant's index, made on its first write (or None when it has none and `create` is
        false), noted as written by this change set."""
        name = self._tenant_index(tenant_id)
        if name not in self._made:
            if not create and not self._os().indices.exists(index=name):
                return None
            self._create(self._os(), name, self._index_body())
            self._made.add(name)
        self._written.add(name)
        return name

    def destroy(self) -> None:
        with self._translate("deleting indices"):
            client = self._connection()
            found = client.indices.get(index=f"{self.index}-t*", ignore_unavailable=True, allow_no_indices=True, expand_wildcards="all")
            for name in sorted(found):  # by name: clusters may refuse wildcard deletes
                client.indices.delete(index=name, ignore_unavailable=True)
        super().destroy()

    # -- writes --------------------------------------------------------------------------
    def apply(self, change: LexicalChangeSet, positions: Positions) -> None:
        with self._lock, self._translate("applying a lexical change set"):
            self._os()
            self._written = set()
            for forget in change.forgets:  # first in the order of schemas/ports/views.py ChangeSet
                self._forget_docs(forget)
            deletes = self._located(list(dict.fromkeys([*change.delete_docs, *change.delete_turns])))
            touched = {(h["_source"]["tenant_id"], h["_source"]["conversation_id"]) for h in deletes}
            touched.update((d.tenant_id, d.conversation_id) for d in change.upsert_docs)
            # One bulk, deletes first: ops on one id are applied in request order.
            self._bulk([{"_op_type": "delete", "_index": self._writing(h["_source"]["tenant_id"]), "_id": h["_id"]} for h in deletes]
                       + [{"_op_type": "index", "_index": self._writing(d.tenant_id), "_id": d.unit_id, "_source": _document(d)}
                          for d in change.upsert_docs],
                       "writing lexical documents")
            touched |= self._ledger_removals(change)
            touched |= self._put_turns(change.put_turns)  # last before the positions (schemas/ports/views.py ChangeSet)
            self._commit(touched, positions, change)

    def _forget_docs(self, forget: Forget) -> None:
        index = self._writing(forget.tenant_id, create=False)
        if index is None:  # nothing of the tenant was ever written here
            return
        if forget.scope.partial:
            # The turns' own documents; their sessions' windows/episodes are recomputed by the projection.
            ids = [t.turn_id for t in self.turns_in_scope(forget)]
            self._bulk([{"_op_type": "delete", "_index": index, "_id": uid} for uid in ids], "forgetting turns")
            return
        self._os().delete_by_query(index=index, body={"query": {"bool": {"filter": scope_filters(forget)}}}, refresh=True, conflicts="proceed")

    def _located(self, unit_ids: list[str]) -> list[dict]:
        """The stored documents among `unit_ids` ({_id, _source: tenant_id, conversation_id}),
        whichever tenant's index holds them."""
        if not unit_ids:
            return []
        if self._shared:  # realtime lookups in the one index
            return found_docs(self._os(), self.index, unit_ids, ["tenant_id", "conversation_id"])
        # Not all_hits: a terms query holds at most 65,536 ids (index.max_terms_count), so the chunks
        # stay and none needs a scroll; and all_hits passes no request options (ignore_unavailable...).
        out: list[dict] = []
        for start in range(0, len(unit_ids), _PAGE):
            chunk = unit_ids[start:start + _PAGE]
            out.extend(self._os().search(index=self._all_indices(), body={
                "query": {"bool": {"filter": [{"terms": {"unit_id": chunk}}]}}, "size": len(chunk), "_source": ["tenant_id", "conversation_id"]},
                ignore_unavailable=True, allow_no_indices=True, filter_path="hits.hits._id,hits.hits._source").get("hits", {}).get("hits", []))
        return out

    # -- reads ---------------------------------------------------------------------------
    @staticmethod
    def _query(kind: UnitKind | None, query: str, boundary: Boundary) -> dict | None:
        # Same pre-tokenisation as the tantivy twin (apostrophes dropped); the engine analyses the rest.
        text = " ".join(t for t in (w.replace("'", "").replace("’", "") for w in words(query)) if t)
        if not text:
            return None
        return {"bool": {"must": [{"match": {"body": {"query": text}}}], "filter": [*([term("kind", kind)] if kind is not None else []), *boundary_filters(boundary)]}}

    def _search(self, boundary: Boundary, body: dict) -> list[dict]:
        """A search of the boundary's tenant's index (none yet: no hits)."""
        return self._os().search(index=self._tenant_index(boundary.tenant_id), body=body, filter_path=_HIT_FIELDS,
                                 ignore_unavailable=True).get("hits", {}).get("hits", [])

    def _ranked(self, q: dict, boundary: Boundary, limit: int, what: str, field: str) -> list[dict]:
        """The top `limit` hits, best first, ties by unit id (the twin's order); pages past
        max_result_window with search_after. Each hit carries only its score and `field` from
        doc values: loading every hit's stored `_id` cost the engine ~30 µs a hit (a dev-split
        conversation scored whole, ~1,000 hits: 36 ms of engine time with it, 4 ms without)."""
        out: list[dict] = []
        with self._translate(what):
            while len(out) < limit:
                body = {"query": q, "size": min(_PAGE, limit - len(out)), "_source": False, "stored_fields": "_none_", "track_scores": True,
                        "docvalue_fields": [field], "sort": [{"_score": "desc"}, {"unit_id": "asc"}]}
                if out:
                    body["search_after"] = out[-1]["sort"]
                hits = self._search(boundary, body)
                out.extend(hits)
                if len(hits) < body["size"]:
                    break
        return out

    def search(self, kind: UnitKind, query: str, boundary: Boundary, k: int) -> list[Hit]:
        q = self._query(kind, query, boundary)
        if q is None or k <= 0:
            return []
        return [Hit(h["fields"]["unit_id"][0], float(h["_score"])) for h in self._ranked(q, boundary, k, "searching the lexical index", "unit_id")]

    def score_units(self, kind: UnitKind | None, query: str, boundary: Boundary, limit: int) -> tuple[np.ndarray, np.ndarray]:
        q = self._query(kind, query, boundary)
        if q is None or limit <= 0:
            return np.zeros(0, np.int64), np.zeros(0)
        # One request below the page size, unsorted (the engine's sort on a second key doubles its
        # time here); the order is made after, the same: score, then key.
        return self.score_units_query(q, boundary, limit)

    def score_ids(self, kind: UnitKind | None, query: str, boundary: Boundary, unit_ids: list[str]) -> tuple[np.ndarray, np.ndarray]:
        q = self._query(kind, query, boundary)
        if q is None or not unit_ids:
            return np.zeros(0, np.int64), np.zeros(0)
        q["bool"]["filter"].append({"terms": {"unit_id": sorted(set(unit_ids))}})
        return self.score_units_query(q, boundary, len(set(unit_ids)))

    def score_units_query(self, q: dict, boundary: Boundary, limit: int) -> tuple[np.ndarray, np.ndarray]:
        if limit > _PAGE:
            hits = self._ranked(q, boundary, limit, "scoring units in the lexical index", "key")
        else:
            with self._translate("scoring units in the lexical index"):
                hits = self._search(boundary, {"query": q, "size": limit, "_source": False, "stored_fields": "_none_",
                                               "docvalue_fields": ["key"]})
        keys = np.asarray([h["fields"]["key"][0] for h in hits], dtype=np.int64)
        scores = np.asarray([h["_score"] for h in hits], dtype=float)
        order = np.lexsort((keys, -scores))
        return keys[order], scores[order]

    def canonical_dump(self) -> dict:
        with self._translate("dumping the lexical index"):
            hits = all_hits(self._os(), self._all_indices(), {"match_all": {}}, source=["unit_id", "body"])
        docs = sorted((h["_source"]["unit_id"], h["_source"]["body"]) for h in hits)
        return {"view": self.view, "turns": self.ledger_dump(), "docs": [list(d) for d in docs]}
