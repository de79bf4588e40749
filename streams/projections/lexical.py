"""Lexical projection: BM25 documents for turns, windows and episodes."""

from __future__ import annotations

from schemas.ports.lexical import LexicalChangeSet, LexicalDoc, LexicalIndex
from schemas.ports.views import TurnRow
from schemas.units import TraceUnit
from streams.projections.base import Projection, SessionKey
from schemas.units import HierarchyPolicy
from streams.segmentation import diff_units, session_units


def lexical_text(unit: TraceUnit, speaker_prefix: bool) -> str:
    """Turns are indexed with their speaker's name (questions name people: "What did Caroline
    research?"); windows and episodes already carry 'Speaker: text' lines."""
    if unit.kind == "turn" and speaker_prefix:
        return f"{unit.provenance.speakers[0]}: {unit.text}"
    return unit.text


def lexical_doc(unit: TraceUnit, speaker_prefix: bool) -> LexicalDoc:
    p = unit.provenance
    return LexicalDoc(
        unit_id=unit.unit_id, kind=unit.kind, text=lexical_text(unit, speaker_prefix), tenant_id=p.tenant_id,
        conversation_id=p.conversation_id, session_id=p.session_id, agent_ids=p.agent_ids,
        occurred_from=p.occurred_from, occurred_to=p.occurred_to,
    )


class LexicalProjection(Projection[LexicalChangeSet]):
    name = "lexical"

    def __init__(self, store: LexicalIndex, policy: HierarchyPolicy, speaker_prefix: bool = True):
        super().__init__(store)
        self.policy = policy
        self.speaker_prefix = speaker_prefix

    def new_change(self) -> LexicalChangeSet:
        return LexicalChangeSet()

    def session_change(self, change: LexicalChangeSet, key: SessionKey, before: list[TurnRow], after: list[TurnRow], added: list[TurnRow]) -> None:
        upserts, deletes = diff_units(session_units(before, self.policy), session_units(after, self.policy))
        change.upsert_docs.extend(lexical_doc(u, self.speaker_prefix) for u in upserts)
        change.delete_docs.extend(deletes)
