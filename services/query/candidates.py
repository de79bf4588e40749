"""The bounded query path: a question's candidates from each view's index, and the corpus of
those candidates that the strategies rank.

Ranking every turn of a boundary costs time in proportion to the boundary; here a question costs
about the same in a conversation of a thousand turns as in one of a hundred thousand:

1. the lexical view's BM25 top `lexical_top` turns, windows and episodes, and the dense view's
   `dense_top` nearest of each (its engine's index: exact while small, HNSW beyond);
2. the candidate turns: the turns found, the members of the `members_of` best windows and
   episodes, and every candidate's ±`neighbours` turns in its session;
3. a Corpus (services/query/corpus.py) of those turns, with the windows and episodes that hold
   them, read by key and id from the hierarchy view.

The strategies then run on that corpus as on a whole boundary; what they would read for the whole
boundary (dense scores, the graph's labels, sentences and walk) they read for the candidates
only (services/query/context.py, zeromem.py). Min-max normalisation is over the candidates.
"""

from __future__ import annotations

from itertools import repeat

import numpy as np

from schemas.errors import ViewUnavailable
from schemas.ports.views import Boundary
from schemas.units import TraceUnit, unit_key
from services.query.config import Bounds
from services.query.corpus import Corpus, Level, window_size

KINDS = ("turn", "window", "episode")


def _inside(u: TraceUnit, b: Boundary) -> bool:
    p = u.provenance
    if b.session_ids is not None and p.session_id not in b.session_ids:
        return False
    if b.agent_ids is not None and not set(p.agent_ids) & set(b.agent_ids):
        return False
    if b.since is not None and p.occurred_to < b.since:
        return False
    return b.until is None or p.occurred_from <= b.until


def candidate_corpus(ctx, bounds: Bounds) -> Corpus:
    """The candidates of `ctx`'s question inside its boundary, as a corpus (see the module)."""
    b = ctx.boundary
    units = ctx.store("hierarchy")
    ctx.prefetch_question()  # the encoder runs while the lexical view answers
    found: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]] = {}
    none = (np.zeros(0, np.int64), np.zeros(0))
    try:
        with ctx.timed("lexical"):
            for kind in KINDS:
                found[("bm25", kind)] = ctx.store("lexical").score_units(kind, ctx.lexical_query, b, bounds.lexical_top) \
                    if ctx.lexical_query else none
    except ViewUnavailable:  # as for the dense view below: the strategy meets the absence itself
        found = {k: v for k, v in found.items() if k[0] != "bm25"}
        lexical_down = True
    else:
        lexical_down = False
    try:
        with ctx.timed("dense"):
            for kind in KINDS:
                found[("dense", kind)] = ctx.store("dense").nearest(kind, ctx.qvec, b, bounds.dense_top)
    except ViewUnavailable:
        pass  # no dense candidates: the strategy meets the dense view's absence itself (and falls back)

    with ctx.timed("candidates"):
        keys = {kind: {int(k) for (_, kd), (ks, _) in found.items() if kd == kind for k in ks} for kind in KINDS}
        fetched = units.units_by_keys(b.tenant_id, [k for kind in KINDS for k in keys[kind]])
        superseded = units.superseded(b)
        turns: dict[str, TraceUnit] = {u.unit_id: u for k, u in fetched.items() if u.kind == "turn" and _inside(u, b)}
        groups: dict[str, TraceUnit] = {u.unit_id: u for u in fetched.values() if u.kind != "turn"}
        # Members of the best windows and episodes, by their best score in either view.
        best: dict[str, float] = {}
        for (view, kind), (ks, scores) in found.items():
            if kind == "turn" or not len(ks):
                continue
            top = np.argsort(-scores, kind="stable")[: bounds.members_of]
            for k in ks[top].tolist():
                u = fetched.get(int(k))
                if u is not None:
                    best[u.unit_id] = 1.0
        wanted = {t for uid in best for t in groups[uid].turn_ids if len(groups[uid].turn_ids) <= bounds.members_cap} - set(turns)
        containing = units.containing(b.tenant_id, [*turns, *wanted])
        group_ids = {g for gs in containing.values() for g in gs} - set(groups)
        groups.update(units.get_units(b.tenant_id, sorted(group_ids)))
        flat = _flat_members(groups.values())  # the groups do not change from here on
        near = _neighbours(set(turns) | wanted, flat, bounds.neighbours)
        more = sorted((wanted | near) - set(turns))
        turns.update({uid: u for uid, u in units.get_units(b.tenant_id, more).items() if _inside(u, b)})
        for tid in superseded:
            turns.pop(tid, None)
        corpus = _corpus(ctx, units, b, turns, groups, flat)
    if not lexical_down and ctx.lexical_query:  # every candidate's own BM25 score, as the whole boundary's ranking gives it
        with ctx.timed("lexical"):
            ctx.corpus = corpus
            # One search for every kind: a unit's score does not depend on the kind asked.
            ids = [i for kind in KINDS for i in ctx.unit_ids(kind)]
            ctx.seed_bm25(ctx.store("lexical").score_ids(None, ctx.lexical_query, b, ids))
    elif not lexical_down:
        ctx.seed_bm25((np.zeros(0, np.int64), np.zeros(0)))
    return corpus


