"""Per-query state shared by the stages: the request, its boundary and corpus, the question's
vector, per-stage timings, and the raw lexical/dense signals each view asks for (computed
once, aligned to the corpus's unit order).

Signals come from the stores through their ports, so the same code runs on the embedded
stores and on the servers; scores are the engines' own (BM25 from the lexical engine, cosine
from the vector engine).
"""

from __future__ import annotations

import contextvars
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from typing import Iterator

import numpy as np

from schemas.errors import CredentialsRefused, StoreError, TransientError, ViewUnavailable
from schemas.keyindex import KeyIndex
from schemas.ports.views import Boundary
from schemas.query import SearchRequest
from schemas.units import unit_key
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
    score: float = 0.0  # what the strategy ranked by: higher first, comparable within one ranking only


@dataclass
class Ranking:
    candidates: list[Candidate]
    route: str | None = None
    notes: list[str] = field(default_factory=list)


@contextmanager
def unavailable_as(view: str) -> Iterator[None]:
    """A store error while reading `view` becomes ViewUnavailable(view): the query falls back past
    the view, or answers 503 naming it. Refused credentials stay what they are — the operator's to
    fix, which no fallback may hide."""
    try:
        yield
    except CredentialsRefused:
        raise
    except (TransientError, StoreError) as exc:
        raise ViewUnavailable(view, str(exc).splitlines()[0][:300]) from exc


class Guarded:
    """A view's store as the query side reads it: a store that cannot answer (its server down,
    refusing, timing out — but not one refusing memstream's credentials) raises ViewUnavailable naming the view, which the query service answers
    with a fallback strategy or a 503 (services/query/service.py)."""

    __slots__ = ("_store", "_view")

    def __init__(self, store, view: str):
        self._store, self._view = store, view

    def __getattr__(self, name: str):
        attr = getattr(self._store, name)
        if not callable(attr):
            return attr
        view = self._view

        def call(*args, **kwargs):
            with unavailable_as(view):
                return attr(*args, **kwargs)

        return call


# Threads that overlap one query's independent round trips to servers (`QueryContext.ahead`),
# shared by every query of the process. A task on them never waits for another task on them
# (a query's own thread collects the results; a task may wait for the encoder's thread), so
# concurrent queries cannot exhaust them into a deadlock; more queries than threads only queue
# their reads.
_IO_THREADS = 8
_io_pool: ThreadPoolExecutor | None = None
_io_lock = threading.Lock()


def _io() -> ThreadPoolExecutor:
    global _io_pool
    with _io_lock:
        if _io_pool is None:
            _io_pool = ThreadPoolExecutor(_IO_THREADS, thread_name_prefix="memstream-query-io")
        return _io_pool


class _Inline(Future):
    """A future computed on the thread that asks for it (QueryContext.ahead on embedded stores)."""

    def __init__(self, compute):
        super().__init__()
        self._compute = compute

    def run(self) -> None:
        try:
            self.set_result(self._compute())
        except Exception as exc:  # noqa: BLE001 - handed to whoever collects the result
            self.set_exception(exc)

    def result(self, timeout=None):
        if not self.done():
            self.run()
        return super().result(timeout)


