"""The query side's picture of one boundary: its turns in order and how units contain them.

Built from the hierarchy view (any backend) and cached until that view's generation or the
conversation's version changes, so a query does array work only. Turn order is the
conversation order of schemas/ordering.py (sessions by first turn, turns inside a session).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain, repeat

import numpy as np
import scipy.sparse as sp

from schemas.ports.views import Boundary
from schemas.keyindex import KeyIndex
from schemas.query import TurnRef
from schemas.units import TraceUnit, unit_key
from schemas.versioned_cache import VersionedCache


@dataclass
class Level:
    """Units of one kind (windows of one size, or episodes) and their turn membership."""

    units: list[TraceUnit]
    index: dict[str, int]
    membership: sp.csr_matrix  # units x turns, 0/1
    keys: KeyIndex = field(default_factory=lambda: KeyIndex([]))  # unit_key -> position
    _by_turn: tuple | None = field(default=None, repr=False)

    @classmethod
    def of(cls, units: list[TraceUnit], index: dict[str, int], n: int) -> "Level":
        """Units and their membership over the `n` turns of `index` (members outside it are left out)."""
        lengths = np.fromiter(map(len, (u.turn_ids for u in units)), np.int64, len(units))
        cols = np.fromiter(chain.from_iterable(map(index.get, u.turn_ids, repeat(-1)) for u in units), np.int64, int(lengths.sum()))
        rows = np.repeat(np.arange(len(units)), lengths)
        inside = cols >= 0
        m = sp.csr_matrix((np.ones(int(inside.sum())), (rows[inside], cols[inside])), shape=(len(units), n))
        return cls(units, {u.unit_id: k for k, u in enumerate(units)}, m, KeyIndex([unit_key(u.unit_id) for u in units]))

    def lift(self, unit_scores: np.ndarray) -> np.ndarray:
        """Per turn: the best score among the units that contain it (-inf if none)."""
        if self._by_turn is None:  # turns x units, and which turns belong to any unit
            t = self.membership.T.tocsr()
            covered = np.diff(t.indptr) > 0
            self._by_turn = (t.indices, t.indptr[:-1][covered], covered)
        units, starts, covered = self._by_turn
        out = np.full(self.membership.shape[1], -np.inf)
        if len(units):
            out[covered] = np.maximum.reduceat(unit_scores[units], starts)
        return out


@dataclass
class Corpus:
    boundary: Boundary
    turns: list[TraceUnit]
    index: dict[str, int]  # turn id -> position in conversation order
    session: np.ndarray  # session ordinal per turn
    speaker: list[str]
    speakers: list[str]  # distinct speaker names in the boundary
    occurred: list  # datetime per turn
    windows: dict[int, Level]  # by window size
    episodes: Level
    by_unit: dict[str, TraceUnit] = field(default_factory=dict)
    keys: KeyIndex = field(default_factory=lambda: KeyIndex([]))  # turn unit_key -> position
    _turn_refs: list[TurnRef | None] | None = field(default=None, init=False, repr=False, compare=False)  # turn_ref's, filled lazily
    # What strategies derive from this corpus alone (stem bags, Raw-RAG's window index), kept on
    # it, so it is dropped with it. Not in a cache keyed by id(corpus): once the corpus cache
    # evicts a corpus, its id is reused by later objects — another tenant's corpus among them.
    derived: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    # The bounded path's corpus (services/query/candidates.py) holds a question's candidates, not the
    # boundary: it says so, which of its turns follow their predecessor in the session (`adjacent`),
    # and the boundary's latest time and size (from the hierarchy view, not from its own turns).
    bounded: bool = field(default=False, init=False, repr=False, compare=False)
    adjacent: np.ndarray | None = field(default=None, init=False, repr=False, compare=False)
    latest: object = field(default=None, init=False, repr=False, compare=False)
    size: int | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def n(self) -> int:
        return len(self.turns)

    def keys_from(self, keys: list[int]) -> None:
        self.keys = KeyIndex(keys)

    def follows(self) -> np.ndarray:
        """Per turn: whether the turn before it in corpus order is its predecessor in the session."""
        if self.adjacent is not None:
            return self.adjacent
        return np.append(False, self.session[1:] == self.session[:-1])

    @property
    def as_of(self):
        """The latest time the boundary holds a turn at."""
        if self.latest is not None:
            return self.latest
        return max(self.occurred) if self.occurred else None

    def neighbours(self, i: int, r: int) -> list[int]:
        """Positions of turns within r of turn i in the same session."""
        lo, hi = max(0, i - r), min(self.n - 1, i + r)
        return [j for j in range(lo, hi + 1) if self.session[j] == self.session[i]]

    def unit(self, unit_id: str) -> TraceUnit | None:
        return self.by_unit.get(unit_id)

    def turn_ref(self, i: int) -> TurnRef:
        """Turn i's provenance as the responses carry it. Built once per corpus (the corpus is
        rebuilt when the boundary's data changes) and shared by responses, which never mutate it."""
        if self._turn_refs is None:
            self._turn_refs = [None] * self.n
        refs = self._turn_refs
        ref = refs[i]
        if ref is None:
            t = self.turns[i]
            p = t.provenance
            ref = refs[i] = TurnRef.model_construct(  # fields from already-validated units
                turn_id=t.unit_id, text=t.text, event_id=p.event_ids[0], source_ref=(p.source_refs or (None,))[0],
                speaker=p.speakers[0], session_id=p.session_id, occurred_at=p.occurred_from,
                partition=p.log_positions[0].partition, offset=p.log_positions[0].offset)
        return ref


