"""The LOCO report's arithmetic: the stratified bootstrap and the per-question ranking
metrics, on inputs whose answers are known by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from services.eval import intervals
from services.eval.loco import rank_metrics


def test_resampling_within_conversations_keeps_each_ones_share():
    # Conversation 0 scores 0 on every question, conversation 1 scores 1: resampled within each,
    # every resample's mean is exactly 0.5. A bootstrap over all questions at once would spread.
    values, strata = np.r_[np.zeros(40), np.ones(40)], np.r_[np.zeros(40, int), np.ones(40, int)]
    iv = intervals.stratified(values, strata, resamples=2000)
    assert (iv.mean, iv.low, iv.high) == (0.5, 0.5, 0.5)
    rng = np.random.default_rng(0)
    pooled = [values[rng.integers(0, 80, 80)].mean() for _ in range(2000)]
    assert np.percentile(pooled, 97.5) - np.percentile(pooled, 2.5) > 0.1


def test_an_interval_covers_the_mean_is_reproducible_and_narrows_with_more_questions():
    rng = np.random.default_rng(1)
    small, large = rng.random(50), rng.random(2000)
    a = intervals.stratified(small, np.zeros(50, int))
    assert a.low < a.mean < a.high and a == intervals.stratified(small, np.zeros(50, int))
    b = intervals.stratified(large, np.arange(2000) % 5)
    assert (b.high - b.low) < (a.high - a.low) / 3
    assert b.low < 0.5 < b.high  # uniform(0, 1): the true mean is inside


def test_paired_differences_give_their_verdicts():
    strata = np.arange(300) % 3
    rng = np.random.default_rng(2)
    base = rng.random(300)
    same = intervals.paired(base, base, strata)
    assert (same.mean, same.low, same.high) == (0.0, 0.0, 0.0) and same.verdict() == "no measurable effect"
    assert intervals.paired(base + 0.05, base, strata).verdict() == "improvement"
    assert intervals.paired(base - 0.05, base, strata).verdict() == "worse"
    noisy = intervals.paired(base + rng.normal(0, 0.3, 300), base, strata)
    assert noisy.verdict() == "no measurable effect" and noisy.low < 0 < noisy.high


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="one length"):
        intervals.stratified([1.0, 2.0], [0])
    with pytest.raises(ValueError, match="one shape"):
        intervals.paired([1.0, 2.0], [1.0], [0, 0])
    with pytest.raises(ValueError, match="no values"):
        intervals.stratified([], [])


def test_rank_metrics_by_hand():
    ranking = [f"t{i}" for i in range(30)]
    gold = {"t1", "t12", "t99"}  # t99 is never retrieved: it still counts in recall's denominator
    m = rank_metrics(ranking, gold, n_gold=3)
    assert m["recall@10"] == pytest.approx(1 / 3) and m["recall@25"] == pytest.approx(2 / 3)
    assert m["precision@10"] == pytest.approx(1 / 10) and m["precision@25"] == pytest.approx(2 / 25)
    assert m["mrr@25"] == pytest.approx(1 / 2)
    ideal = 1 + 1 / math.log2(3) + 1 / math.log2(4)
    assert m["ndcg@10"] == pytest.approx((1 / math.log2(3)) / ideal)
    none = rank_metrics(ranking, {"t40"}, n_gold=1)
    assert all(v == 0.0 for v in none.values())
    perfect = rank_metrics(["a", "b"] + ranking, {"a", "b"}, n_gold=2)
    assert perfect["ndcg@10"] == pytest.approx(1.0) and perfect["mrr@25"] == 1.0 and perfect["recall@10"] == 1.0


def _report(values: dict[str, list[float]], keys: list[str], categories: list[int]) -> dict:
    return {"question_keys": keys, "categories": categories, "conversations": sorted({k.split("\t")[0] for k in keys}),
            "strategies": {"zero-mem": {"per_question": values}}}


def test_a_run_is_compared_with_an_earlier_report_question_by_question():
    from services.eval.loco import LocoConfig, against

    rng = np.random.default_rng(3)
    keys = [f"conv-{i % 3}\tquestion {i}" for i in range(300)]
    cats = [1 + i % 4 for i in range(300)]
    base_values = {m: rng.random(300).round(4).tolist() for m in ("recall@10", "recall@25")}
    cfg = LocoConfig(strategies=("zero-mem",), resamples=1000)
    # the earlier report lists the same questions in another order: they are paired by key, not position
    perm = rng.permutation(300)
    base = _report({m: [v[p] for p in perm] for m, v in base_values.items()}, [keys[p] for p in perm], [cats[p] for p in perm])
    same = against(_report(base_values, keys, cats), base, cfg)["zero-mem"]
    assert same["recall@10"]["all"] == {"mean": 0.0, "ci95": [0.0, 0.0], "verdict": "no measurable effect"}
    better = against(_report({m: [min(1.0, x + 0.1) for x in v] for m, v in base_values.items()}, keys, cats), base, cfg)["zero-mem"]
    assert better["recall@25"]["all"]["verdict"] == "improvement" and set(better["recall@25"]) >= {"all", "multi-hop"}
    with pytest.raises(ValueError, match="same questions"):
        against(_report(base_values, [k + "?" for k in keys], cats), base, cfg)
    with pytest.raises(ValueError, match="re-run"):
        against(_report(base_values, keys, cats), {"strategies": {}}, cfg)


def test_the_search_takes_a_move_only_when_it_gains_more_than_min_gain():
    from services.eval.loco import Search, grid_middle

    start = grid_middle(("rho",))  # rho at the paper's 0.6
    scores = {0.5: 0.499, 0.6: 0.500, 0.7: 0.502, 0.8: 0.510}

    class Bank:  # the descent reads the objective only: here a known function of rho
        def objective(self, cfg, mode, idx):
            return scores[cfg.rho]

    def tuned(min_gain):
        search = Search(passes=2, only=("rho",), min_gain=min_gain)
        return search.tune(Bank(), "zero-mem", np.arange(3), start, lambda m: None)

    assert tuned(0.0) == (start.with_(rho=0.8), 0.510)  # every gain taken: 0.7, then 0.8
    assert tuned(0.005) == (start.with_(rho=0.8), 0.510)  # 0.7 (+0.002) passed over, 0.8 (+0.010) taken
    assert tuned(0.02) == (start, 0.500)  # nothing clears the bar: the start stays
