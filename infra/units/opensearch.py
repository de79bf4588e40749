"""Distributed hierarchy view: trace units with text and provenance in OpenSearch.

One document per unit in `<prefix>-hierarchy-g<N>` (`_id` = unit id): the whole TraceUnit in
`data`, an object OpenSearch keeps in `_source` without parsing or indexing it, plus keyword
and numeric copies of the fields reads filter on. The ledger, versions and positions live in
`<prefix>-hierarchy-g<N>-ledger`; write order and visibility are in infra/opensearch_base.py.

The bounded query path's reads are term lookups, each costing what it asks for: a unit by its
key (`unit_key`, the number the lexical and dense views answer with), the windows and episodes
holding a turn (`turn_ids`, their member turns), and the ledger's turns by conversation and
session (speakers by a terms aggregation over the ledger's `speaker`, counts, the earliest and
latest turn by a sorted search of size 1).
"""

from __future__ import annotations

from datetime import datetime

from opensearchpy import OpenSearch, helpers

from infra.opensearch_base import (_TRANSIENT_STATUS, OpenSearchViewBase, all_hits, boundary_filters, conversations,
                                   found_docs, scope_filters, term, terms)
from infra.turn_docs import micros
from schemas.errors import StoreError, TransientError
from schemas.ports.unit_store import UnitChangeSet
from schemas.ports.views import Boundary, Forget, Positions
from schemas.units import TraceUnit, UnitKind, unit_key

_KEYWORD = {"type": "keyword"}
_MAPPINGS = {
    "dynamic": "strict",
    "properties": {
        **{name: _KEYWORD for name in ("unit_id", "kind", "tenant_id", "conversation_id", "session_id", "agent_id")},
        "turn_start": {"type": "long"},
        "occurred_from": {"type": "long"}, "occurred_to": {"type": "long"},  # microseconds since the epoch
        "data": {"type": "object", "enabled": False},
        # Format 2: the bounded query path's lookups (module docstring).
        "unit_key": {"type": "long"},  # schemas.units.unit_key: non-negative, 63 bits
        "turn_ids": _KEYWORD,  # a window's or episode's member turns (absent on turns)
    },
}
_TERMS = 10_000  # values per terms query (OpenSearch refuses more than index.max_terms_count, 65,536 by default)
_MSEARCH = 200  # searches per multi-search request


def _keys(u: TraceUnit) -> dict:
    """The fields format 2 added, all derived from the unit itself."""
    return {"unit_key": unit_key(u.unit_id), **({"turn_ids": list(u.turn_ids)} if u.kind != "turn" else {})}


def _document(u: TraceUnit) -> dict:
    p = u.provenance
    return {
        "unit_id": u.unit_id, "kind": u.kind, "tenant_id": p.tenant_id, "conversation_id": p.conversation_id,
        "session_id": p.session_id, "agent_id": list(p.agent_ids), "turn_start": p.turn_start,
        "occurred_from": micros(p.occurred_from), "occurred_to": micros(p.occurred_to), "data": u.model_dump(mode="json"),
        **_keys(u),
    }


def _chunks(items: list, size: int) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]


