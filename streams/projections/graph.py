"""Graph projection: the entity–context graph (Zero-Mem eq. 3–4).

Per new turn (a context node):
- entities: spaCy NER mentions (the model runs on the turns with an entity cue:
  infra/models/ner_gate.py), normalised and merged by exact name across the tenant; the
  speaker; and — measured on the LoCoMo dev split: +1.4 points recall@10 — keyword nodes, one
  per stemmed content word (schemas/text.py), so that what people *do* ("pottery", "hike")
  connects turns the way names do;
- entity–context edges weighted by the entity's share of the context's mentions (eq. 4);
- the turn's sentences with the entities they contain (the speaker belongs to every sentence of
  its turn), for the sentence-level propagation of eq. 9;
- adjacency edges between consecutive turns of the session (recomputed for the session when a
  turn arrives late).
Names of new named entities are encoded once, for embedding alignment to query entities
(eq. 8); keyword nodes are matched to the query by exact stem and carry no vector.

Numbers and amounts are kept as `value` mentions with weight 0: not graph nodes (a number links
unrelated turns) but answer-type evidence for the query side.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from schemas.ordering import order_turns
from schemas.ports.graph import AdjacencyEdge, EntityNode, GraphChangeSet, GraphStore, Mention, SentenceNode
from schemas.ports.models import AnalyzedText, Encoder, EntityExtractor
from schemas.ports.views import TurnRow
from schemas.text import content_words, normalize_entity
from schemas.units import entity_id, sentence_id
from streams.projections.base import Projection, SessionKey

VALUE_LABELS = frozenset({"PERCENT", "MONEY", "QUANTITY", "ORDINAL", "CARDINAL"})
SPEAKER_LABEL = "SPEAKER"
KEYWORD_LABEL = "KEYWORD"
KEYWORD_PREFIX = "kw:"
_PRECEDENCE = {"value": 0, "keyword": 1, "speaker": 2, "ner": 3}  # a name that is both keeps the strongest kind


def keyword_occurrences(text: str, skip: list[tuple[int, int]], speaker: str) -> list[tuple[int, str]]:
    """(start, stem) of the keyword-node occurrences in a turn: content words of 3+ characters,
    not numbers, not the speaker's name, not inside an entity mention."""
    speaker_words = set(normalize_entity(speaker).split())
    out = []
    for start, end, word, stem in content_words(text):
        if len(stem) <= 2 or word.isdigit() or word in speaker_words:
            continue
        if any(a <= start < b for a, b in skip):
            continue
        out.append((start, stem))
    return out


class GraphProjection(Projection[GraphChangeSet]):
    name = "graph"

    def __init__(self, store: GraphStore, extractor: EntityExtractor, encoder: Encoder, speaker_as_entity: bool = True,
                 keyword_nodes: bool = True):
        super().__init__(store)
        self.extractor = extractor
        self.encoder = encoder
        self.speaker_as_entity = speaker_as_entity
        self.keyword_nodes = keyword_nodes
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
        change.adjacency[key] = [AdjacencyEdge(a.turn_id, b.turn_id, tenant, conv, session) for a, b in zip(ordered, ordered[1:])]
        for turn in added:
            for eid, name_label in self._turn_nodes(change, turn, self._analysis[turn.turn_id]).items():
                self._new_entities.setdefault((tenant, eid), name_label)

    def finish(self, change: GraphChangeSet) -> None:
        """Create the entities the graph has never seen, encoding named ones once per step."""
        by_tenant: dict[str, list[str]] = {}
        for tenant, eid in self._new_entities:
            by_tenant.setdefault(tenant, []).append(eid)
        fresh = []
        for tenant, eids in sorted(by_tenant.items()):
            known = self.store.known_entities(tenant, eids)
            fresh += [(tenant, eid, *self._new_entities[(tenant, eid)]) for eid in sorted(eids) if eid not in known]
        self._new_entities = {}
        named = [f for f in fresh if f[3] != KEYWORD_LABEL]
        vectors = self.encoder.encode([name for _, _, name, _ in named]) if named else []
        change.entities.extend(EntityNode(eid, tenant, name, label, np.asarray(v, dtype=np.float32)) for (tenant, eid, name, label), v in zip(named, vectors))
        change.entities.extend(EntityNode(eid, tenant, name, label, np.zeros(0, dtype=np.float32)) for tenant, eid, name, label in fresh
                               if label == KEYWORD_LABEL)

    def _turn_nodes(self, change: GraphChangeSet, turn: TurnRow, analysis: AnalyzedText) -> dict[str, tuple[str, str]]:
        """Mentions and sentences of one turn; returns the entities it names (id -> (name, label))."""
        named: dict[str, tuple[str, str]] = {}
        counts: Counter[str] = Counter()
        kinds: dict[str, str] = {}
        by_sentence: dict[int, list[str]] = {i: [] for i in range(len(analysis.sentences))}

        def mention(eid: str, name: str, label: str, kind: str, at: int | None) -> None:
            named.setdefault(eid, (name, label))
            counts[eid] += 1
            if _PRECEDENCE[kind] > _PRECEDENCE.get(kinds.get(eid, ""), -1):
                kinds[eid] = kind
            if at is not None and kind != "value":
                s = _sentence_of(analysis.sentences, at)
                if s is not None:
                    by_sentence[s].append(eid)

        for m in analysis.mentions:
            name = normalize_entity(m.text)
            if name:
                mention(entity_id(turn.tenant_id, name), name, m.label, "value" if m.label in VALUE_LABELS else "ner", m.start)
        if self.speaker_as_entity and (speaker := normalize_entity(turn.speaker)):
            eid = entity_id(turn.tenant_id, speaker)
            mention(eid, speaker, SPEAKER_LABEL, "speaker", None)
            for s in by_sentence:
                by_sentence[s].append(eid)
        if self.keyword_nodes:
            skip = [(m.start, m.end) for m in analysis.mentions]
            for start, stem in keyword_occurrences(turn.text, skip, turn.speaker):
                name = KEYWORD_PREFIX + stem
                mention(entity_id(turn.tenant_id, name), name, KEYWORD_LABEL, "keyword", start)
        node_total = sum(n for eid, n in counts.items() if kinds[eid] != "value")
        for eid, n in sorted(counts.items()):
            weight = n / node_total if kinds[eid] != "value" and node_total else 0.0
            change.mentions.append(Mention(eid, turn.turn_id, n, weight, kinds[eid]))
        for i, (start, end) in enumerate(analysis.sentences):
            change.sentences.append(SentenceNode(sentence_id(turn.turn_id, i), turn.turn_id, i, start, end, tuple(dict.fromkeys(by_sentence[i]))))
        return named


def _sentence_of(spans: list[tuple[int, int]], char: int) -> int | None:
    for i, (s, e) in enumerate(spans):
        if s <= char < e:
            return i
    return None
