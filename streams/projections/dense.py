"""Dense projection: vectors for turns, windows, episodes and sentences.

Each turn is encoded once. From that single forward pass come:
- the turn vector (mean pooling, as FlagEmbedding/sentence-transformers do);
- one vector per sentence, pooling the turn's token states over the sentence's span
  ("late chunking": the sentence keeps its turn's context, and costs no extra encoding);
- the turn's unnormalised mean token state and token count, kept as pooling state.
Window and episode vectors are the token-weighted mean of their turns' pooling states —
mean pooling over the window's tokens, each contextualised within its own turn. Encoding
window/episode text again would multiply ingest cost (a 5-turn window stride 3 is ~1.7x the
turn tokens, episodes another 1x) on a machine where turn encoding alone is the bottleneck
(docs/results/ingest.md).
"""

from __future__ import annotations

import numpy as np

from schemas.ports.models import EncodedText, Encoder
from schemas.ports.vectors import TurnPooling, VectorChangeSet, VectorPoint, VectorStore
from schemas.ports.views import TurnRow
from schemas.units import sentence_id
from streams.projections.base import Projection, SessionKey
from schemas.units import HierarchyPolicy
from streams.segmentation import diff_units, session_units
from schemas.text import split_sentences


def dense_text(turn: TurnRow, speaker_prefix: bool) -> tuple[str, int]:
    """Text the encoder sees for a turn, and the offset of the raw text inside it."""
    if speaker_prefix:
        prefix = f"{turn.speaker}: "
        return prefix + turn.text, len(prefix)
    return turn.text, 0


def pooled_vector(members: list[TurnPooling]) -> np.ndarray:
    total = sum(p.tokens for p in members)
    v = sum(p.mean.astype(np.float64) * p.tokens for p in members) / max(total, 1)
    v = np.asarray(v, dtype=np.float32)
    return v / max(float(np.linalg.norm(v)), 1e-12)


class DenseProjection(Projection[VectorChangeSet]):
    name = "dense"

    def __init__(self, store: VectorStore, encoder: Encoder, policy: HierarchyPolicy, speaker_prefix: bool = True):
        super().__init__(store)
        self.encoder = encoder
        self.policy = policy
        self.speaker_prefix = speaker_prefix
        self._encoded: dict[str, EncodedText] = {}

    def new_change(self) -> VectorChangeSet:
        return VectorChangeSet()

    def prepare(self, new_turns: list[TurnRow]) -> None:
        texts, spans = [], []
        for t in new_turns:
            text, shift = dense_text(t, self.speaker_prefix)
            texts.append(text)
            spans.append([(s + shift, e + shift) for s, e in split_sentences(t.text)])
        self._encoded = dict(zip((t.turn_id for t in new_turns), self.encoder.encode_with_spans(texts, spans)))

    def session_change(self, change: VectorChangeSet, key: SessionKey, before: list[TurnRow], after: list[TurnRow], added: list[TurnRow]) -> None:
        upserts, deletes = diff_units(session_units(before, self.policy), session_units(after, self.policy))
        by_id = {t.turn_id: t for t in after}
        pooling = self._pooling([t.turn_id for t in after])
        for t in added:
            enc = self._encoded[t.turn_id]
            change.pooling.append(pooling[t.turn_id])
            change.upsert_points.append(self._point("turn", t.turn_id, enc.vector, [t], t.turn_id))
            for i, vec in enumerate(enc.spans):
                change.upsert_points.append(self._point("sentence", sentence_id(t.turn_id, i), vec, [t], t.turn_id))
        for u in upserts:
            if u.kind == "turn":
                continue  # a turn's vector and payload never change once encoded
            members = [by_id[tid] for tid in u.turn_ids]
            change.upsert_points.append(self._point(u.kind, u.unit_id, pooled_vector([pooling[m.turn_id] for m in members]), members, u.unit_id))
        for uid in deletes:
            if uid.startswith("t_"):
                change.delete_points.append(("turn", uid))
                n = len(split_sentences(next(t.text for t in before if t.turn_id == uid)))
                change.delete_points.extend(("sentence", sentence_id(uid, i)) for i in range(n))
            else:
                change.delete_points.append(("window" if uid.startswith("w_") else "episode", uid))

    def _pooling(self, turn_ids: list[str]) -> dict[str, TurnPooling]:
        wanted = set(turn_ids)
        fresh = {tid: TurnPooling(tid, enc.mean, enc.tokens) for tid, enc in self._encoded.items() if tid in wanted}
        missing = [tid for tid in turn_ids if tid not in fresh]
        return {**self.store.pooling(missing), **fresh}

    @staticmethod
    def _point(collection, point_id: str, vector: np.ndarray, members: list[TurnRow], owner: str) -> VectorPoint:
        first = members[0]
        return VectorPoint(
            collection=collection, point_id=point_id, vector=np.asarray(vector, dtype=np.float32), tenant_id=first.tenant_id,
            conversation_id=first.conversation_id, session_id=first.session_id,
            agent_ids=tuple(sorted({m.agent_id for m in members})),
            occurred_from=min(m.occurred_at for m in members), occurred_to=max(m.occurred_at for m in members), owner_id=owner,
        )