def build_corpus(units_store, boundary: Boundary) -> Corpus:
    # A turn a correction supersedes (TurnRecorded.supersedes) is left out: no strategy ranks it,
    # no unit shows it; its correction stands in its place. GET /v1/turns/{id}/history keeps it.
    superseded = units_store.superseded(boundary)
    turns = [u for u in units_store.list_units(boundary, "turn") if u.unit_id not in superseded]
    index = {u.unit_id: i for i, u in enumerate(turns)}
    session_ord: dict[tuple[str, str], int] = {}
    sessions = []
    for u in turns:
        key = (u.provenance.conversation_id, u.provenance.session_id)
        sessions.append(session_ord.setdefault(key, len(session_ord)))
    windows_all = units_store.list_units(boundary, "window")
    by_size: dict[int, list[TraceUnit]] = {}
    for w in windows_all:
        by_size.setdefault(window_size(w), []).append(w)
    episodes = units_store.list_units(boundary, "episode")
    speaker = [u.provenance.speakers[0] for u in turns]
    corpus = Corpus(
        boundary=boundary, turns=turns, index=index, session=np.array(sessions, dtype=int), speaker=speaker,
        speakers=list(dict.fromkeys(speaker)), occurred=[u.provenance.occurred_from for u in turns],
        windows={size: Level.of(ws, index, len(turns)) for size, ws in sorted(by_size.items())},
        episodes=Level.of(episodes, index, len(turns)),
    )
    corpus.by_unit = {u.unit_id: u for u in (*turns, *windows_all, *episodes)}
    corpus.keys = KeyIndex([unit_key(u.unit_id) for u in turns])
    return corpus


def window_size(w: TraceUnit) -> int:
    # A short session's window belongs to the level it was cut for, whatever its length.
    return w.level or len(w.turn_ids)


class CorpusCache:
    def __init__(self, size: int = 64):
        self._cache: VersionedCache[Corpus] = VersionedCache(size)

    def get(self, units_store, boundary: Boundary) -> Corpus:
        convs = boundary.conversation_ids or (None,)
        version = (units_store.generation, *(units_store.conversation_version(boundary.tenant_id, c) for c in convs))
        return self._cache.get((boundary, id(units_store)), version, lambda: build_corpus(units_store, boundary))
