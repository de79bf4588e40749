"""Leave-one-conversation-out evaluation: `memstream eval locomo PATH --loco`.

For each conversation of the split (a fold), every Zero-Mem variant — the full method and each
ablation, each with its own objective — has its constants chosen by coordinate descent over a
small grid per constant (GRID; services/query/config.py holds the shipped values) on the *other*
conversations, and is scored on the held-out one. The descent starts from the middle of each
constant's candidates (grid_middle), not from the shipped values: those were selected on every
conversation, so a search started there knows the held-out one (measured: it made the graph view
look like +1.5 points over hierarchy-only held out, against +0.0 from the neutral start). Those
held-out scores, put together, are the headline: no question is scored by constants chosen on it. The baselines have no constants; their
figures are the same in and out of sample. The configuration the same search selects on all the
conversations is reported too: it is what config.py should ship.

Metrics per question: evidence recall at each budget (the share of gold turns among the first B
distinct turns), evidence precision at each budget (the share of those B turns that are gold), nDCG@10
(binary gains) and MRR of the first gold turn within the largest budget (0 when none is in it).
Every mean comes with a 95 % stratified-bootstrap interval (intervals.py), and every ablation's
difference to the full method with a paired interval and its verdict.

The per-question signals that do not depend on the constants are computed once (each question's
QueryContext is kept across configurations), so one configuration over the 760 dev questions
costs well under a second of scoring.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import Callable, Sequence

import numpy as np

from schemas.query import SearchRequest
from services.eval import intervals
from services.eval.locomo import Question, request
from services.eval.metrics import CATEGORIES, budget_turns, parse_ref
from services.query.candidates import candidate_corpus
from services.query.config import DEFAULT, ZeroMemConfig
from services.query.context import QueryContext
from services.query.zeromem import MODES, ZeroMem

BUDGETS = (10, 25)
NDCG_AT = 10
OBJECTIVE = ("recall@10", "recall@25")  # what the search maximises: the mean of these two

# The values coordinate descent may try per constant (the shipped value is always a candidate).
GRID: dict[str, list] = {
    "a_lex": [0.3, 0.4, 0.5, 0.6, 0.7],
    "w_turn": [0.4, 0.7, 1.0],
    "w_windows": [(0.5, 0.5), (1.0, 1.0), (1.5, 1.0), (1.0, 1.5), (0.5, 1.0), (1.0, 0.5)],
    "w_episode": [0.0, 0.25, 0.5, 0.75],
    "w_neighbour": [0.0, 0.1, 0.2],
    "h_lexical": [0.0, 0.2, 0.4, 0.6],
    "h_info": [0.0, 0.2, 0.35, 0.5, 0.7],
    "prf_weight": [0.0, 0.25],
    "beta_entities": [0.5, 0.65, 0.8, 0.9],
    "gamma": [0.6, 0.7, 0.8],
    "adjacency_weight": [0.5, 1.0, 2.0],
    "hub_share": [1.0, 0.3, 0.1],
    "g_lexical": [0.0, 0.2, 0.4],
    "rho": [0.5, 0.6, 0.7, 0.8],
    "route": ["local", "rules"],
    "closure_graph": [0, 3, 5],
    "closure_bonus": [0.02, 0.05, 0.1],
    "c_subject": [0.1, 0.2, 0.3],
    "c_type": [0.1, 0.2, 0.3, 0.4],
    "c_subject_relational": [0.1, 0.2, 0.3],
    "c_type_relational": [0.1, 0.2, 0.3],
    "c_time": [0.2, 0.4, 0.6, 0.8],
    "c_label": [0.0, 0.1, 0.2, 0.3],
    "label_min": [0.3, 0.4, 0.5],
    "lexical_prf_weight": [0.0, 0.2, 0.4],
    "lexical_prf_types": [("list",), ("list", "description")],
}


PAPER = {"rho": 0.6, "gamma": 0.6}  # the constants the Zero-Mem paper gives


def grid_middle(only: Sequence[str] | None = None) -> ZeroMemConfig:
    """A start for the search that owes nothing to the dev split's scores: each tuned constant (all of
    GRID, or `only`) at the middle of its candidates (the lower middle for an even count), the
    paper's value where it gives one. The shipped constants were themselves selected on every
    conversation, so a search started from them already knows the held-out fold a little."""
    names = [n for n in GRID if only is None or n in only]
    return DEFAULT.with_(**{n: PAPER.get(n, GRID[n][(len(GRID[n]) - 1) // 2]) for n in names})


STARTS: dict[str, Callable[[Sequence[str] | None], ZeroMemConfig]] = {"shipped": lambda only: DEFAULT, "grid-middle": grid_middle}


def metric_names(budgets: Sequence[int] = BUDGETS) -> list[str]:
    return [*(f"recall@{b}" for b in budgets), *(f"precision@{b}" for b in budgets), f"ndcg@{NDCG_AT}", f"mrr@{max(budgets)}"]


def rank_metrics(ranking: Sequence[str], gold: set[str], n_gold: int, budgets: Sequence[int] = BUDGETS) -> dict[str, float]:
    """The per-question metrics of a ranking of distinct turn refs. `n_gold` counts every gold turn
    of the question, also one the store does not hold (it can never be found: recall's denominator)."""
    depth = max(max(budgets), NDCG_AT)
    hits = [r in gold for r in ranking[:depth]]
    out = {}
    for b in budgets:
        found = sum(hits[:b])
        out[f"recall@{b}"] = found / n_gold if n_gold else 0.0
        out[f"precision@{b}"] = found / b
    dcg = sum(1.0 / math.log2(rank + 2) for rank, hit in enumerate(hits[:NDCG_AT]) if hit)
    ideal = sum(1.0 / math.log2(rank + 2) for rank in range(min(n_gold, NDCG_AT)))
    out[f"ndcg@{NDCG_AT}"] = dcg / ideal if ideal else 0.0
    first = next((rank for rank, hit in enumerate(hits[:max(budgets)]) if hit), None)
    out[f"mrr@{max(budgets)}"] = 0.0 if first is None else 1.0 / (first + 1)
    return out


class QuestionBank:
    """The questions with their query contexts kept alive (their caches hold the signals), the
    gold turn refs, and each question's conversation and category as arrays for slicing."""

    def __init__(self, service, views, qs: list[Question], tenant: str, k: int = 5, budgets: Sequence[int] = BUDGETS):
        self.service, self.views, self.qs, self.tenant, self.k, self.budgets = service, views, qs, tenant, k, tuple(budgets)
        self.conversations = sorted({q.conversation for q in qs})
        self.conv_of = np.array([self.conversations.index(q.conversation) for q in qs])
        self.category = np.array([q.category for q in qs])
        self.gold = [{f"D{s}:{t}" for s, t in q.gold} for q in qs]
        self._ctx: list[QueryContext | None] = [None] * len(qs)
        self._refs: list[list[str] | None] = [None] * len(qs)

    def _context(self, i: int) -> tuple[QueryContext, list[str]]:
        if self._ctx[i] is None:
            q = self.qs[i]
            req = SearchRequest(question=q.question, tenant_id=self.tenant, conversation_id=q.conversation, max_turns=max(self.budgets), k=self.k)
            boundary = self.service.boundary(req)
            ctx = self._ctx[i] = QueryContext(req, boundary, None, self.views, self.service.encoder, self.service.extractor)
            if self.service.bounds is not None:  # the service's own path: the question's candidates
                ctx.bounds = self.service.bounds
                ctx.corpus = candidate_corpus(ctx, self.service.bounds)
            else:
                ctx.corpus = self.service.corpora.get(self.views.store("hierarchy"), boundary)
            corpus = ctx.corpus
            refs = []
            for t in corpus.turns:
                ref = parse_ref((t.provenance.source_refs or (None,))[0])
                refs.append(f"D{ref[0]}:{ref[1]}" if ref else f"?{t.unit_id}")
            self._refs[i] = refs
        return self._ctx[i], self._refs[i]

    def zero_mem(self, cfg: ZeroMemConfig, mode: str, idx: np.ndarray) -> dict[str, np.ndarray]:
        """Per-question metrics of a Zero-Mem mode with the constants `cfg`, on the questions `idx`."""
        names = metric_names(self.budgets)
        out = {m: np.zeros(len(idx)) for m in names}
        depth = max(max(self.budgets), NDCG_AT)
        for j, i in enumerate(idx):
            ctx, refs = self._context(int(i))
            order = ZeroMem(ctx, cfg).order(mode)[:depth]
            for m, v in rank_metrics([refs[p] for p in order.tolist()], self.gold[i], len(self.qs[i].gold), self.budgets).items():
                out[m][j] = v
        return out

    def strategy(self, name: str) -> dict[str, np.ndarray]:
        """Per-question metrics of a strategy as the service answers it (the baselines)."""
        names = metric_names(self.budgets)
        out = {m: np.zeros(len(self.qs)) for m in names}
        depth = max(max(self.budgets), NDCG_AT)
        for i, q in enumerate(self.qs):
            resp = self.service.search(request(q, name, self.tenant, depth, self.k))
            units = [[f"D{r[0]}:{r[1]}" for r in (parse_ref(t.source_ref) for t in e.turns) if r] for e in resp.evidence]
            for m, v in rank_metrics(budget_turns(units, depth), self.gold[i], len(q.gold), self.budgets).items():
                out[m][i] = v
        return out

    def objective(self, cfg: ZeroMemConfig, mode: str, idx: np.ndarray) -> float:
        r = self.zero_mem(cfg, mode, idx)
        return float(np.mean([r[m].mean() for m in OBJECTIVE]))


@dataclass
class Search:
    """Coordinate descent over GRID (or the constants named in `only`)."""

    passes: int = 2
    only: tuple[str, ...] | None = None
    # A move is taken only when it raises the training objective by more than this (a share, 0.0025 =
    # a quarter point). The idea: ~600 training questions make gains of a few questions noise that a
    # descent should not fit. Measured at a quarter point it did not pay (docs/results/retrieval.md: no
    # measurable effect on Zero-Mem, three ablations worse), so the default takes every gain.
    min_gain: float = 0.0
    tried: int = 0  # configurations scored, over every call

    def grid(self) -> dict[str, list]:
        return {k: v for k, v in GRID.items() if self.only is None or k in self.only}

    def tune(self, bank: QuestionBank, mode: str, idx: np.ndarray, start: ZeroMemConfig, log: Callable[[str], None]) -> tuple[ZeroMemConfig, float]:
        best, best_score = start, bank.objective(start, mode, idx)
        self.tried += 1
        for p in range(self.passes):
            improved = False
            for name, values in self.grid().items():
                for v in values:
                    if getattr(best, name) == v:
                        continue
                    cand = best.with_(**{name: v})
                    score = bank.objective(cand, mode, idx)
                    self.tried += 1
                    if score > best_score + self.min_gain + 1e-6:
                        best, best_score, improved = cand, score, True
                        log(f"   {mode} pass {p} {name}={v} -> {score:.4f}")
            if not improved:
                break
        return best, best_score


def _changes(cfg: ZeroMemConfig, start: ZeroMemConfig) -> dict:
    return {k: v for k, v in asdict(cfg).items() if k != "extra" and v != getattr(start, k)}


@dataclass
class LocoConfig:
    strategies: tuple[str, ...]
    fold_passes: int = 2
    global_passes: int = 2
    only: tuple[str, ...] | None = None
    resamples: int = intervals.RESAMPLES
    seed: int = intervals.SEED
    start_name: str = "grid-middle"  # a key of STARTS: where every fold's search (and the final selection) begins
    min_gain: float = 0.0  # Search.min_gain

    @property
    def start(self) -> ZeroMemConfig:
        return STARTS[self.start_name](self.only)


def _summary(values: dict[str, np.ndarray], bank: QuestionBank, cfg: LocoConfig) -> dict:
    """{metric: {category: {mean, ci95}}}, "all" first, categories by name."""
    out = {}
    for m, v in values.items():
        row = {"all": intervals.stratified(v, bank.conv_of, resamples=cfg.resamples, seed=cfg.seed).as_dict()}
        for c, name in CATEGORIES.items():
            mask = bank.category == c
            if mask.any():
                row[name] = intervals.stratified(v[mask], bank.conv_of[mask], resamples=cfg.resamples, seed=cfg.seed).as_dict()
        out[m] = row
    return out


def question_keys(qs: Sequence[Question]) -> list[str]:
    """What pairs a question across two reports (`against`): its conversation and its text."""
    return [f"{q.conversation}\t{q.question}" for q in qs]


def check_pairable(base: dict, keys: Sequence[str]) -> None:
    """ValueError unless the earlier report holds per-question values for exactly these questions."""
    base_keys = base.get("question_keys")
    if base_keys is None:
        raise ValueError("the earlier report has no per-question values (written before they were kept); re-run it")
    if len(set(base_keys)) != len(base_keys) or set(base_keys) != set(keys):
        raise ValueError("the two reports are not on the same questions")


def against(report: dict, base: dict, cfg: LocoConfig) -> dict:
    """This run minus an earlier report on the same questions, per strategy both hold: paired held-out
    differences with intervals and verdicts. How a setting (a cheaper model, a gate) is judged
    against the default: each run tunes its own constants per fold, the questions pair them."""
    keys = report["question_keys"]
    check_pairable(base, keys)
    where = {k: i for i, k in enumerate(base["question_keys"])}
    order = np.array([where[k] for k in keys])
    strata = np.array([report["conversations"].index(k.split("\t", 1)[0]) for k in keys])
    cats = np.array(report["categories"])
    out = {}
    for name, s in report["strategies"].items():
        b = (base["strategies"].get(name) or {}).get("per_question")
        if not b:
            continue
        row = {}
        for m in OBJECTIVE:
            a_m, b_m = np.asarray(s["per_question"][m]), np.asarray(b[m])[order]
            cells = {}
            for label, mask in [("all", np.ones(len(keys), dtype=bool)), *((n, cats == c) for c, n in CATEGORIES.items())]:
                if mask.any():
                    iv = intervals.paired(a_m[mask], b_m[mask], strata[mask], resamples=cfg.resamples, seed=cfg.seed)
                    cells[label] = {**iv.as_dict(), "verdict": iv.verdict()}
            row[m] = cells
        out[name] = row
    return out


def _paired(a: dict[str, np.ndarray], b: dict[str, np.ndarray], bank: QuestionBank, cfg: LocoConfig) -> dict:
    out = {}
    for m in a:
        row = {}
        for label, mask in [("all", np.ones(len(bank.qs), dtype=bool)), *((name, bank.category == c) for c, name in CATEGORIES.items())]:
            if mask.any():
                iv = intervals.paired(a[m][mask], b[m][mask], bank.conv_of[mask], resamples=cfg.resamples, seed=cfg.seed)
                row[label] = {**iv.as_dict(), "verdict": iv.verdict()}
        out[m] = row
    return out


def evaluate(bank: QuestionBank, cfg: LocoConfig, progress: Callable[[str], None] = print) -> dict:
    """The LOCO report: per strategy, held-out metrics with intervals and the per-fold figures;
    per ablation, its paired difference to the full method; the globally selected constants."""
    t0 = time.perf_counter()
    search = Search(passes=cfg.fold_passes, only=cfg.only, min_gain=cfg.min_gain)
    everything = np.arange(len(bank.qs))
    held_out: dict[str, dict[str, np.ndarray]] = {}
    report: dict = {"strategies": {}, "conversations": bank.conversations, "questions": len(bank.qs),
                    "question_keys": question_keys(bank.qs)}
    for name in cfg.strategies:
        if name in MODES:
            values = {m: np.zeros(len(bank.qs)) for m in metric_names(bank.budgets)}
            folds = []
            for c, conv in enumerate(bank.conversations):
                train, test = np.where(bank.conv_of != c)[0], np.where(bank.conv_of == c)[0]
                tuned, score = search.tune(bank, name, train, cfg.start, progress)
                r = bank.zero_mem(tuned, name, test)
                for m in values:
                    values[m][test] = r[m]
                folds.append({"held_out": conv, "questions": len(test), "train_objective": round(score, 4),
                              "test": {m: round(float(r[m].mean()), 4) for m in OBJECTIVE}, "changes": _changes(tuned, cfg.start)})
                progress(f"{name}: fold {conv} train {score:.4f} held-out " +
                         " ".join(f"{m} {r[m].mean():.4f}" for m in OBJECTIVE) + f" ({time.perf_counter() - t0:.0f} s)")
            entry = {"tuned": True, "folds": folds}
        else:
            values = bank.strategy(name)
            entry = {"tuned": False, "folds": [{"held_out": conv, "questions": int((bank.conv_of == c).sum()),
                                                 "test": {m: round(float(values[m][bank.conv_of == c].mean()), 4) for m in OBJECTIVE}}
                                                for c, conv in enumerate(bank.conversations)]}
            progress(f"{name}: " + " ".join(f"{m} {values[m].mean():.4f}" for m in OBJECTIVE) + " (no constants: in = out of sample)")
        held_out[name] = values
        report["strategies"][name] = {**entry, "loco": _summary(values, bank, cfg),
                                      "per_question": {m: np.round(values[m], 4).tolist() for m in OBJECTIVE}}
    if "zero-mem" in held_out:
        # zero-mem minus each other strategy on the same questions: for an ablation, what the part it
        # removes adds; for a baseline, the method's margin over it
        report["ablations"] = {name: _paired(held_out["zero-mem"], held_out[name], bank, cfg)
                               for name in cfg.strategies if name != "zero-mem" and name in MODES}
        report["baselines"] = {name: _paired(held_out["zero-mem"], held_out[name], bank, cfg)
                               for name in cfg.strategies if name not in MODES}
        global_search = Search(passes=cfg.global_passes, only=cfg.only, min_gain=cfg.min_gain)
        selected, score = global_search.tune(bank, "zero-mem", everything, cfg.start, progress)
        search.tried += global_search.tried
        in_sample = bank.zero_mem(selected, "zero-mem", everything)
        report["selected"] = {"objective": round(score, 4), "changes": _changes(selected, DEFAULT),  # what config.py would change
                              "config": {k: v for k, v in asdict(selected).items() if k != "extra"},
                              "in_sample": {m: round(float(v.mean()), 4) for m, v in in_sample.items()}}
    report["categories"] = bank.category.tolist()
    report["variants_tried"] = search.tried
    report["procedure"] = {"start": cfg.start_name, "fold_passes": cfg.fold_passes, "global_passes": cfg.global_passes,
                           "min_gain": cfg.min_gain,
                           "constants": list(search.grid()), "objective": f"mean of {' and '.join(OBJECTIVE)}",
                           "bootstrap": {"resamples": cfg.resamples, "seed": cfg.seed, "level": intervals.LEVEL,
                                         "strata": "conversation (questions resampled within their conversation)"}}
    report["seconds"] = round(time.perf_counter() - t0, 1)
    return report


def table(report: dict, metrics: Sequence[str] = ("recall@10", "recall@25")) -> str:
    """The headline: each strategy's held-out mean [95 % interval] per category."""
    cats = ["all", *CATEGORIES.values()]
    lines = []
    for m in metrics:
        lines.append(f"{m} (leave-one-conversation-out, 95 % stratified-bootstrap intervals)")
        lines.append(f"{'strategy':<15}" + "".join(f"{c:>22}" for c in cats))
        for name, s in report["strategies"].items():
            row = s["loco"][m]
            lines.append(f"{name:<15}" + "".join(
                f"{row[c]['mean']:>8.3f} [{row[c]['ci95'][0]:.3f},{row[c]['ci95'][1]:.3f}]" if c in row else f"{'-':>22}" for c in cats))
        lines.append("")
    for name, diff in {**(report.get("ablations") or {}), **(report.get("baselines") or {})}.items():
        cells = ", ".join(f"{m} {diff[m]['all']['mean']:+.4f} [{diff[m]['all']['ci95'][0]:+.4f}, {diff[m]['all']['ci95'][1]:+.4f}] "
                          f"{diff[m]['all']['verdict']}" for m in metrics)
        lines.append(f"zero-mem minus {name}: {cells}")
    return "\n".join(lines)


def markdown(report: dict) -> str:
    """Markdown tables of a LOCO report (docs/results/eval-loco.md): held-out recall per category with intervals, the other
    metrics, the paired differences, and the per-fold figures."""
    cats = ["all", *CATEGORIES.values()]
    ci = lambda d: f"{d['mean']:.3f} [{d['ci95'][0]:.3f}, {d['ci95'][1]:.3f}]"  # noqa: E731
    diff = lambda d: f"{d['mean'] * 100:+.1f} [{d['ci95'][0] * 100:+.1f}, {d['ci95'][1] * 100:+.1f}]"  # noqa: E731
    out = []
    for m in ("recall@10", "recall@25"):
        out += [f"**{m}**, held out (mean [95 % interval]):", "",
                "| strategy | " + " | ".join(cats) + " |", "|---" * (len(cats) + 1) + "|"]
        for name, s in report["strategies"].items():
            row = s["loco"][m]
            out.append(f"| `{name}` | " + " | ".join(ci(row[c]) if c in row else "–" for c in cats) + " |")
        out.append("")
    others = [m for m in next(iter(report["strategies"].values()))["loco"] if not m.startswith("recall@")]
    out += ["Ranking quality beside recall (all questions, held out):", "",
            "| strategy | " + " | ".join(others) + " |", "|---" * (len(others) + 1) + "|"]
    for name, s in report["strategies"].items():
        out.append(f"| `{name}` | " + " | ".join(ci(s["loco"][m]["all"]) for m in others) + " |")
    out.append("")
    pairs = {**(report.get("ablations") or {}), **(report.get("baselines") or {})}
    if pairs:
        out += ["`zero-mem` minus each strategy, paired on the same questions, points [95 % interval]:", "",
                "| minus | recall@10 | verdict | recall@25 | verdict | multi-hop @10 / @25 | open-domain @10 / @25 |", "|---" * 7 + "|"]
        for name, d in pairs.items():
            out.append(f"| `{name}` | {diff(d['recall@10']['all'])} | {d['recall@10']['all']['verdict']} | {diff(d['recall@25']['all'])} | "
                       f"{d['recall@25']['all']['verdict']} | {diff(d['recall@10']['multi-hop'])} / {diff(d['recall@25']['multi-hop'])} | "
                       f"{diff(d['recall@10']['open-domain'])} / {diff(d['recall@25']['open-domain'])} |")
        out.append("")
    tuned = {n: s for n, s in report["strategies"].items() if s.get("tuned")}
    if tuned:
        convs = report["conversations"]
        out += ["Per fold (held-out conversation: recall@10 / recall@25):", "",
                "| strategy | " + " | ".join(convs) + " |", "|---" * (len(convs) + 1) + "|"]
        for name, s in tuned.items():
            out.append(f"| `{name}` | " + " | ".join(f"{f['test']['recall@10']:.3f} / {f['test']['recall@25']:.3f}" for f in s["folds"]) + " |")
        out.append("")
    return "\n".join(out)
