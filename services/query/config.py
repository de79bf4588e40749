"""Every tuned constant of the Zero-Mem query service, in one place.

Values are the ones `memstream eval locomo PATH --loco` selects on all five LoCoMo dev
conversations (services/eval/loco.py: coordinate descent over its GRID); the headline figure for
them is the same procedure's leave-one-conversation-out estimate (tune on four conversations,
score the fifth, every fold). docs/results/retrieval.md gives both, with
intervals, and the command. The paper's own constants are noted where it gives
them (rho = gamma = 0.6, K = 5). Re-selected 2026-12-04, when the NER gate became the default
(infra/models/ner_gate.py) and the search began to start from the middle of each constant's
candidates instead of these values (which had been chosen on every conversation, the held-out one
included); the recall figures quoted in comments below were measured with the selection before
(in-sample 0.8396 / 0.9000).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal


@dataclass(frozen=True)
class ZeroMemConfig:
    # -- hierarchy view (eq. 11): relevance of each level = a_lex * BM25 + (1 - a_lex) * dense,
    #    each min-max normalised per query; turns get their own relevance plus the best score
    #    of the windows and episode that contain them ("lifting").
    a_lex: float = 0.7
    w_turn: float = 0.4
    w_windows: tuple[float, ...] = (1.5, 1.0)  # per window size, smallest first
    w_episode: float = 0.5
    w_neighbour: float = 0.2  # best turn relevance among the ±1 neighbours in the session
    h_lexical: float = 0.0  # share of the question's keywords the turn contains
    h_info: float = 0.7  # information prior: log(words)/log(40), clipped to [0, 1]
    prf_weight: float = 0.0  # dense pseudo-relevance feedback (Rocchio) share; 0 = off
    prf_k: int = 3
    prf_alpha: float = 0.5
    # lexical pseudo-relevance feedback (RM3-like): the top turns' most distinctive words become
    # a second BM25 query, mixed into the turn relevance
    lexical_prf_weight: float = 0.4
    lexical_prf_docs: int = 5
    lexical_prf_terms: int = 10
    lexical_prf_types: tuple[str, ...] = ("list", "description")
    # -- profile
    # How the question's entities are found: "lexicon" matches capitalised phrases against the
    # names the boundary's graph already knows (~0.1 ms); "ner" runs the NER model on the
    # question (~4-6 ms on these CPUs). Same recall on the dev split (in-sample 0.8396 / 0.9000
    # vs 0.839 / 0.900; leave-one-conversation-out 0.8325 / 0.895 vs 0.832 / 0.895), so the
    # cheaper one is the default.
    question_entities: Literal["ner", "lexicon"] = "lexicon"
    # -- graph view (eq. 8-10)
    align_min: float = 0.5  # min cosine for aligning a query entity to a graph entity
    keyword_activation: float = 1.0  # activation of keyword nodes matched by stem
    propagation_steps: int = 1  # eq. 9
    propagation_weight: float = 1.0
    beta_entities: float = 0.9  # reset mass on entity activations; the rest on dense context priors
    prior_top: int = 20  # contexts that receive a dense prior
    adjacency_weight: float = 1.0
    hub_share: float = 0.3  # entities mentioned by more than this share of the contexts are left out of the walk
    gamma: float = 0.7  # PPR continuation (paper: 0.6)
    # Power-iteration steps. Started from the reset vector the walk is near its fixed point
    # early: recall is the same with an exact solve (sparse LU), 30 and 20 steps (0.8396 / 0.9000
    # in-sample); 15 steps lose 0.0002 at B=25. Fewer steps: ~25 us less per step and query.
    ppr_iterations: int = 20
    g_lexical: float = 0.2  # exact lexical refinement of the graph ranking
    # -- routing and fusion (eq. 7, 12-13)
    route: Literal["rules", "local", "relational"] = "local"
    rho: float = 0.6  # primary view weight (paper: 0.6)
    # -- closure (eq. 14)
    closure_top: int = 1  # seeds: the top of M(q)
    closure_graph: int = 0  # bridging contexts added from a PPR seeded on them (speakers excluded)
    closure_bonus: float = 0.05
    closure_gamma: float = 0.6
    closure_iterations: int = 10  # exact solve, 20, 10 and 5 steps: the same recall (0.8396 / 0.9000)
    closure_neighbours: int = 0  # ±r neighbouring turns of the seeds
    neighbour_bonus: float = 0.0
    # -- evidence calibration (eq. 15)
    c_subject: float = 0.2
    c_type: float = 0.2
    c_subject_relational: float = 0.2
    c_type_relational: float = 0.2
    c_time: float = 0.4
    time_tau_days: float = 14.0
    # answer label: the entity label whose description (the NER model's own glossary) is most
    # similar to the noun a what/which question asks for ("books" -> WORK_OF_ART)
    c_label: float = 0.2
    label_min: float = 0.3
    extra: dict[str, Any] = field(default_factory=dict)

    def with_(self, **changes: Any) -> "ZeroMemConfig":
        return replace(self, **changes)

    @classmethod
    def keys(cls) -> list[str]:
        return [f.name for f in fields(cls) if f.name != "extra"]


DEFAULT = ZeroMemConfig()


@dataclass(frozen=True)
class Bounds:
    """How much of a boundary one question reads on the bounded path (services/query/candidates.py).
    Not part of the recall tuning grid (services/eval/loco.py): set so that the dev split's recall
    stays within half a point of ranking the whole boundary, and checked on the haystack of
    `memstream bench grow` (a dev conversation among filler of its own words)."""

    lexical_top: int = 100   # BM25 hits per unit kind
    dense_top: int = 100     # nearest points per unit kind
    members_of: int = 10     # best windows and episodes whose member turns join the candidates
    members_cap: int = 40    # ... unless the unit holds more turns than this (its score still lifts the candidates it holds)
    neighbours: int = 1      # ±r session neighbours of every candidate turn
    hub_cap: int = 1_000     # entities mentioned by more contexts are left out of the graph walk
    per_entity: int = 200    # contexts a walk reaches through each activated entity ...
    reach: int = 32          # ... of the most activated ones
    walk_from: int = 0       # candidates (the best by BM25 and dense) the walk's neighbourhood starts from; 0: all


DEFAULT_BOUNDS = Bounds()


def bounds_for(path: str) -> Bounds | None:
    """The Bounds of a query path setting (MEMSTREAM_QUERY_PATH): the defaults for `bounded`, none
    (every turn of the boundary ranked) for `whole`."""
    return DEFAULT_BOUNDS if path == "bounded" else None
