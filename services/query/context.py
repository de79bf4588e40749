"""Per-query state shared by the stages: the request, its boundary and corpus, the question's
vector, per-stage timings, and the raw lexical/dense signals each view asks for (computed
once, aligned to the corpus's unit order).

Signals come from the stores through their ports, so the same code runs on the embedded
stores and on the servers; scores are the engines' own (BM25 from the lexical engine, cosine
from the vector engine).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from typing import Iterator

import numpy as np

from schemas.ports.views import Boundary
from schemas.query import SearchRequest
from services.query.analysis import keyword_words
from services.query.corpus import Corpus, Level


@dataclass
class Candidate:
    """A unit in a strategy's ranking, by the positions of its turns in the corpus."""

    unit_id: str
    kind: str  # turn | window | episode | span
    turns: list[int]
    role: str = "primary"  # primary | bridge | neighbour | fill
    scores: dict[str, float] = field(default_factory=dict)


@dataclass
class Ranking:
    candidates: list[Candidate]
    route: str | None = None
    notes: list[str] = field(default_factory=list)


class QueryContext:
    def __init__(self, request: SearchRequest, boundary: Boundary, corpus: Corpus, views, encoder, extractor=None):
        self.extractor = extractor
        self.request = request
        self.boundary = boundary
        self.corpus = corpus
        self.views = views
        self.encoder = encoder
        self.timings: dict[str, float] = {}
        self.backends: dict[str, str] = {}

    @contextmanager
    def timed(self, stage: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.timings[stage] = self.timings.get(stage, 0.0) + (time.perf_counter() - t0) * 1000

    def store(self, view: str):
        s = self.views.store(view)
        self.backends[view] = s.backend
        return s

    # -- the question ----------------------------------------------------------------------
    @cached_property
    def qvec(self) -> np.ndarray:
        with self.timed("encode"):
            return self.encoder.encode([self.request.question])[0]

    @cached_property
    def lexical_query(self) -> str:
        """The question's content words, for the BM25 engine (which stems them itself)."""
        return " ".join(keyword_words(self.request.question))

    # -- raw signals, aligned to corpus order ----------------------------------------------
    def _units(self, kind: str, level: int | None) -> tuple[list, dict[str, int]]:
        c = self.corpus
        if kind == "turn":
            return c.turns, c.index
        lv: Level = c.episodes if kind == "episode" else c.windows[level]
        return lv.units, lv.index

    def bm25(self, kind: str, level: int | None = None) -> np.ndarray:
        key = ("bm25", kind, level)
        if key not in self._cache:
            units, index = self._units(kind, level)
            out = np.zeros(len(units))
            if units and self.lexical_query:
                with self.timed("lexical"):
                    hits = self.store("lexical").search(kind, self.lexical_query, self.boundary, self._count(kind))
                for h in hits:
                    i = index.get(h.unit_id)
                    if i is not None:
                        out[i] = h.score
            self._cache[key] = out
        return self._cache[key]

    def dense(self, kind: str, level: int | None = None, vector: np.ndarray | None = None) -> np.ndarray:
        key = ("dense", kind, level, None if vector is None else vector.tobytes())
        if key not in self._cache:
            units, index = self._units(kind, level)
            out = np.full(len(units), -1.0)
            if units:
                q = self.qvec if vector is None else vector
                with self.timed("dense"):
                    hits = self.store("dense").search(kind, q, self.boundary, self._count(kind))
                for h in hits:
                    i = index.get(h.unit_id)
                    if i is not None:
                        out[i] = h.score
            self._cache[key] = out
        return self._cache[key]

    def sentence_scores(self, vector: np.ndarray | None = None) -> dict[str, float]:
        key = ("sentences", None if vector is None else vector.tobytes())
        if key not in self._cache:
            n = max(self.corpus.n * 4, 16)
            with self.timed("dense"):
                hits = self.store("dense").search("sentence", self.qvec if vector is None else vector, self.boundary, n)
            self._cache[key] = {h.unit_id: h.score for h in hits}
        return self._cache[key]

    def _count(self, kind: str) -> int:
        c = self.corpus
        if kind == "turn":
            return max(c.n, 1)
        if kind == "episode":
            return max(len(c.episodes.units), 1)
        return max(sum(len(lv.units) for lv in c.windows.values()), 1)

    @cached_property
    def _cache(self) -> dict:
        return {}