def _flat_members(groups) -> tuple[list[str], np.ndarray]:
    """The groups' member turn ids one group after another, with each member's group ordinal: the
    walks over every member of every candidate's windows and episodes become array work (a long
    conversation's episodes hold hundreds of turns each)."""
    members: list[str] = []
    lengths: list[int] = []
    for g in groups:
        members.extend(g.turn_ids)
        lengths.append(len(g.turn_ids))
    return members, np.repeat(np.arange(len(lengths)), lengths)


def _neighbours(turn_ids: set[str], flat: tuple[list[str], np.ndarray], r: int) -> set[str]:
    """The turns within r of each given turn in its session, from the member lists of the windows
    and episodes that hold them (consecutive in session order)."""
    if r <= 0:
        return set()
    members, group = flat
    at = np.flatnonzero(np.fromiter(map(turn_ids.__contains__, members), bool, len(members)))
    out: set[str] = set()
    for d in range(-r, r + 1):
        near = at + d
        inside = (near >= 0) & (near < len(members))
        near, origin = near[inside], at[inside]
        out.update(map(members.__getitem__, near[group[near] == group[origin]].tolist()))
    return out


def _adjacent(ordered: list[TraceUnit], index: dict[str, int], flat: tuple[list[str], np.ndarray]) -> np.ndarray:
    """Per corpus turn: whether the turn before it in the corpus is its predecessor in some window
    or episode (consecutive members of one group, both in the corpus)."""
    members, group = flat
    pos = np.fromiter(map(index.get, members, repeat(-1)), np.int64, len(members))
    follows = (pos[:-1] >= 0) & (pos[1:] == pos[:-1] + 1) & (group[:-1] == group[1:])
    out = np.zeros(len(ordered), dtype=bool)
    out[pos[1:][follows]] = True
    return out


def _corpus(ctx, units, b: Boundary, turns: dict[str, TraceUnit], groups: dict[str, TraceUnit],
            flat: tuple[list[str], np.ndarray]) -> Corpus:
    starts = units.session_starts(b.tenant_id, sorted({(u.provenance.conversation_id, u.provenance.session_id)
                                                       for u in turns.values()}))

    def order(u: TraceUnit) -> tuple:
        p = u.provenance
        return (p.conversation_id, starts.get((p.conversation_id, p.session_id)), p.session_id, p.turn_start, u.unit_id)

    ordered = sorted(turns.values(), key=order)
    index = {u.unit_id: i for i, u in enumerate(ordered)}
    session_ord: dict[tuple[str, str], int] = {}
    sessions = [session_ord.setdefault((u.provenance.conversation_id, u.provenance.session_id), len(session_ord)) for u in ordered]
    adjacent = _adjacent(ordered, index, flat)
    kept = [g for g in groups.values() if not index.keys().isdisjoint(g.turn_ids) and _inside(g, b)]
    by_size: dict[int, list[TraceUnit]] = {}
    for g in sorted(kept, key=lambda g: g.unit_id):
        if g.kind == "window":
            by_size.setdefault(window_size(g), []).append(g)
    episodes = sorted((g for g in kept if g.kind == "episode"), key=lambda g: g.unit_id)
    speaker = [u.provenance.speakers[0] for u in ordered]
    known = units.speakers(b)
    corpus = Corpus(
        boundary=b, turns=ordered, index=index, session=np.array(sessions, dtype=int), speaker=speaker,
        speakers=list(dict.fromkeys([*known, *speaker])), occurred=[u.provenance.occurred_from for u in ordered],
        windows={size: Level.of(ws, index, len(ordered)) for size, ws in sorted(by_size.items())},
        episodes=Level.of(episodes, index, len(ordered)),
    )
    corpus.by_unit = {u.unit_id: u for u in (*ordered, *kept)}
    corpus.keys_from([unit_key(u.unit_id) for u in ordered])
    corpus.bounded = True
    corpus.adjacent = adjacent
    corpus.latest = units.latest(b)
    corpus.size = units.size(b)
    return corpus
