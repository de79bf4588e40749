"""Graph view port: the entity–context graph of Zero-Mem (paper eq. 3–4, 8–10).

Nodes: contexts (one per turn) and entities (spaCy NER mentions plus speakers, merged by
exact normalised name across the tenant). Edges: entity–context with weight = the entity's
share of all entity mentions in that context (eq. 4), and adjacency between consecutive turns
of a session. Sentences record which entities co-occur in them (for eq. 9).

Reads are bounded: the graph a query sees is the boundary's contexts and the entities they
mention — never another tenant's or conversation's contexts. Personalised PageRank is computed
by the engine (scipy embedded, Neo4j GDS at scale).

Reads speak entity ids, never names: an entity's id is a digest of its tenant and normalised
name (schemas.units.entity_id), so the query side finds a name it has by computing its id, and
a store that cannot erase what it once wrote (Neo4j) needs to keep no name at all. Likewise the
graph view's turn ledger need not keep a turn's text, speaker or source_ref: the projection
analyses new turns from the batch and reads stored turns only for their ids, order and hash,
so such a store returns them with text '' and speaker '' (the embedded store keeps them, and
entity names, for `memstream inspect`: SQLite erases physically).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping, Protocol

import numpy as np
import scipy.sparse as sp

from schemas.keyindex import KeyIndex
from schemas.ports.views import Boundary, ChangeSet, Positions, ViewStore
from schemas.units import unit_key


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
    label: str
    score: float  # 1.0 for the exact entity, else the cosine


@dataclass(frozen=True, eq=False)
class SentenceIncidence:
    """Z of eq. 9 for a boundary: the entities each sentence mentions, as a sparse 0/1 matrix
    (rows: sentences by id, columns: entities), so that propagation is two sparse products
    instead of a Python loop over thousands of sentences. Sentences without entities are left out."""

    sentence_ids: tuple[str, ...]
    context_ids: tuple[str, ...]  # the turn each sentence belongs to
    entity_ids: tuple[str, ...]
    matrix: sp.csr_matrix  # sentences x entities
    keys: KeyIndex  # unit_key(sentence_id) -> row, to place the dense view's sentence scores
    entity_index: dict[str, int]
    matrix_t: sp.csr_matrix  # entities x sentences (the transpose, kept in row-major form for products)
    entity_array: np.ndarray  # entity_ids as an object array: ids of many columns in one take

    @classmethod
    def build(cls, rows: Iterable[tuple[str, str, Iterable[str]]]) -> "SentenceIncidence":
        """From (sentence id, context id, entity ids) rows, in any order."""
        rows = sorted((sid, cid, tuple(ents)) for sid, cid, ents in rows)
        rows = [r for r in rows if r[2]]
        entity_ids = tuple(sorted({e for _, _, ents in rows for e in ents}))
        index = {e: j for j, e in enumerate(entity_ids)}
        r_idx = [i for i, (_, _, ents) in enumerate(rows) for _ in ents]
        c_idx = [index[e] for _, _, ents in rows for e in ents]
        matrix = sp.csr_matrix((np.ones(len(r_idx)), (r_idx, c_idx)), shape=(len(rows), len(entity_ids)))
        matrix.data[:] = 1.0  # an entity listed twice in a sentence still counts once
        return cls(tuple(r[0] for r in rows), tuple(r[1] for r in rows), entity_ids, matrix,
                   KeyIndex([unit_key(r[0]) for r in rows]), index, matrix.T.tocsr(), np.array(entity_ids, dtype=object))

    def sentences_mentioning(self, entity_ids: Iterable[str]) -> list[str]:
        """Ids of the sentences that mention at least one of `entity_ids` (Z(e) of eq. 9)."""
        cols = [self.entity_index[e] for e in entity_ids if e in self.entity_index]
        if not cols:
            return []
        hit = np.asarray(self.matrix[:, cols].sum(axis=1)).ravel() > 0
        return [self.sentence_ids[i] for i in np.flatnonzero(hit)]


class GraphStore(ViewStore, Protocol):
    def apply(self, change: GraphChangeSet, positions: Positions) -> None: ...

    def known_entities(self, tenant_id: str, entity_ids: list[str]) -> set[str]: ...

    def align_entities(self, boundary: Boundary, entity_ids: list[str], vectors: np.ndarray, k: int,
                       among: list[str] | None = None) -> list[list[EntityMatch]]:
        """Eq. 8, for each query entity (the id of its normalised name, `entity_id(tenant,
        name)`, and its vector): that entity if it is mentioned inside the boundary (score 1.0),
        else the k named entities of the boundary most similar by cosine (ties by entity id).
        Keyword nodes take part only exactly. With `among` (context ids), the cosine candidates
        are the named entities those contexts mention (the bounded query path)."""
        ...

    def labels_of(self, boundary: Boundary, entity_ids: list[str]) -> dict[str, str]:
        """entity_labels, asked for given entities only: those of `entity_ids` that are named
        entities mentioned inside the boundary, with their label."""
        ...

    def entity_degrees(self, boundary: Boundary, entity_ids: list[str]) -> dict[str, int]:
        """Per entity: how many contexts of the boundary's conversations mention it as a graph
        node (entities mentioned by none are absent)."""
        ...

    def entity_labels(self, boundary: Boundary) -> Mapping[str, str]:
        """Entity id -> label of the named entities (not keywords) mentioned inside the
        boundary. Read-only (stores may share it between queries)."""
        ...

    def present(self, boundary: Boundary, entity_ids: list[str]) -> set[str]:
        """The given entities that are mentioned inside the boundary."""
        ...

    def context_mentions(self, boundary: Boundary, context_ids: list[str] | None = None) -> dict[str, list[tuple[str, str]]]:
        """Per context (turn id) the (entity id, label) of the entities and values it mentions
        (PERSON, DATE, CARDINAL, SPEAKER, KEYWORD…) in entity-id order, for answer-type
        compatibility; with `context_ids`, those contexts only."""
        ...

    def sentence_incidence(self, boundary: Boundary, entity_ids: list[str] | None = None) -> SentenceIncidence:
        """The boundary's sentences and the entities each mentions (eq. 9); cached by the store
        until a write touches the boundary. With `entity_ids`, only the sentences that mention
        one of them (each with all its entities)."""
        ...

    def context_entities(self, tenant_id: str, context_ids: list[str]) -> dict[str, set[str]]: ...

    def personalized_pagerank(
        self, boundary: Boundary, reset: dict[str, float], damping: float, *, adjacency_weight: float = 1.0,
        exclude_labels: tuple[str, ...] = (), max_share: float = 1.0, max_iterations: int = 50, tolerance: float = 1e-7,
        contexts: list[str] | None = None, contexts_total: int | None = None, hub_cap: int | None = None, per_entity: int = 200,
        reach: int = 32,
    ) -> dict[str, float]:
        """PPR over the boundary's graph: pi = (1-damping)*r + damping * P^T pi, with r the
        normalised `reset` (node id -> mass; ids outside the boundary ignored) and P the
        row-normalised weights: eq. 4 weights on entity–context edges, `adjacency_weight` on
        turn–turn edges. Entities whose label is in `exclude_labels` (e.g. SPEAKER), or that are
        mentioned by more than `max_share` of the boundary's contexts (hubs), are left out.
        Returns scores of context nodes (turn ids); an empty reset returns {}.

        With `contexts` (the bounded query path) the walk runs on a neighbourhood of the graph
        instead of the whole boundary: those contexts and the reset's, the `per_entity` strongest
        contexts of each of the `reach` most activated reset entities, the entities they mention and
        the adjacency between them;
        an entity mentioned by more than `hub_cap` contexts, or by more than `max_share` of
        `contexts_total`, is left out. Scores are returned for the neighbourhood's contexts."""
        ...
