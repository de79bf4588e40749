"""Baseline strategies, on the same ingested data and budget as Zero-Mem.

- `bm25`: BM25 over turns.
- `dense`: cosine over turn vectors.
- `hybrid-rrf`: reciprocal-rank fusion (k=60) of the two.
- `raw-rag` (Raw-RAG, seed 002): its own 256-token windows with 32-token overlap over the
  serialised conversation (sessions concatenated in order, each turn as
  "[date] Speaker: text"), dense top-128, then a cross-encoder rerank to the top 15 when a
  reranker model is configured. No reranker weights are obtainable here, so it runs without one
  and says so in its notes. Its windows are the strategy's own index: built on first use per
  corpus (boundary and conversation version) and kept with it (encoding them is what makes
  Raw-RAG expensive to ingest).
- `pyramid` (MGRetrieval, seed 001, made zero-token): the query's keywords that occur in the
  memory's vocabulary form a pyramid of keyword groups, from the most specific (all keywords,
  rarest first) to single keywords; turns matching a group are taken in BM25 order, and the
  scope widens group by group until the budget is filled. No LLM judges sufficiency: the budget
  does.

Every baseline ranks all turns of the boundary, so any budget can be filled.
"""

from __future__ import annotations

import itertools

import numpy as np

from services.query.analysis import keywords, tokens
from services.query.context import Candidate, QueryContext, Ranking

RRF_K = 60


def order(scores: np.ndarray) -> list[int]:
    """Positions by descending score; ties keep conversation order (deterministic)."""
    return sorted(range(len(scores)), key=lambda i: (-scores[i], i))


def turn_ranking(ctx: QueryContext, positions: list[int], scores: dict[str, np.ndarray], by: np.ndarray | None = None) -> list[Candidate]:
    """Turn candidates in `positions` order; `by` is the score that order follows (default: the
    first of `scores`; with none, the candidates' rank gives a descending score)."""
    turns = ctx.corpus.turns
    if by is None:
        by = next(iter(scores.values()), None)
    return [
        Candidate(turns[i].unit_id, "turn", [i], "primary", {k: float(v[i]) for k, v in scores.items()},
                  float(by[i]) if by is not None else float(len(positions) - rank))
        for rank, i in enumerate(positions)
    ]


def bm25(ctx: QueryContext) -> Ranking:
    s = ctx.bm25("turn")
    return Ranking(turn_ranking(ctx, order(s), {"bm25": s}))


def dense(ctx: QueryContext) -> Ranking:
    s = ctx.dense("turn")
    return Ranking(turn_ranking(ctx, order(s), {"dense": s}))


def rrf_scores(*rankings: list[int], k: int = RRF_K) -> np.ndarray:
    n = len(rankings[0])
    out = np.zeros(n)
    for r in rankings:
        for rank, i in enumerate(r):
            out[i] += 1.0 / (k + rank + 1)
    return out


def hybrid_rrf(ctx: QueryContext) -> Ranking:
    ctx.prefetch_question()  # BM25 runs while the question is encoded
    b, d = ctx.bm25("turn"), ctx.dense("turn")
    s = rrf_scores(order(b), order(d))
    return Ranking(turn_ranking(ctx, order(s), {"rrf": s, "bm25": b, "dense": d}))


# -- pyramid ----------------------------------------------------------------------------------
def pyramid(ctx: QueryContext, depth: int = 4) -> Ranking:
    corpus = ctx.corpus
    bags = _stem_bags(corpus)
    df: dict[str, int] = {}
    for bag in bags:
        for t in bag:
            df[t] = df.get(t, 0) + 1
    kws = [k for k in dict.fromkeys(keywords(ctx.request.question)) if k in df]
    kws.sort(key=lambda k: (df[k], k))  # rarest (most specific) first
    kws = kws[:depth]
    bm = ctx.bm25("turn")
    ranked: list[int] = []
    seen: set[int] = set()
    groups = [g for size in range(len(kws), 0, -1) for g in itertools.combinations(kws, size)]
    for level, group in enumerate(groups):
        hit = [i for i in range(corpus.n) if i not in seen and all(k in bags[i] for k in group)]
        hit.sort(key=lambda i: (-bm[i], i))
        ranked.extend(hit)
        seen.update(hit)
    ranked.extend(i for i in order(ctx.dense("turn")) if i not in seen)  # beyond the pyramid: dense order
    # The pyramid orders by keyword group first, so its score is the rank's: n for the first, 1 for the last.
    level = np.zeros(corpus.n)
    level[ranked] = np.arange(len(ranked), 0, -1)
    return Ranking(turn_ranking(ctx, ranked, {"bm25": bm}, by=level), notes=[f"pyramid keywords: {', '.join(kws) or '(none)'}"])


