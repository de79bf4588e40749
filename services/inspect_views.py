"""Show what each view holds for a conversation, with provenance (used by `memstream demo`
and `memstream inspect`). Every line printed here can be traced back to log positions."""

from __future__ import annotations

from collections import Counter
from typing import Callable

from schemas.ports.views import Boundary
from streams.pipeline import Pipeline


def _short(text: str, n: int = 90) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


def describe(pipeline: Pipeline, boundary: Boundary, out: Callable[[str], None] = print, probe: str | None = None) -> None:
    units = pipeline.store("hierarchy")
    turns = units.list_units(boundary, "turn")
    windows = units.list_units(boundary, "window")
    episodes = units.list_units(boundary, "episode")
    out(f"hierarchy view ({units.backend}): {len(turns)} turns, {len(windows)} windows, {len(episodes)} episodes")
    for u in turns[:4]:
        p = u.provenance
        pos = ", ".join(f"p{lp.partition}@{lp.offset}" for lp in p.log_positions)
        out(f"  turn {u.unit_id} [{p.session_id} #{p.turn_start}] {p.speakers[0]}: {_short(u.text, 70)}")
        out(f"       event={p.event_ids[0]} log={pos} occurred_at={p.occurred_from.isoformat()}")
    if len(turns) > 4:
        out(f"  … {len(turns) - 4} more turns")
    for u in windows[:2] + episodes[:2]:
        p = u.provenance
        out(f"  {u.kind} {u.unit_id} [{p.session_id} turns {p.turn_start}-{p.turn_end}] events {p.event_ids[0]}…{p.event_ids[-1]}")

    graph = pipeline.store("graph")
    snap = graph._snapshot(boundary) if hasattr(graph, "_snapshot") else None
    if snap is not None:
        degree = Counter()
        for cid, ents in snap.context_entities.items():
            degree.update(ents)
        names = dict(zip(snap.entities, snap.entity_names))
        labels = dict(zip(snap.entities, snap.entity_labels))
        top = ", ".join(f"{names[e]} ({labels[e]}, {n})" for e, n in degree.most_common(8))
        out(f"graph view ({graph.backend}): {len(snap.contexts)} contexts, {len(snap.entities)} entities, "
            f"{snap.mention_matrix.nnz} entity–context edges, {snap.adjacency.nnz // 2} adjacency edges, {len(snap.sentences.sentence_ids)} sentences with entities")
        out(f"  most connected entities: {top}")
        if snap.entities:
            seed = max(degree, key=lambda e: (labels[e] != "SPEAKER", degree[e]))
            ppr = graph.personalized_pagerank(boundary, {seed: 1.0}, 0.6)
            best = sorted(ppr.items(), key=lambda kv: -kv[1])[:3]
            texts = units.get_units(boundary.tenant_id, [c for c, _ in best])
            out(f"  personalised PageRank from '{names[seed]}':")
            for cid, score in best:
                out(f"    {score:.3f} {cid}: {_short(texts[cid].text, 70) if cid in texts else '?'}")

    lexical = pipeline.store("lexical")
    query = probe or (turns[0].text.split()[0] if turns else "")
    for kind in ("turn", "window", "episode"):
        hits = lexical.search(kind, query, boundary, 2)
        out(f"lexical view ({lexical.backend}) BM25 {kind}s for {query!r}: " + "; ".join(f"{h.unit_id} {h.score:.2f}" for h in hits))

    dense = pipeline.store("dense")
    vec = pipeline.backends.encoder().encode([query])[0]
    for kind in ("turn", "window", "episode", "sentence"):
        hits = dense.search(kind, vec, boundary, 2)
        out(f"dense view ({dense.backend}) cosine {kind}s for {query!r}: " + "; ".join(f"{h.unit_id} {h.score:.3f}" for h in hits))
