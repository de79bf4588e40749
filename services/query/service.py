"""The query service: request -> boundary -> corpus -> strategy -> evidence within the budget.

Evidence assembly is the same for every strategy: units in rank order, each contributing its
turns in time order, until `max_turns` distinct turns (the last unit may be cut). Every evidence
item carries its turns' event ids and log positions.
"""

from __future__ import annotations

import time
from typing import Callable

from schemas.errors import BadRequest, ViewUnavailable
from schemas.ports.views import Boundary, read_scope
from schemas.query import Evidence, SearchRequest, SearchResponse
from services.query import baselines
from services.query.candidates import candidate_corpus
from services.query.config import DEFAULT_BOUNDS, Bounds
from services.query.context import Candidate, Guarded, QueryContext, Ranking, unavailable_as
from services.query.corpus import Corpus, CorpusCache

StrategyFn = Callable[[QueryContext], Ranking]


class QueryService:
    def __init__(self, views, encoder, extractor=None, strategies: dict[str, StrategyFn] | None = None, encoders=None,
                 bounds: Bounds | None = DEFAULT_BOUNDS):
        """`encoders(name)`: the encoder of that name (infra/registry.py `encoder`), so that each view's
        live generation has its question encoded by the model it was built with (after the
        configuration names a new encoder, until a replay switches the view). Without it, `encoder`
        serves every view. `bounds`: the bounded path's sizes (services/query/candidates.py) for the
        strategies that take it (BOUNDED); None ranks every turn of the boundary (the whole path)."""
        self.bounds = bounds
        self.views = views
        self.encoder = encoder
        self.encoders = encoders
        self.extractor = extractor
        self.corpora = CorpusCache()
        self.strategies: dict[str, StrategyFn] = strategies or default_strategies()

    def start(self) -> None:
        """Load the models (explicitly, not in the constructor), and warm the single-text
        encoder path so that the first question does not pay for the runtime's first call."""
        self.encoder.start()
        self.encoder.encode_states("warm up")
        if self.extractor is not None:
            self.extractor.start()

    def _encoder_for(self, view: str, generation: int | None):
        if self.encoders is None:
            return self.encoder
        model = self.views.model(view, generation)
        return self.encoder if model is None else self.encoders(model)

    def boundary(self, r: SearchRequest) -> Boundary:
        return Boundary(
            tenant_id=r.tenant_id,
            conversation_ids=(r.conversation_id,) if r.conversation_id else None,
            session_ids=(r.session_id,) if r.session_id else None,
            agent_ids=(r.agent_id,) if r.agent_id else None,
            since=r.since,
            until=r.until,
        )

    def search(self, request: SearchRequest) -> SearchResponse:
        with read_scope():  # one version per store and conversation for the whole request
            return self._search(request)

    def _search(self, request: SearchRequest) -> SearchResponse:
        t0 = time.perf_counter()
        strategy = self.strategies.get(request.strategy)
        if strategy is None:
            raise BadRequest(f"strategy {request.strategy!r} is not available; available: {', '.join(self.strategies)}")
        boundary = self.boundary(request)
        if request.since and request.until and request.since > request.until:  # an empty range holds no turns
            return SearchResponse(strategy=request.strategy, route=None, profile={}, evidence=[], budget_turns=request.max_turns,
                                  backends={}, timings_ms={"total": round((time.perf_counter() - t0) * 1000, 3)}, llm_tokens=0,
                                  notes=["'since' is after 'until': the range holds no turns"])
        with unavailable_as("hierarchy"):
            raw = self.views.store("hierarchy")
        units = Guarded(raw, "hierarchy")  # no fallback without it: a 503 naming it
        used, notes, down = request.strategy, [], set()
        while True:
            bounded = self.bounds is not None and used in BOUNDED
            corpus = None
            if not bounded:
                with unavailable_as("hierarchy"):
                    corpus = self.corpora.get(raw, boundary)  # (the cache keys on the store itself)
            ctx = QueryContext(request, boundary, corpus, self.views, self.encoder, self.extractor, self._encoder_for)
            if bounded:
                ctx.bounds = self.bounds
                with unavailable_as("hierarchy"):
                    ctx.corpus = corpus = candidate_corpus(ctx, self.bounds)
            ctx.timings["corpus"] = (time.perf_counter() - t0) * 1000
            ctx.backends["hierarchy"] = units.backend
            # Asked only of an empty corpus (one round trip fewer per search on a server).
            if corpus.n == 0 and not units.known_tenant(request.tenant_id):  # a new tenant's first recall: nothing yet
                return SearchResponse(strategy=request.strategy, route=None, profile={}, evidence=[], budget_turns=request.max_turns,
                                      backends={"hierarchy": units.backend},
                                      timings_ms={"total": round((time.perf_counter() - t0) * 1000, 3)},
                                      llm_tokens=0, notes=[f"tenant {request.tenant_id!r} holds no memory yet"])
            try:
                ranking = Ranking([], notes=["the boundary holds no turns"]) if corpus.n == 0 else self.strategies[used](ctx)
                break
            except ViewUnavailable as exc:
                down.add(exc.view)
                fallback = fallback_for(used, down)
                if exc.view == "hierarchy" or fallback is None or fallback not in self.strategies:
                    raise ViewUnavailable(", ".join(sorted(down)), exc.reason) from exc
                notes.append(f"the {exc.view} view is unavailable ({exc.reason}); answered with {fallback} instead of {used}")
                used = fallback
        with ctx.timed("evidence"):
            evidence = assemble(corpus, ranking.candidates, request.max_turns)
        ctx.timings["total"] = (time.perf_counter() - t0) * 1000
        return SearchResponse(
            strategy=used, route=ranking.route, profile=getattr(ctx, "profile_dict", {}), evidence=evidence,
            budget_turns=request.max_turns, backends=ctx.backends, timings_ms={k: round(v, 3) for k, v in ctx.timings.items()},
            llm_tokens=0, notes=[*notes, *ranking.notes],
        )