class QueryContext:
    overlap = True  # `ahead` overlaps remote reads; False runs them in order (a side-by-side benchmark's baseline)
    bounds = None  # the bounded path's sizes (services/query/candidates.py Bounds) when the corpus is a question's candidates

    def __init__(self, request: SearchRequest, boundary: Boundary, corpus: Corpus, views, encoder, extractor=None, encoder_for=None):
        self.extractor = extractor
        self.request = request
        self.boundary = boundary
        self.corpus = corpus
        self.views = views
        # Each view's store is pinned for the query (one generation per view, even if a replay
        # switches meanwhile), and a question is encoded by the model the pinned generation was
        # built with: `encoder_for(view, generation)`; the dense view's model encodes the question,
        # a view built with another (between a configuration change and its replay's switch) gets
        # its own pass.
        self._default_encoder = encoder
        self._encoder_for = encoder_for
        self._stores: dict[str, Guarded] = {}
        self._states_by_encoder: dict[int, object] = {}
        self.timings: dict[str, float] = {}
        self.backends: dict[str, str] = {}
        self._pending = None  # the question's forward pass in flight (prefetch_question)

    @contextmanager
    def timed(self, stage: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.timings[stage] = self.timings.get(stage, 0.0) + (time.perf_counter() - t0) * 1000

    def store(self, view: str):
        pinned = self._stores.get(view)
        if pinned is not None:
            return pinned
        with unavailable_as(view):
            s = self.views.store(view)  # (reads the view's catalog, which may live on the same server)
        self.backends[view] = s.backend
        return self._stores.setdefault(view, Guarded(s, view))

    def ahead(self, compute, *views: str, deferred: bool = False) -> Future:
        """Start `compute` (reads of `views`, then what it derives from them) beside the calling
        thread when one of those views' stores is a server (`remote`), so that its round trips
        overlap the caller's. On embedded stores (in-process work that would only contend for
        the interpreter) run it here: now, or — `deferred` — when its result is first asked for
        (for a compute that would wait for something the caller does meanwhile). The result, or
        the exception, is the future's, so a view that is down surfaces where the caller
        collects it, as it would have inline."""
        try:
            remote = self.overlap and any(getattr(self.store(v), "remote", False) for v in views)
        except ViewUnavailable:
            remote = False  # compute meets the same error and the future carries it
        if remote:
            return _io().submit(contextvars.copy_context().run, compute)  # the request's read scope comes along
        later = _Inline(compute)
        if not deferred:
            later.run()
        return later

    def encoder_of(self, view: str):
        """The encoder of the view's pinned generation (the configured one if the view is down:
        the query then falls back to strategies that do not read it)."""
        if self._encoder_for is None:
            return self._default_encoder
        try:
            generation = getattr(self.store(view), "generation", None)
            return self._encoder_for(view, generation)
        except (ViewUnavailable, TransientError, StoreError):
            return self._default_encoder

    @cached_property
    def encoder(self):
        return self.encoder_of("dense")

    # -- the question ----------------------------------------------------------------------
    def prefetch_question(self) -> None:
        """Start encoding the question on the encoder's thread; `question_states` collects it.
        The forward pass is the largest single cost of a query and needs one core: a strategy
        calls this first and computes its vector-free signals (profile, BM25, keyword coverage)
        on the other core meanwhile."""
        if self._pending is None and "question_states" not in self.__dict__:
            with self.timed("encode"):  # tokenising, on this thread
                self._pending = self.encoder.submit_states(self.request.question)

    @cached_property
    def question_states(self):
        """The question's vector and token states: one forward pass serves the question vector
        and its entity spans (pooled later, once the profile has found them). `encode` times
        this thread: tokenising and waiting for the pass, or the whole pass if not prefetched."""
        with self.timed("encode"):
            if self._pending is None:
                return self.encoder.encode_states(self.request.question)
            return self._pending.result()

    def states_for(self, view: str):
        """The question's token states from the encoder `view`'s live generation was built with."""
        encoder = self.encoder_of(view)
        if encoder is self.encoder:
            return self.question_states
        if id(encoder) not in self._states_by_encoder:
            with self.timed("encode"):
                self._states_by_encoder[id(encoder)] = encoder.encode_states(self.request.question)
        return self._states_by_encoder[id(encoder)]

    @property
    def qvec(self) -> np.ndarray:
        return self.question_states.vector

    @cached_property
    def lexical_query(self) -> str:
        """The question's content words, for the BM25 engine (which stems them itself)."""
        return " ".join(keyword_words(self.request.question))

    # -- raw signals, aligned to corpus order ----------------------------------------------
    def _count(self, kind: str) -> int:
        """Units of a kind in the corpus (window levels together): an engine's result limit."""
        c = self.corpus
        if kind == "window":
            return sum(len(lv.units) for lv in c.windows.values())
        return c.n if kind == "turn" else len(c.episodes.units)

    def _keys(self, kind: str, level: int | None) -> KeyIndex:
        c = self.corpus
        if kind == "turn":
            return c.keys
        lv: Level = c.episodes if kind == "episode" else c.windows[level]
        return lv.keys

    def bm25(self, kind: str, level: int | None = None) -> np.ndarray:
        """BM25 score of every unit of the level (0 when the engine does not match it)."""
        key = ("bm25", kind, level)
        if key not in self._cache:
            positions = self._keys(kind, level)
            if len(positions) and self.lexical_query:
                self._cache[key] = positions.scatter(*self._bm25_raw(kind), fill=0.0)
            else:
                self._cache[key] = np.zeros(len(positions))
        return self._cache[key]

    def bm25_all(self) -> None:
        """Score every unit kind in one BM25 search and place the scores on every level (turns,
        each window size, episodes), for a strategy that will read several kinds (three
        searches, one per kind, cost ~2x more: three query set-ups)."""
        if ("bm25-raw", None) not in self._cache:
            limit = max(sum(self._count(kind) for kind in ("turn", "window", "episode")), 1)
            with self.timed("lexical"):
                self._cache[("bm25-raw", None)] = self.store("lexical").score_units(None, self.lexical_query, self.boundary, limit)
            self.bm25("turn"), self.bm25("episode")
            for size in self.corpus.windows:
                self.bm25("window", size)

    def seed_bm25(self, hit: tuple[np.ndarray, np.ndarray]) -> None:
        """The bounded path's BM25 search of its candidates of every kind (services/query/candidates.py),
        (keys, scores), as the signals' source: a unit it does not hold scores 0."""
        self._cache[("bm25-raw", None)] = hit

    def _bm25_raw(self, kind: str) -> tuple[np.ndarray, np.ndarray]:
        """The engine's (keys, scores) covering `kind`: the all-kinds search if one was made,
        else a search of that kind alone."""
        hit = self._cache.get(("bm25-raw", None)) or self._cache.get(("bm25-raw", kind))
        if hit is None:
            with self.timed("lexical"):
                hit = self._cache[("bm25-raw", kind)] = self.store("lexical").score_units(kind, self.lexical_query, self.boundary,
                                                                                          max(self._count(kind), 1))
        return hit

    def dense(self, kind: str, level: int | None = None, vector: np.ndarray | None = None) -> np.ndarray:
        """Cosine of every unit of the level to the question (or to `vector`)."""
        vkey = None if vector is None else vector.tobytes()
        key = ("dense", kind, level, vkey)
        if key not in self._cache:
            positions = self._keys(kind, level)
            if len(positions):
                self._cache[key] = positions.scatter(*self._dense_raw(kind, vector), fill=-1.0)
            else:
                self._cache[key] = np.full(0, -1.0)
        return self._cache[key]

    def _dense_raw(self, kind: str, vector: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The dense view's (keys, scores) of every `kind` unit for the question (or `vector`):
        one read per kind and vector in a query (prefetch_dense may have made it already)."""
        raw = ("dense-raw", kind, None if vector is None else vector.tobytes())
        if raw not in self._cache:
            q = self.qvec if vector is None else vector
            with self.timed("dense"):
                if self.corpus.bounded:  # the candidates' own scores, by id
                    ids = self.unit_ids(kind)
                    scores = self.store("dense").score_points(kind, q, self.boundary, ids)
                    got = [(unit_key(i), scores[i]) for i in ids if i in scores]
                    self._cache[raw] = (np.array([k for k, _ in got], dtype=np.int64), np.array([s for _, s in got], dtype=float))
                else:
                    self._cache[raw] = self.store("dense").score_units(kind, q, self.boundary)
        return self._cache[raw]

    def unit_ids(self, kind: str) -> list[str]:
        """Ids of the corpus's units of a kind (every window level together)."""
        c = self.corpus
        if kind == "turn":
            return [t.unit_id for t in c.turns]
        if kind == "episode":
            return [u.unit_id for u in c.episodes.units]
        if kind == "window":
            return [u.unit_id for lv in c.windows.values() for u in lv.units]
        return list(self._sentence_ids)

    def prefetch_dense(self, kinds: list[str], vector: np.ndarray | None = None) -> None:
        """Score several unit kinds against the question (or `vector`) in one round of the dense
        view (a server has them in flight together), for a strategy that knows it will read
        them; _dense_raw() then finds them here."""
        vkey = None if vector is None else vector.tobytes()
        todo = [k for k in dict.fromkeys(kinds) if ("dense-raw", k, vkey) not in self._cache]
        if len(todo) < 2 or self.corpus.bounded:
            return  # one read gains nothing from a batch (nor reads by id); dense() makes it when it is needed
        q = self.qvec if vector is None else vector
        with self.timed("dense"):
            got = self.store("dense").score_units_many([(k, q) for k in todo], self.boundary)
        self._cache.update({("dense-raw", k, vkey): r for k, r in zip(todo, got)})

    def sentence_relevance(self, incidence) -> np.ndarray:
        """Cosine of the question to each sentence of a SentenceIncidence (0 for sentences the
        dense view does not hold)."""
        self._sentence_ids = incidence.sentence_ids
        return incidence.keys.scatter(*self._dense_raw("sentence"), fill=0.0)

    @cached_property
    def _cache(self) -> dict:
        return {}
