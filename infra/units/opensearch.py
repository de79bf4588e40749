"""Distributed hierarchy view: trace units with text and provenance in OpenSearch.

One document per unit in `<prefix>-hierarchy-g<N>` (`_id` = unit id): the whole TraceUnit in
`data`, an object OpenSearch keeps in `_source` without parsing or indexing it, plus keyword
and numeric copies of the fields reads filter on. The ledger, versions and positions live in
`<prefix>-hierarchy-g<N>-ledger`; write order and visibility are in infra/opensearch_base.py.
"""

from __future__ import annotations

from infra.opensearch_base import OpenSearchViewBase, all_hits, boundary_filters, conversations, found_docs, scope_filters, term
from infra.turn_docs import micros
from schemas.ports.unit_store import UnitChangeSet
from schemas.ports.views import Boundary, Forget, Positions
from schemas.units import TraceUnit, UnitKind

_KEYWORD = {"type": "keyword"}
_MAPPINGS = {
    "dynamic": "strict",
    "properties": {
        **{name: _KEYWORD for name in ("unit_id", "kind", "tenant_id", "conversation_id", "session_id", "agent_id")},
        "turn_start": {"type": "long"},
        "occurred_from": {"type": "long"}, "occurred_to": {"type": "long"},  # microseconds since the epoch
        "data": {"type": "object", "enabled": False},
    },
}


def _document(u: TraceUnit) -> dict:
    p = u.provenance
    return {
        "unit_id": u.unit_id, "kind": u.kind, "tenant_id": p.tenant_id, "conversation_id": p.conversation_id,
        "session_id": p.session_id, "agent_id": list(p.agent_ids), "turn_start": p.turn_start,
        "occurred_from": micros(p.occurred_from), "occurred_to": micros(p.occurred_to), "data": u.model_dump(mode="json"),
    }


class OpenSearchUnitStore(OpenSearchViewBase):
    view = "hierarchy"

    def _mappings(self) -> dict:
        return _MAPPINGS

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
