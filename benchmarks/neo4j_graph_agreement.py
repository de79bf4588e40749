"""Agreement of the Neo4j + GDS graph view with the embedded one, on a real graph.

    .venv/bin/python benchmarks/neo4j_graph_agreement.py --graph PATH/graph.sqlite --uri bolt://127.0.0.1:7687 \
        [--questions 20] [--out bench-results/neo4j_graph_agreement.json]

PATH is an embedded graph view built by the pipeline (e.g. `memstream ingest locomo
../shared/data/locomo/locomo-dev.json --tenant locomo --process`, then
`$MEMSTREAM_DATA_DIR/views/graph/gen-1/graph.sqlite`). The script copies it into a fresh
generation of the Neo4j graph view through `apply` (one change set per conversation), compares
the canonical dumps and every boundary read, then runs personalised PageRank on both stores
with query-like reset vectors (entity activations 80 %, dense-like context priors 20 %) and
reports the largest absolute difference per setting, the top-10 agreement and timings. The
generation is dropped at the end. Needs a server with GDS >= 2.18 (infra/servers: neo4j).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from infra.graph.neo4j import Neo4jGraphStore  # noqa: E402
from infra.graph.sqlite import SqliteGraphStore  # noqa: E402
from schemas.ports.graph import AdjacencyEdge, EntityNode, GraphChangeSet, Mention, SentenceNode  # noqa: E402
from schemas.ports.views import Boundary  # noqa: E402
from schemas.units import entity_id  # noqa: E402

from services.query.config import DEFAULT  # noqa: E402

SETTINGS = {  # name -> (damping, keyword arguments): the query service's two walks, converged, hub-pruned
    f"query (gamma {DEFAULT.gamma}, {DEFAULT.ppr_iterations} it, tol 1e-7)": (
        DEFAULT.gamma, dict(adjacency_weight=1.0, max_iterations=DEFAULT.ppr_iterations)),
    f"closure ({DEFAULT.closure_gamma}, no SPEAKER, {DEFAULT.closure_iterations} it)": (
        DEFAULT.closure_gamma, dict(adjacency_weight=1.0, exclude_labels=("SPEAKER",), max_iterations=DEFAULT.closure_iterations)),
    "converged (0.8, 1000 it, tol 1e-12)": (0.8, dict(adjacency_weight=1.0, max_iterations=1000, tolerance=1e-12)),
    "hubs pruned (max_share 0.05, 30 it)": (0.8, dict(adjacency_weight=0.5, max_share=0.05, max_iterations=30)),
}



def same_incidence(a, b) -> bool:
    return (a.sentence_ids, a.context_ids, a.entity_ids) == (b.sentence_ids, b.context_ids, b.entity_ids) and (a.matrix != b.matrix).nnz == 0

def load(sq: SqliteGraphStore) -> dict[tuple[str, str], GraphChangeSet]:
    """One change set per (tenant, conversation), rebuilt from the embedded store's tables."""
    conn = sq._conn()
    tenants = [r[0] for r in conn.execute("SELECT DISTINCT tenant_id FROM turns")]
    changes: dict[tuple[str, str], GraphChangeSet] = defaultdict(GraphChangeSet)
    for tenant in tenants:
        for t in sq.turns_in_boundary(Boundary(tenant)):
            changes[(tenant, t.conversation_id)].put_turns.append(t)
    for cid, eid, count, weight, kind, tenant, conv in conn.execute(
            "SELECT context_id, entity_id, count, weight, kind, tenant_id, conversation_id FROM mentions ORDER BY context_id, entity_id"):
        changes[(tenant, conv)].mentions.append(Mention(eid, cid, count, weight, kind))
    for eid, tenant, name, label, vec in conn.execute("SELECT entity_id, tenant_id, name, label, vector FROM entities"):
        # a tenant's entities go with its first change set (the loop below applies them sorted)
        changes[min(k for k in changes if k[0] == tenant)].entities.append(EntityNode(eid, tenant, name, label, np.frombuffer(vec, dtype=np.float32)))
    for sid, cid, idx, start, end, ents, tenant, conv in conn.execute(
            "SELECT sentence_id, context_id, idx, start, end, entity_ids, tenant_id, conversation_id FROM sentences"):
        changes[(tenant, conv)].sentences.append(SentenceNode(sid, cid, idx, start, end, tuple(json.loads(ents))))
    for s, t, tenant, conv, session in conn.execute("SELECT source, target, tenant_id, conversation_id, session_id FROM adjacency"):
        changes[(tenant, conv)].adjacency.setdefault((tenant, conv, session), []).append(AdjacencyEdge(s, t, tenant, conv, session))
    return dict(changes)


