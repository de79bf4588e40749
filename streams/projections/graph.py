"""Graph projection: the entity–context graph (Zero-Mem eq. 3–4).

Per new turn: spaCy NER mentions (normalised and merged by exact name), the speaker as an
entity, the turn's sentences with the entities they contain, entity–context edges weighted by
the entity's share of the context's entity mentions (eq. 4), and adjacency edges between
consecutive turns of the session (recomputed for the session when a turn arrives late).
New entity names are encoded once, for alignment to query entities (eq. 8).

Value-like NER labels (dates, numbers, …) are kept as `value` mentions with weight 0: they do
not become graph nodes (a date links unrelated turns) but the query side uses them as
answer-type evidence.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from schemas.ports.graph import AdjacencyEdge, EntityNode, GraphChangeSet, GraphStore, Mention, SentenceNode
from schemas.ports.models import AnalyzedText, Encoder, EntityExtractor
from schemas.ports.views import TurnRow
from schemas.ordering import order_turns
from schemas.units import entity_id, sentence_id
from streams.projections.base import Projection, SessionKey
from schemas.text import normalize_entity

VALUE_LABELS = frozenset({"DATE", "TIME", "PERCENT", "MONEY", "QUANTITY", "ORDINAL", "CARDINAL"})
SPEAKER_LABEL = "SPEAKER"


class GraphProjection(Projection[GraphChangeSet]):
    name = "graph"

    def __init__(self, store: GraphStore, extractor: EntityExtractor, encoder: Encoder, speaker_as_entity: bool = True):
        super().__init__(store)
        self.extractor = extractor
        self.encoder = encoder
        self.speaker_as_entity = speaker_as_entity
        self._analysis: dict[str, AnalyzedText] = {}
        self._new_entities: dict[tuple[str, str], tuple[str, str]] = {}

    def new_change(self) -> GraphChangeSet:
        return GraphChangeSet()

    def prepare(self, new_turns: list[TurnRow]) -> None:
        self._analysis = dict(zip((t.turn_id for t in new_turns), self.extractor.analyze([t.text for t in new_turns])))
        self._new_entities = {}

    def session_change(self, change: GraphChangeSet, key: SessionKey, before: list[TurnRow], after: list[TurnRow], added: list[TurnRow]) -> None:
        tenant, conv, session = key
        ordered = order_turns(after)
        change.adjacency[key] = [
            AdjacencyEdge(a.turn_id, b.turn_id, tenant, conv, session) for a, b in zip(ordered, ordered[1:])
        ]
        for turn in added:
            mentioned: dict[str, tuple[str, str]] = {}
            self._turn_nodes(change, turn, self._analysis[turn.turn_id], mentioned)
            for eid, name_label in mentioned.items():
                self._new_entities.setdefault((tenant, eid), name_label)

    def finish(self, change: GraphChangeSet) -> None:
        """Encode the names of entities the graph has never seen, once per step."""
        by_tenant: dict[str, list[str]] = {}
        for tenant, eid in self._new_entities:
            by_tenant.setdefault(tenant, []).append(eid)
        fresh = []
        for tenant, eids in sorted(by_tenant.items()):
            known = self.store.known_entities(tenant, eids)
            fresh += [(tenant, eid, *self._new_entities[(tenant, eid)]) for eid in sorted(eids) if eid not in known]
        self._new_entities = {}
        if fresh:
            vectors = self.encoder.encode([name for _, _, name, _ in fresh])
            change.entities.extend(
                EntityNode(eid, tenant, name, label, np.asarray(vec, dtype=np.float32)) for (tenant, eid, name, label), vec in zip(fresh, vectors)
            )

    def _turn_nodes(self, change: GraphChangeSet, turn: TurnRow, analysis: AnalyzedText, new_entities: dict[str, tuple[str, str]]) -> None:
        counts: Counter[str] = Counter()
        kinds: dict[str, str] = {}
        in_sentence: dict[int, list[str]] = {}
        for m in analysis.mentions:
            name = normalize_entity(m.text)
            if not name:
                continue
            eid = entity_id(turn.tenant_id, name)
            if m.label in VALUE_LABELS:
                kinds.setdefault(eid, "value")
            else:
                kinds[eid] = "ner"
                s = _sentence_of(analysis.sentences, m.start)
                if s is not None:
                    in_sentence.setdefault(s, []).append(eid)
            counts[eid] += 1
            new_entities.setdefault(eid, (name, m.label))
        if self.speaker_as_entity:
            name = normalize_entity(turn.speaker)
            if name:
                eid = entity_id(turn.tenant_id, name)
                kinds[eid] = "speaker" if kinds.get(eid) != "ner" else "ner"
                counts[eid] += 1
                new_entities.setdefault(eid, (name, SPEAKER_LABEL))
        node_total = sum(n for eid, n in counts.items() if kinds[eid] != "value")
        for eid, n in sorted(counts.items()):
            weight = n / node_total if kinds[eid] != "value" and node_total else 0.0
            change.mentions.append(Mention(eid, turn.turn_id, n, weight, kinds[eid]))
        for i, (start, end) in enumerate(analysis.sentences):
            change.sentences.append(SentenceNode(sentence_id(turn.turn_id, i), turn.turn_id, i, start, end, tuple(dict.fromkeys(in_sentence.get(i, [])))))


def _sentence_of(spans: list[tuple[int, int]], char: int) -> int | None:
    for i, (s, e) in enumerate(spans):
        if s <= char < e:
            return i
    return None
