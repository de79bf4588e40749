"""Graph view port: the entity–context graph of Zero-Mem (paper eq. 3–4, 8–10).

Nodes: contexts (one per turn) and entities (spaCy NER mentions plus speakers, merged by
exact normalised name across the tenant). Edges: entity–context with weight = the entity's
share of all entity mentions in that context (eq. 4), and adjacency between consecutive turns
of a session. Sentences record which entities co-occur in them (for eq. 9).

Reads are bounded: the graph a query sees is the boundary's contexts and the entities they
mention — never another tenant's or conversation's contexts. Personalised PageRank is computed
by the engine (scipy embedded, Neo4j GDS at scale).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from schemas.ports.views import Boundary, ChangeSet, Positions, ViewStore


@dataclass(frozen=True)
class EntityNode:
    entity_id: str
    tenant_id: str
    name: str  # normalised form (the merge key)
    label: str  # NER label of the first mention, or SPEAKER
    vector: np.ndarray  # encoder embedding of `name`, L2-normalised


@dataclass(frozen=True)
class Mention:
    entity_id: str
    context_id: str  # turn unit id
    count: int
    weight: float  # eq. 4: count / all entity mentions in the context
    kind: str  # "ner" | "speaker" | "keyword"


@dataclass(frozen=True)
class SentenceNode:
    sentence_id: str
    context_id: str
    index: int
    start: int  # character span inside the turn text
    end: int
    entity_ids: tuple[str, ...]


@dataclass(frozen=True)
class AdjacencyEdge:
    source: str  # earlier turn id
    target: str  # next turn id in the session
    tenant_id: str
    conversation_id: str
    session_id: str


@dataclass
class GraphChangeSet(ChangeSet):
    entities: list[EntityNode] = field(default_factory=list)  # new entities (existing ones are kept)
    mentions: list[Mention] = field(default_factory=list)
    sentences: list[SentenceNode] = field(default_factory=list)
    # Adjacency is replaced per session: (tenant, conversation, session) -> edges.
    adjacency: dict[tuple[str, str, str], list[AdjacencyEdge]] = field(default_factory=dict)

    def is_empty(self) -> bool:
        return super().is_empty() and not (self.entities or self.mentions or self.sentences or self.adjacency)


@dataclass(frozen=True)
class EntityMatch:
    entity_id: str
    name: str
    label: str
    score: float  # cosine


@dataclass(frozen=True)
class CoSentence:
    sentence_id: str
    context_id: str
    entity_ids: tuple[str, ...]


class GraphStore(ViewStore, Protocol):
    def apply(self, change: GraphChangeSet, positions: Positions) -> None: ...

    def known_entities(self, tenant_id: str, entity_ids: list[str]) -> set[str]: ...

    def align_entities(self, boundary: Boundary, names: list[str], vectors: np.ndarray, k: int) -> list[list[EntityMatch]]:
        """Eq. 8, for each query entity (normalised name + vector): an entity of that exact name
        mentioned inside the boundary (score 1.0), else the k named entities of the boundary
        most similar by cosine. Keyword nodes take part only through exact names."""
        ...

    def entity_names(self, boundary: Boundary) -> dict[str, str]:
        """Normalised name -> label of the named entities (not keywords) mentioned inside the boundary."""
        ...

    def present(self, boundary: Boundary, entity_ids: list[str]) -> set[str]:
        """The given entities that are mentioned inside the boundary."""
        ...

    def context_mentions(self, boundary: Boundary) -> dict[str, list[tuple[str, str]]]:
        """Per context (turn id) the (name, label) of the entities and values it mentions
        (PERSON, DATE, CARDINAL, SPEAKER, KEYWORD…), for answer-type compatibility."""
        ...

    def co_sentences(self, boundary: Boundary, entity_ids: list[str]) -> list[CoSentence]:
        """Sentences inside the boundary that mention at least one of `entity_ids` (Z(e) of eq. 9)."""
        ...

    def context_entities(self, tenant_id: str, context_ids: list[str]) -> dict[str, set[str]]: ...

    def personalized_pagerank(
        self, boundary: Boundary, reset: dict[str, float], damping: float, *, adjacency_weight: float = 1.0,
        exclude_labels: tuple[str, ...] = (), max_share: float = 1.0, max_iterations: int = 50, tolerance: float = 1e-7,
    ) -> dict[str, float]:
        """PPR over the boundary's graph: pi = (1-damping)*r + damping * P^T pi, with r the
        normalised `reset` (node id -> mass; ids outside the boundary ignored) and P the
        row-normalised weights: eq. 4 weights on entity–context edges, `adjacency_weight` on
        turn–turn edges. Entities whose label is in `exclude_labels` (e.g. SPEAKER), or that are
        mentioned by more than `max_share` of the boundary's contexts (hubs), are left out.
        Returns scores of context nodes (turn ids); an empty reset returns {}."""
        ...