def resets(sq: SqliteGraphStore, b: Boundary, n: int, rng: np.random.Generator) -> list[dict[str, float]]:
    snap = sq._snapshot(b)
    named = [snap.entities[i] for i in snap.named]
    keywords = [e for e, lab in zip(snap.entities, snap.entity_labels) if lab == "KEYWORD"]
    out = []
    for _ in range(n):
        ents = list(rng.choice(named, size=min(len(named), int(rng.integers(1, 4))), replace=False))
        ents += list(rng.choice(keywords, size=min(len(keywords), int(rng.integers(0, 4))), replace=False))
        act = rng.uniform(0.5, 1.0, len(ents))
        reset = {e: 0.8 * a / act.sum() for e, a in zip(ents, act)}
        prior = np.sort(rng.uniform(0, 1, 20))[::-1]
        for cid, w in zip(rng.choice(snap.contexts, size=min(20, len(snap.contexts)), replace=False), prior / prior.sum()):
            reset[cid] = reset.get(cid, 0.0) + 0.2 * float(w)
        out.append(reset)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--graph", required=True, type=Path)
    ap.add_argument("--uri", default="bolt://127.0.0.1:7687")
    ap.add_argument("--questions", type=int, default=20)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="neo4j-agreement-"))
    shutil.copy(args.graph, work / "graph.sqlite")  # never touch the source store
    sq = SqliteGraphStore(work / "graph.sqlite", 1)
    neo = Neo4jGraphStore(args.uri, uuid.uuid4().int % 2**52 + 1_000_000,
                          auth=("neo4j", os.environ["NEO4J_PASSWORD"]) if os.environ.get("NEO4J_PASSWORD") else None)
    report: dict = {"graph": str(args.graph), "uri": args.uri}
    try:
        changes = load(sq)
        t0 = time.perf_counter()
        for i, key in enumerate(sorted(changes)):
            neo.apply(changes[key], {0: i + 1})
        report["load_seconds"] = round(time.perf_counter() - t0, 2)
        counts = {k: len(v) for k, v in sq.canonical_dump().items() if isinstance(v, list)}
        report["size"] = counts
        report["canonical_dump_equal"] = sq.canonical_dump() == neo.canonical_dump()

        rng = np.random.default_rng(args.seed)
        reads_equal = defaultdict(lambda: True)
        align_diff = 0.0
        ppr: dict[str, dict] = {name: {"max_abs_diff": 0.0, "max_rel_diff": 0.0, "top10_identical": 0, "runs": 0} for name in SETTINGS}
        timings: dict[str, list[float]] = defaultdict(list)
        for tenant, conv in sorted(changes):
            b = Boundary(tenant, (conv,))
            reads_equal["entity_labels"] &= sq.entity_labels(b) == neo.entity_labels(b)
            reads_equal["context_mentions"] &= {k: sorted(v) for k, v in sq.context_mentions(b).items()} == \
                {k: sorted(v) for k, v in neo.context_mentions(b).items()}
            snap = sq._snapshot(b)
            probe = list(rng.choice(snap.entities, size=min(30, len(snap.entities)), replace=False)) + ["n_unknown"]
            reads_equal["present"] &= sq.present(b, probe) == neo.present(b, probe)
            reads_equal["sentence_incidence"] &= same_incidence(sq.sentence_incidence(b), neo.sentence_incidence(b))
            # alignment: noisy copies of real entity vectors, ids that never match exactly
            named = [snap.named_vectors[i] for i in rng.choice(len(snap.named), size=min(10, len(snap.named)), replace=False)]
            q = np.stack([v + rng.normal(0, 0.05, v.shape).astype(np.float32) for v in named])
            q /= np.linalg.norm(q, axis=1, keepdims=True)
            names = [entity_id(tenant, f"zz-no-such-name-{i}") for i in range(len(q))]
            a, n = sq.align_entities(b, names, q, 3), neo.align_entities(b, names, q, 3)
            reads_equal["align_entities_ids"] &= [[m.entity_id for m in x] for x in a] == [[m.entity_id for m in x] for x in n]
            align_diff = max(align_diff, max(abs(x.score - y.score) for xs, ys in zip(a, n) for x, y in zip(xs, ys)))
            for reset in resets(sq, b, args.questions, rng):
                for name, (damping, kw) in SETTINGS.items():
                    t = time.perf_counter()
                    want = sq.personalized_pagerank(b, reset, damping, **kw)
                    timings[f"sqlite {name}"].append(time.perf_counter() - t)
                    before = set(neo.projections())
                    t = time.perf_counter()
                    got = neo.personalized_pagerank(b, reset, damping, **kw)
                    built = bool(set(neo.projections()) - before)
                    timings[f"neo4j {name}, {'projection built' if built else 'projection cached'}"].append(time.perf_counter() - t)
                    assert set(got) == set(want), "different context sets"
                    diff = max(abs(got[k] - want[k]) for k in want)
                    top = max(want.values())
                    p = ppr[name]
                    p["max_abs_diff"] = max(p["max_abs_diff"], diff)
                    p["max_rel_diff"] = max(p["max_rel_diff"], diff / top if top else 0.0)
                    rank = lambda s: sorted(s, key=lambda k: (-s[k], k))[:10]  # noqa: E731
                    p["top10_identical"] += rank(got) == rank(want)
                    p["runs"] += 1
        # narrower and wider boundaries: the whole tenant, some sessions, a time window, an agent
        tenant, conv = sorted(changes)[0]
        turns = sorted(changes[(tenant, conv)].put_turns, key=lambda t: t.occurred_at)
        sessions = tuple(sorted({t.session_id for t in turns})[:3])
        extra = {"tenant-wide": Boundary(tenant), "3 sessions": Boundary(tenant, (conv,), session_ids=sessions),
                 "time window": Boundary(tenant, (conv,), since=turns[len(turns) // 4].occurred_at, until=turns[len(turns) // 2].occurred_at),
                 "one agent": Boundary(tenant, (conv,), agent_ids=(turns[0].agent_id,))}
        report["boundaries"] = {}
        for label, b in extra.items():
            snap = sq._snapshot(b)
            worst = 0.0
            for reset in resets(sq, b, 3, rng):
                want = sq.personalized_pagerank(b, reset, 0.8, max_iterations=1000, tolerance=1e-12)
                got = neo.personalized_pagerank(b, reset, 0.8, max_iterations=1000, tolerance=1e-12)
                assert set(got) == set(want), f"{label}: different context sets"
                worst = max(worst, max(abs(got[k] - want[k]) for k in want))
            report["boundaries"][label] = {
                "contexts": len(snap.contexts), "ppr_converged_max_abs_diff": worst,
                "reads_equal": sq.entity_labels(b) == neo.entity_labels(b) and sq.context_mentions(b) == neo.context_mentions(b)
                and same_incidence(sq.sentence_incidence(b), neo.sentence_incidence(b))}
        report["reads_equal"] = dict(reads_equal)
        report["align_max_score_diff"] = align_diff
        report["ppr"] = ppr
        # the first call per (boundary, setting) builds the GDS projection, the rest reuse it
        report["timings_ms"] = {k: {"calls": len(v), "median": round(statistics.median(v) * 1000, 1), "max": round(max(v) * 1000, 1)}
                                for k, v in sorted(timings.items())}
    finally:
        neo.drop_generation()
        neo.close()
        sq.close()
        shutil.rmtree(work, ignore_errors=True)
    text = json.dumps(report, indent=2, default=float)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)


if __name__ == "__main__":
    main()