class OpenSearchUnitStore(OpenSearchViewBase):
    view = "hierarchy"
    # 2: unit_key and turn_ids on the units, the ledger's speaker indexed (migrated in place).
    format_version = 2

    def _mappings(self) -> dict:
        return _MAPPINGS

    def _migrate_documents(self, client: OpenSearch, found: int) -> None:
        """Format 1 -> 2: add the new fields to the mapping, then to every unit that lacks them
        (computed from its `data`), and re-index the ledger's turns, whose `speaker` (in their
        source already) is indexed from now on. Each unit is updated only if it is still the
        version read (`if_seq_no`): a writer that replaced it meanwhile wrote the new fields itself."""
        added = {k: _MAPPINGS["properties"][k] for k in ("unit_key", "turn_ids")}
        client.indices.put_mapping(index=self.index, body={"properties": added})
        lacking = {"query": {"bool": {"must_not": [{"exists": {"field": "unit_key"}}]}}, "_source": ["data"],
                   "seq_no_primary_term": True}
        batch: list[dict] = []
        for hit in helpers.scan(client, index=self.index, query=lacking, size=1_000):
            batch += [{"update": {"_index": self.index, "_id": hit["_id"], "if_seq_no": hit["_seq_no"],
                                  "if_primary_term": hit["_primary_term"]}},
                      {"doc": _keys(TraceUnit.model_validate(hit["_source"]["data"]))}]
            if len(batch) >= 2_000:
                self._migration_bulk(client, batch)
                batch = []
        self._migration_bulk(client, batch)
        unindexed = {"bool": {"filter": [term("type", "turn")], "must_not": [{"exists": {"field": "speaker"}}]}}
        client.update_by_query(index=self.ledger_index, body={"query": unindexed}, conflicts="proceed", refresh=True,
                               request_timeout=600)
        client.indices.refresh(index=self.index)

    def _migration_bulk(self, client: OpenSearch, body: list[dict]) -> None:
        """Send a migration's updates; a unit replaced (409) or deleted (404) since it was read is left as it is."""
        if not body:
            return
        resp = client.bulk(body=body)
        items = [i["update"] for i in resp["items"]]
        failed = [i for i in items if "error" in i and i.get("status") not in (404, 409)]
        if failed:
            raise StoreError(f"OpenSearch refused {len(failed)} updates while migrating {self.index} to format "
                             f"{self.format_version} ({failed[0]['error']}); the migration is retried the next time "
                             "the store opens")

    # -- writes --------------------------------------------------------------------------
    def apply(self, change: UnitChangeSet, positions: Positions) -> None:
        with self._lock, self._translate("applying a hierarchy change set"):
            for forget in change.forgets:  # first in the order of schemas/ports/views.py ChangeSet
                self._forget_units(forget)
            deletes = list(dict.fromkeys(change.delete_units))
            touched = conversations(found_docs(self._os(), self.index, deletes, ["tenant_id", "conversation_id"]))
            touched.update((u.provenance.tenant_id, u.provenance.conversation_id) for u in change.upsert_units)
            self._bulk([{"_op_type": "delete", "_index": self.index, "_id": uid} for uid in deletes]
                       + [{"_op_type": "index", "_index": self.index, "_id": u.unit_id, "_source": _document(u)} for u in change.upsert_units],
                       "writing units")
            touched |= self._ledger_removals(change)
            touched |= self._put_turns(change.put_turns)  # last before the positions (schemas/ports/views.py ChangeSet)
            self._commit(touched, positions, change)

    def _forget_units(self, forget: Forget) -> None:
        if forget.scope.partial:  # a partial scope's sessions survive: the projection recomputes their units
            return
        self._os().delete_by_query(index=self.index, body={"query": {"bool": {"filter": scope_filters(forget)}}}, refresh=True, conflicts="proceed")

    # -- reads ---------------------------------------------------------------------------
    def _units(self, filters: list[dict], what: str) -> list[TraceUnit]:
        with self._translate(what):
            hits = all_hits(self._os(), self.index, {"bool": {"filter": filters}}, source=["data"])
        return [TraceUnit.model_validate(h["_source"]["data"]) for h in hits]

    def get_units(self, tenant_id: str, unit_ids: list[str]) -> dict[str, TraceUnit]:
        if not unit_ids:
            return {}
        with self._translate("reading units"):
            found = found_docs(self._os(), self.index, unit_ids, ["tenant_id", "data"])
        return {d["_id"]: TraceUnit.model_validate(d["_source"]["data"]) for d in found if d["_source"]["tenant_id"] == tenant_id}

    def list_units(self, boundary: Boundary, kind: UnitKind) -> list[TraceUnit]:
        units = self._units([term("kind", kind), *boundary_filters(boundary)], "listing units")
        # The SQLite twin's order: conversation, session (by its earliest unit inside the
        # boundary), turn position, unit id.
        session_start: dict[tuple[str, str], object] = {}
        for u in units:
            key = (u.provenance.conversation_id, u.provenance.session_id)
            start = session_start.get(key)
            if start is None or u.provenance.occurred_from < start:
                session_start[key] = u.provenance.occurred_from
        return sorted(
            units,
            key=lambda u: (u.provenance.conversation_id, session_start[(u.provenance.conversation_id, u.provenance.session_id)],
                           u.provenance.session_id, u.provenance.turn_start, u.unit_id),
        )

    # -- the bounded query path's reads (schemas/ports/unit_store.py) -------------------------
    def units_by_keys(self, tenant_id: str, keys: list[int]) -> dict[int, TraceUnit]:
        out: dict[int, TraceUnit] = {}
        with self._translate("reading units by key"):
            for chunk in _chunks([int(k) for k in dict.fromkeys(keys)], _TERMS):
                query = {"bool": {"filter": [term("tenant_id", tenant_id), terms("unit_key", chunk)]}}
                for h in all_hits(self._os(), self.index, query, source=["unit_key", "data"]):
                    out[int(h["_source"]["unit_key"])] = TraceUnit.model_validate(h["_source"]["data"])
        return out

    def containing(self, tenant_id: str, turn_ids: list[str]) -> dict[str, list[str]]:
        out: dict[str, set[str]] = {}
        with self._translate("reading the units that hold turns"):
            for chunk in _chunks(list(dict.fromkeys(turn_ids)), _TERMS):
                wanted = set(chunk)
                query = {"bool": {"filter": [term("tenant_id", tenant_id), terms("turn_ids", chunk)]}}
                for h in all_hits(self._os(), self.index, query, source=["turn_ids"]):
                    for turn_id in wanted.intersection(h["_source"]["turn_ids"]):
                        out.setdefault(turn_id, set()).add(h["_id"])
        return {turn_id: sorted(units) for turn_id, units in sorted(out.items())}

    def _conversation_turns(self, b: Boundary) -> list[dict]:
        """Ledger filters for the turns of the boundary's conversations (tenant and conversations only)."""
        return self._ledger_boundary(Boundary(b.tenant_id, b.conversation_ids))

    def speakers(self, boundary: Boundary) -> list[str]:
        """A composite aggregation over the ledger's speakers, a page at a time (a conversation has a handful)."""
        out: list[str] = []
        composite = {"size": 1_000, "sources": [{"speaker": {"terms": {"field": "speaker"}}}]}
        body: dict = {"size": 0, "query": {"bool": {"filter": self._conversation_turns(boundary)}},
                      "aggs": {"speakers": {"composite": composite}}}
        with self._translate("reading speakers"):
            while True:
                agg = self._os().search(index=self.ledger_index, body=body)["aggregations"]["speakers"]
                out += [b["key"]["speaker"] for b in agg["buckets"]]
                if not agg["buckets"] or "after_key" not in agg:
                    return sorted(out)
                composite["after"] = agg["after_key"]

    def size(self, boundary: Boundary) -> int:
        with self._translate("counting turns"):
            query = {"bool": {"filter": self._conversation_turns(boundary)}}
            return int(self._os().count(index=self.ledger_index, body={"query": query})["count"])

    def _edge_turn(self, filters: list[dict], order: str) -> dict:
        """The search for the earliest ("asc") or latest ("desc") turn among `filters`."""
        return {"size": 1, "query": {"bool": {"filter": filters}}, "_source": ["occurred_at"],
                "sort": [{"occurred_us": order}, {"turn_id": order}]}

    def latest(self, boundary: Boundary) -> datetime | None:
        filters = self._ledger_boundary(Boundary(boundary.tenant_id, boundary.conversation_ids, boundary.session_ids))
        with self._translate("reading the latest turn"):
            hits = self._os().search(index=self.ledger_index, body=self._edge_turn(filters, "desc"))["hits"]["hits"]
        return datetime.fromisoformat(hits[0]["_source"]["occurred_at"]) if hits else None

    def session_starts(self, tenant_id: str, sessions: list[tuple[str, str]]) -> dict[tuple[str, str], datetime]:
        """One sorted search of size 1 per session, sent together (multi-search)."""
        out: dict[tuple[str, str], datetime] = {}
        with self._translate("reading sessions' first turns"):
            for chunk in _chunks(list(dict.fromkeys(sessions)), _MSEARCH):
                body: list[dict] = []
                for conversation_id, session_id in chunk:
                    body += [{"index": self.ledger_index}, self._edge_turn(
                        [term("type", "turn"), term("tenant_id", tenant_id), term("conversation_id", conversation_id),
                         term("session_id", session_id)], "asc")]
                for key, resp in zip(chunk, self._os().msearch(body=body)["responses"]):
                    if "error" in resp:
                        error = TransientError if resp.get("status") in _TRANSIENT_STATUS else StoreError
                        raise error(f"OpenSearch at {self.url} failed reading a session's first turn (HTTP "
                                    f"{resp.get('status')}: {resp['error']})")
                    if resp["hits"]["hits"]:
                        out[key] = datetime.fromisoformat(resp["hits"]["hits"][0]["_source"]["occurred_at"])
        return out

    def session_unit_ids(self, tenant_id: str, conversation_id: str, session_id: str) -> set[str]:
        with self._translate("listing a session's units"):
            hits = all_hits(self._os(), self.index, {"bool": {"filter": [
                term("tenant_id", tenant_id), term("conversation_id", conversation_id), term("session_id", session_id)]}}, source=False)
        return {h["_id"] for h in hits}

    def canonical_dump(self) -> dict:
        with self._translate("dumping units"):
            hits = all_hits(self._os(), self.index, {"match_all": {}}, source=["data"])
        units = sorted((h["_source"]["data"] for h in hits), key=lambda d: d["unit_id"])
        return {"view": self.view, "turns": self.ledger_dump(), "units": units}