# Which views each strategy reads besides the hierarchy (its corpus), and what answers without a
# missing one: the graph view's absence leaves the hierarchy view; then BM25 or dense alone.
VIEWS_READ = {
    "zero-mem": {"graph", "lexical", "dense"}, "graph-only": {"graph", "lexical", "dense"}, "no-closure": {"graph", "lexical", "dense"},
    "no-calibration": {"graph", "lexical", "dense"}, "hierarchy-only": {"lexical", "dense"}, "hybrid-rrf": {"lexical", "dense"},
    "raw-rag": {"dense"}, "pyramid": {"lexical", "dense"}, "bm25": {"lexical"}, "dense": {"dense"},
}
FALLBACKS = ("hierarchy-only", "bm25", "dense")
# The strategies that run on a question's candidates (services/query/candidates.py) when the
# service has bounds; raw-rag and pyramid index or scan the whole boundary by design (baselines).
BOUNDED = frozenset({"zero-mem", "graph-only", "hierarchy-only", "no-closure", "no-calibration", "bm25", "dense", "hybrid-rrf"})


def fallback_for(strategy: str, down: set[str]) -> str | None:
    """The first fallback that reads none of the views that are down (None: there is none)."""
    return next((f for f in FALLBACKS if f != strategy and not VIEWS_READ.get(f, set()) & down), None)


def default_strategies() -> dict[str, StrategyFn]:
    from services.query import zeromem

    return {
        **{mode: zeromem.strategy(mode) for mode in zeromem.MODES},
        "bm25": baselines.bm25,
        "dense": baselines.dense,
        "hybrid-rrf": baselines.hybrid_rrf,
        "raw-rag": baselines.RawRag(),
        "pyramid": baselines.pyramid,
    }


def assemble(corpus: Corpus, candidates: list[Candidate], budget: int) -> list[Evidence]:
    out: list[Evidence] = []
    taken: set[int] = set()
    for c in candidates:
        if len(taken) >= budget:
            break
        new = [i for i in sorted(c.turns) if i not in taken]
        if not new:
            continue
        room = budget - len(taken)
        counted = new[:room]
        taken.update(counted)
        turns = [corpus.turns[i] for i in sorted(counted)]
        unit = corpus.unit(c.unit_id)
        # A unit's own text only when every member is shown: a member outside the budget, the
        # boundary or superseded by a correction (corpus.py) leaves the text of the rest.
        whole = unit is not None and len(counted) == len(c.turns) == len(unit.turn_ids)
        text = unit.text if whole else "\n".join(f"{t.provenance.speakers[0]}: {t.text}" for t in turns)
        out.append(  # model_construct: every field comes from already-validated units (~2 us less per object)
            Evidence.model_construct(
                rank=len(out) + 1, unit_id=c.unit_id, kind=c.kind, role=c.role, score=round(c.score, 6), text=text,
                conversation_id=turns[0].provenance.conversation_id, session_id=turns[0].provenance.session_id,
                occurred_from=min(t.provenance.occurred_from for t in turns), occurred_to=max(t.provenance.occurred_to for t in turns),
                turns=[corpus.turn_ref(i) for i in sorted(counted)],
                scores={k: round(v, 6) for k, v in c.scores.items()},
            )
        )
    return out
