""""Ready" for the evaluation and benchmark runs: every view has caught up and every unit kind
answers a query in every conversation. Shared by `memstream eval locomo` (services/eval/locomo.py)
and `memstream bench ingest` (services/bench/ingest.py), whose add -> ready time ends here."""

from __future__ import annotations

from schemas.ports.views import Boundary
from schemas.units import entity_id


async def check_answering(pipeline, encoder, tenant: str, conversations: list[str]) -> None:
    """Raise RuntimeError naming the conversation and the view that does not answer yet."""
    if any(s.lag_events for s in await pipeline.status()):
        raise RuntimeError("a view still lags after the run")
    qv = encoder.encode(["what did they talk about"])[0]
    graph, lexical, hierarchy, dense = (pipeline.store(v) for v in ("graph", "lexical", "hierarchy", "dense"))
    for conv in conversations:
        b = Boundary(tenant, (conv,))
        for kind in ("turn", "window", "episode"):
            if not (hierarchy.list_units(b, kind) and lexical.search(kind, "talk", b, 1)):
                raise RuntimeError(f"{conv}: no {kind} is searchable after the views caught up")
        for kind in ("turn", "window", "episode", "sentence"):
            if not dense.search(kind, qv, b, 1):
                raise RuntimeError(f"{conv}: no {kind} vector is searchable after the views caught up")
        match = graph.align_entities(b, [entity_id(tenant, "talk")], qv[None, :], 1)[0]
        if not (match and graph.personalized_pagerank(b, {match[0].entity_id: 1.0}, 0.6)):
            raise RuntimeError(f"{conv}: the graph view does not answer after the views caught up")