def _stem_bags(corpus) -> list[set[str]]:
    bags = corpus.derived.get("stem_bags")
    if bags is None:  # two queries racing here both build the same bags
        bags = corpus.derived["stem_bags"] = [set(tokens(f"{t.provenance.speakers[0]}: {t.text}")) for t in corpus.turns]
    return bags


# -- raw-rag ----------------------------------------------------------------------------------
class RawRag:
    """Raw-RAG over its own token windows; the window index is kept on the corpus."""

    def __init__(self, window_tokens: int = 256, overlap: int = 32, dense_k: int = 128, rerank_k: int = 15, reranker=None):
        self.window_tokens = window_tokens
        self.overlap = overlap
        self.dense_k = dense_k
        self.rerank_k = rerank_k
        self.reranker = reranker

    def _index(self, ctx: QueryContext) -> tuple[list[list[int]], np.ndarray]:
        key = ("raw-rag", self.window_tokens, self.overlap)
        hit = ctx.corpus.derived.get(key)
        if hit is not None:
            return hit
        tokenizer = getattr(ctx.encoder, "_tokenizer", None)
        corpus = ctx.corpus
        lines = [f"[{t.provenance.occurred_from:%d %B %Y}] {t.provenance.speakers[0]}: {t.text}" for t in corpus.turns]
        lengths = [len(tokenizer.tokenize(x)) if tokenizer is not None else len(x.split()) for x in lines]
        windows: list[list[int]] = []
        start = 0
        step = self.window_tokens - self.overlap
        offsets = np.cumsum([0, *lengths])
        total = offsets[-1]
        while start < total or not windows:
            end = start + self.window_tokens
            members = [i for i in range(corpus.n) if offsets[i] < end and offsets[i + 1] > start]
            windows.append(members)
            if end >= total:
                break
            start += step
        with ctx.timed("raw-rag index"):
            vectors = ctx.encoder.encode(["\n".join(lines[i] for i in w) for w in windows]) if corpus.n else np.zeros((0, 1))
        ctx.corpus.derived[key] = (windows, vectors)
        return windows, vectors

    def __call__(self, ctx: QueryContext) -> Ranking:
        windows, vectors = self._index(ctx)
        if not windows or ctx.corpus.n == 0:
            return Ranking([])
        scores = vectors @ ctx.qvec
        top = order(scores)[: self.dense_k]
        notes = []
        if self.reranker is None:
            notes.append("raw-rag: no reranker configured (no cross-encoder weights are available here); dense order kept")
        else:  # pragma: no cover - needs reranker weights
            pairs = [[ctx.request.question, "\n".join(ctx.corpus.turns[i].text for i in windows[w])] for w in top]
            rr = np.asarray(self.reranker.compute_score(pairs))
            top = [top[j] for j in order(rr)][: self.rerank_k] + top[self.rerank_k:]
        cands = [Candidate(f"rawrag:{w}", "span", windows[w], "primary", {"dense": float(scores[w])}, float(scores[w])) for w in top]
        seen = {i for c in cands for i in c.turns}
        turn_dense = ctx.dense("turn")
        cands += turn_ranking(ctx, [i for i in order(turn_dense) if i not in seen], {"dense": turn_dense})
        for c in cands[len(top):]:
            c.role = "fill"
        return Ranking(cands, notes=notes)
