"""Learned fusion of the views' signals, judged leave-one-conversation-out (issue 18).

    .venv/bin/python benchmarks/learned_fusion.py --data-dir DIR [--models logistic,trees,listwise,nested] [--more]

Zero-Mem fuses its views by a fixed formula whose constants a coordinate descent selects (GRID).
This screen asks whether a ranker *learned* from the same signals does better on conversations it
was not fitted on: per turn and question, the signals the method already computes (BM25 and dense
relevance of the turn, of its windows and episode, the RM3-like expansion, the neighbours', keyword
coverage, the information prior, the graph view's PageRank, the calibration's compatibilities), a
model fitted on four conversations' questions (a turn is positive when it is a gold turn) ranks the
fifth's turns, every fold. Models: pointwise logistic regression, gradient-boosted trees, a linear
listwise model (each question's softmax over its turns), and `nested`, the listwise model whose L2
and signal set (the formula's, or with --more's extended signals too) are chosen per fold by an
inner leave-one-conversation-out over its four training conversations: the honest figure, since
choosing among the others by their held-out figures would tune on the held-out conversation. The
signals are raw (each min-max normalised per question), not the
shipped mixes, so the fold's model does not inherit constants chosen on the held-out conversation;
the graph view's own walk constants and the expansion's are the shipped ones (a small in-sample
share). The same is fitted without the graph view's signals, so the graph view's worth under a
learned fusion shows as a paired difference. Paired intervals against docs/results/eval-loco.json (the
headline: the method re-tuned per fold) use services/eval/intervals.py. The store is ingested with the
configured encoder (MEMSTREAM_ENCODER_MODEL / _PATH): another encoder needs a DIR of its own.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from zeromem_variants import Variant, open_bank  # noqa: E402  (benchmarks/zeromem_variants.py)
from services.eval import intervals, loco  # noqa: E402
from services.eval.metrics import CATEGORIES  # noqa: E402
from services.query import zeromem as zm  # noqa: E402
from services.query.config import DEFAULT  # noqa: E402

GRAPH = ("graph", "has_graph", "graph_lex", "graph_rr")
BASE = ("bm25", "dense", "ep_bm25", "ep_dense", "expansion", "graph", "graph_lex", "has_graph", "info", "label", "lexcov", "nb_bm25", "nb_dense",
        "subject", "time", "type", "w0_bm25", "w0_dense", "w1_bm25", "w1_dense")  # signals() gives these
TYPES = ("date", "description", "duration", "list", "number", "person", "place", "yesno")


def _mm(x) -> np.ndarray:
    return zm._finite(zm.mm(np.asarray(x, dtype=float)))


def signals(z: zm.ZeroMem) -> dict[str, np.ndarray]:
    """Per-turn signals of one question (corpus order), each a 1-D array."""
    ctx, c = z.ctx, z.corpus
    z.scores("zero-mem")  # fills the caches (BM25 of every level, dense rounds, the walk)
    out = {"bm25": _mm(ctx.bm25("turn")), "dense": _mm(ctx.dense("turn"))}
    for k, (size, level) in enumerate(sorted(c.windows.items())):
        if level.units:
            out[f"w{k}_bm25"] = zm._finite(level.lift(_mm(ctx.bm25("window", size))))
            out[f"w{k}_dense"] = zm._finite(level.lift(_mm(ctx.dense("window", size))))
    if c.episodes.units:
        out["ep_bm25"] = zm._finite(c.episodes.lift(_mm(ctx.bm25("episode"))))
        out["ep_dense"] = zm._finite(c.episodes.lift(_mm(ctx.dense("episode"))))
    out["expansion"] = _mm(z._memo("expansion", ("lexical_prf_docs", "lexical_prf_terms"), z._expansion))  # scores() made it for some types
    out["nb_bm25"] = z._neighbour_max(out["bm25"])
    out["nb_dense"] = z._neighbour_max(out["dense"])
    out["lexcov"] = np.asarray(z.lexcov, dtype=float)
    out["info"] = np.asarray(zm._turn_arrays(c).info, dtype=float)
    subj, atype, tcomp = z.compat
    out["subject"], out["type"], out["time"] = (np.asarray(a, dtype=float) for a in (subj, atype, tcomp))
    out["label"] = np.asarray(z.label_flags, dtype=float)
    g = z.graph_scores
    out["graph"] = _mm(g) if g is not None else np.zeros(z.n)
    out["has_graph"] = np.full(z.n, float(g is not None))
    out["graph_lex"] = out["graph"] * out["lexcov"]
    return out


def extended(z: Variant, out: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """More signals than the formula uses: the turn's best sentence, each signal's reciprocal rank
    (rank fusion's shape), the session's best turns."""
    out["sentence"] = zm._finite(z._sentence_max())
    for name in ("bm25", "dense", "graph", "expansion"):
        rank = np.empty(z.n)
        rank[zm._order(out[name])] = np.arange(z.n)
        out[name + "_rr"] = 10.0 / (10.0 + rank)
    rel = out["bm25"] + out["dense"]
    session, sess = z.corpus.session, np.zeros(z.n)
    for s_ in np.unique(session):
        members = np.flatnonzero(session == s_)
        sess[members] = np.sort(rel[members])[::-1][:3].mean()
    out["session"] = _mm(sess)
    return out


def build(bank: loco.QuestionBank, log, more: bool = False, interact: tuple[str, ...] = ()) -> tuple[list[str], list[np.ndarray], list[np.ndarray], list[list[str]]]:
    """(feature names, per-question feature matrices, per-question 0/1 labels, per-question refs).
    `more`: the extended signals too; `interact`: these signals also per answer type (a weight of
    their own for each type of question)."""
    names: list[str] | None = None
    X, Y, R = [], [], []
    t0 = time.perf_counter()
    for i in range(len(bank.qs)):
        ctx, refs = bank._context(i)
        z = Variant(ctx, DEFAULT)  # the shipped method (no variant set), with the screen's extra signals
        s = signals(z)
        if more:
            s = extended(z, s)
        for n in interact:
            for t in TYPES:
                s[f"{n}*{t}"] = s[n] * float(z.profile.answer_type == t)
        if names is None:
            names = sorted(s)
        X.append(np.stack([s.get(n, np.zeros(len(refs))) for n in names], axis=1))
        Y.append(np.array([r in bank.gold[i] for r in refs], dtype=float))
        R.append(refs)
        if (i + 1) % 100 == 0:
            log(f"signals: {i + 1}/{len(bank.qs)} questions ({time.perf_counter() - t0:.0f} s)")
    return names or [], X, Y, R


def make_model(kind: str):
    from sklearn.ensemble import HistGradientBoostingClassifier
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    if kind == "logistic":
        return make_pipeline(StandardScaler(), LogisticRegression(C=1.0, max_iter=2000))
    if kind == "trees":  # few, shallow trees: ~900 positives per fold
        return HistGradientBoostingClassifier(max_iter=150, learning_rate=0.05, max_leaf_nodes=8, min_samples_leaf=200,
                                              l2_regularization=1.0, random_state=0)
    if kind == "listwise":
        return Listwise()
    raise ValueError(kind)


class Listwise:
    """A linear score fitted by each question's softmax over its turns (the gold turns' mean
    log-likelihood, L2 on the weights): it learns to rank within a question, as the evidence is
    used, instead of telling turns apart across questions as a pointwise fit does."""

    def __init__(self, l2: float = 1e-2):
        self.l2 = l2

    def fit_lists(self, X: list[np.ndarray], Y: list[np.ndarray]) -> "Listwise":
        from scipy.optimize import minimize

        keep = [j for j, y in enumerate(Y) if y.sum() > 0]
        X, Y = [X[j] for j in keep], [Y[j] / Y[j].sum() for j in keep]
        self.mu = np.concatenate(X).mean(axis=0)
        self.sd = np.concatenate(X).std(axis=0) + 1e-9
        Xs = [(x - self.mu) / self.sd for x in X]

        def loss(w):
            total, grad = 0.0, np.zeros_like(w)
            for x, y in zip(Xs, Y):
                s = x @ w
                s = s - s.max()
                p = np.exp(s)
                p /= p.sum()
                total -= float(y @ np.log(p + 1e-300))
                grad -= x.T @ (y - p)
            n = len(Xs)
            return total / n + self.l2 * float(w @ w), grad / n + 2 * self.l2 * w

        self.w = minimize(loss, np.zeros(Xs[0].shape[1]), jac=True, method="L-BFGS-B").x
        return self

    def score(self, x: np.ndarray) -> np.ndarray:
        return ((x - self.mu) / self.sd) @ self.w


def _fit(kind: str, X, Y, idx, cols: list[int], l2: float):
    model = make_model(kind)
    if isinstance(model, Listwise):
        model.l2 = l2
        return model.fit_lists([X[i][:, cols] for i in idx], [Y[i] for i in idx])
    return model.fit(np.concatenate([X[i][:, cols] for i in idx]), np.concatenate([Y[i] for i in idx]))


def _metrics(bank, model, X, R, cols: list[int], i: int) -> dict[str, float]:
    p = model.score(X[i][:, cols]) if isinstance(model, Listwise) else model.predict_proba(X[i][:, cols])[:, 1]
    order = zm._order(p)[: max(max(bank.budgets), loco.NDCG_AT)]
    return loco.rank_metrics([R[i][j] for j in order.tolist()], bank.gold[i], len(bank.qs[i].gold), bank.budgets)


def held_out(bank, X, Y, R, cols: list[int], kind: str, l2: float = 1e-2, choose=None, idx: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Per-question metrics, each question of `idx` (default: all) ranked by the model fitted on the
    other conversations of `idx`. `choose(train) -> (l2, cols)`: the fold's setting, selected on its
    training questions only."""
    idx = np.arange(len(bank.qs)) if idx is None else idx
    out = {m: np.zeros(len(bank.qs)) for m in loco.metric_names(bank.budgets)}
    for fold in sorted(set(bank.conv_of[idx].tolist())):
        train, test = idx[bank.conv_of[idx] != fold], idx[bank.conv_of[idx] == fold]
        fold_l2, fold_cols = choose(train) if choose else (l2, cols)
        model = _fit(kind, X, Y, train, fold_cols, fold_l2)
        for i in test:
            for m, v in _metrics(bank, model, X, R, fold_cols, int(i)).items():
                out[m][i] = v
    return out


def nested_choice(bank, X, Y, R, settings: dict[str, list[int]], l2s=(1e-3, 1e-2, 1e-1), log=print):
    """A choose() for held_out: the (L2, signal set) with the best inner leave-one-conversation-out
    objective over the outer fold's training conversations, so that the held-out conversation
    plays no part in the choice."""
    def choose(train: np.ndarray):
        best = None
        for label, cols in settings.items():
            for l2 in l2s:
                r = held_out(bank, X, Y, R, cols, "listwise", l2, idx=train)
                score = float(np.mean([r[m][train].mean() for m in loco.OBJECTIVE]))
                if best is None or score > best[0]:
                    best = (score, l2, label, cols)
        left_out = sorted(set(range(len(bank.conversations))) - set(bank.conv_of[train].tolist()))
        log(f"  fold without {left_out}: chose {best[2]}, L2 {best[1]} (inner objective {best[0]:.4f})")
        return best[1], best[3]

    return choose


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="../shared/data/locomo/locomo-dev.json")
    ap.add_argument("--data-dir", required=True, help="ingested split, kept between runs (ingested on first use)")
    ap.add_argument("--models", default="logistic,trees,listwise,nested", help="comma-separated of logistic, trees, listwise, nested")
    ap.add_argument("--more", action="store_true", help="the extended signals too (best sentence, reciprocal ranks, session); nested implies it")
    ap.add_argument("--interact", default="", help="comma-separated signals that get a weight per answer type")
    ap.add_argument("--l2", type=float, default=1e-2, help="the listwise model's L2")
    ap.add_argument("--against", default="docs/results/eval-loco.json", help="the LOCO headline report to pair with")
    args = ap.parse_args()
    kinds = [m for m in args.models.split(",") if m]
    if unknown := sorted(set(kinds) - {"logistic", "trees", "listwise", "nested"}):
        ap.error(f"unknown models {unknown}")
    bank, views, _ = open_bank(Path(args.data), Path(args.data_dir))
    base = json.loads(Path(args.against).read_text())
    keys = loco.question_keys(bank.qs)
    loco.check_pairable(base, keys)
    where = {k: j for j, k in enumerate(base["question_keys"])}
    align = np.array([where[k] for k in keys])
    try:
        names, X, Y, R = build(bank, lambda s: print(s, flush=True), args.more or "nested" in kinds, tuple(n for n in args.interact.split(",") if n))
        print(f"{len(names)} signals: {', '.join(names)}; {sum(len(y) for y in Y)} turn rows, {int(sum(y.sum() for y in Y))} gold", flush=True)
        everything = list(range(len(names)))
        no_graph = [j for j, n in enumerate(names) if n.split("*")[0] not in GRAPH]
        results = {}
        for kind in kinds:
            for label, cols in (("all signals", everything), ("no graph view", no_graph)):
                t0 = time.perf_counter()
                if kind == "nested":  # the formula's signals or all of them, and the L2, chosen per fold
                    base_cols = [j for j in cols if names[j].split("*")[0] in BASE]
                    choose = nested_choice(bank, X, Y, R, {"base": base_cols, "extended": cols})
                    results[(kind, label)] = held_out(bank, X, Y, R, cols, "listwise", choose=choose)
                else:
                    results[(kind, label)] = held_out(bank, X, Y, R, cols, kind, args.l2)
                r = results[(kind, label)]
                print(f"{kind:8s} {label:14s} held out: " + "  ".join(
                    f"{m} {intervals.stratified(r[m], bank.conv_of).mean:.4f}" for m in ("recall@10", "recall@25", "ndcg@10")) +
                    f"  ({time.perf_counter() - t0:.0f} s)", flush=True)
        print("\npaired, held out (points, 95 % stratified bootstrap):")
        for (kind, label), r in results.items():
            for m in loco.OBJECTIVE:
                for strategy in ("zero-mem", "hierarchy-only"):
                    b = np.asarray(base["strategies"][strategy]["per_question"][m])[align]
                    iv = intervals.paired(r[m], b, bank.conv_of)
                    print(f"  {kind} {label} - {strategy} (headline) {m}: {100 * iv.mean:+.1f} [{100 * iv.low:+.1f}, {100 * iv.high:+.1f}] {iv.verdict()}")
            if label == "all signals":
                r2 = results.get((kind, "no graph view"))
                for m in loco.OBJECTIVE:
                    iv = intervals.paired(r[m], r2[m], bank.conv_of)
                    print(f"  {kind} graph view's worth (all - no graph) {m}: {100 * iv.mean:+.1f} [{100 * iv.low:+.1f}, {100 * iv.high:+.1f}] {iv.verdict()}")
            for c, cname in CATEGORIES.items():
                mask = bank.category == c
                print(f"    {kind} {label} {cname}: " + " / ".join(f"{r[m][mask].mean():.3f}" for m in loco.OBJECTIVE))
    finally:
        views.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
