"""`memstream eval locomo --loco` on two dev conversations, the declared fast model path
and two tunable constants: every fold tuned on the other conversation and scored on its own, the
report's intervals and paired differences in their documented shape, zero LLM tokens. It checks
the procedure and the output, not the figures (docs/results/retrieval.md: those come from the real models)."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.e2e.fast_processes import BIN, env

pytestmark = pytest.mark.e2e

CATEGORIES = {"all", "multi-hop", "temporal", "open-domain", "single-hop"}
METRICS = {"recall@10", "recall@25", "precision@10", "precision@25", "ndcg@10", "mrr@25"}


def _eval(tmp_path, *args):
    return subprocess.run([str(BIN), "eval", "locomo", *args], env={**env(tmp_path / "unused"), "TMPDIR": str(tmp_path)},
                          capture_output=True, text=True, timeout=900)


def test_loco_tunes_each_fold_on_the_other_conversations_and_reports_intervals(tmp_path, locomo):
    out = tmp_path / "loco.json"
    run = _eval(tmp_path, str(locomo), "--loco", "--conversations", "conv-26,conv-30", "--strategies", "zero-mem,hierarchy-only,bm25",
                "--constants", "rho,a_lex", "--resamples", "300", "--out", str(out), "--markdown", str(tmp_path / "loco.md"))
    assert run.returncode == 0, run.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["conversations"] == ["conv-26", "conv-30"] and r["llm_tokens"] == 0 and r["refused_connections"] == 0
    assert r["procedure"]["constants"] == ["a_lex", "rho"] and r["procedure"]["bootstrap"]["resamples"] == 300
    for name, tuned in (("zero-mem", True), ("hierarchy-only", True), ("bm25", False)):
        s = r["strategies"][name]
        assert s["tuned"] is tuned and [f["held_out"] for f in s["folds"]] == ["conv-26", "conv-30"]
        assert set(s["loco"]) == METRICS
        for row in s["loco"].values():
            assert set(row) == CATEGORIES
            for cell in row.values():
                low, high = cell["ci95"]
                assert 0.0 <= low <= cell["mean"] <= high <= 1.0
        # the headline is the held-out questions put together: the question-weighted mean of the folds
        n = [f["questions"] for f in s["folds"]]
        folds = sum(f["test"]["recall@10"] * k for f, k in zip(s["folds"], n)) / sum(n)
        assert s["loco"]["recall@10"]["all"]["mean"] == pytest.approx(folds, abs=1e-3)
    assert set(r["ablations"]) == {"hierarchy-only"} and set(r["baselines"]) == {"bm25"}
    graph = r["ablations"]["hierarchy-only"]["recall@25"]["all"]
    assert graph["verdict"] in {"improvement", "worse", "no measurable effect"} and graph["ci95"][0] <= graph["mean"] <= graph["ci95"][1]
    assert set(r["selected"]["changes"]) <= {"rho", "a_lex"} and r["variants_tried"] > 3
    assert r["procedure"]["start"] == "grid-middle" and r["procedure"]["fold_passes"] == 2
    assert "leave-one-conversation-out" in run.stdout and "zero-mem minus hierarchy-only" in run.stdout
    md = (tmp_path / "loco.md").read_text()
    held = r["strategies"]["zero-mem"]["loco"]["recall@25"]["all"]
    assert f"| `zero-mem` | {held['mean']:.3f} [{held['ci95'][0]:.3f}, {held['ci95'][1]:.3f}]" in md
    assert md.count("| `hierarchy-only` |") == 5  # recall@10, recall@25, ranking quality, paired difference, per fold

    # another setting judged against this run, question by question: here the same one, so no effect
    again = _eval(tmp_path, str(locomo), "--loco", "--conversations", "conv-26,conv-30", "--strategies", "zero-mem,bm25",
                  "--constants", "rho,a_lex", "--resamples", "300", "--against", str(out), "--out", str(tmp_path / "again.json"))
    assert again.returncode == 0, again.stderr[-3000:]
    against = json.loads((tmp_path / "again.json").read_text())["against"]["strategies"]
    assert set(against) == {"zero-mem", "bm25"}
    assert against["bm25"]["recall@10"]["all"] == {"mean": 0.0, "ci95": [0.0, 0.0], "verdict": "no measurable effect"}
    assert f"zero-mem minus {out}: recall@10 +0.0000" in again.stdout or f"zero-mem minus {out}: recall@10 -0.0000" in again.stdout


@pytest.mark.parametrize("args, message", [(("--conversations", "conv-26"), "at least two conversations"),
                                           (("--constants", "rho,nope"), "unknown ['nope']"),
                                           (("--budgets", "5,10"), "budgets 10 and 25"),
                                           (("--min-gain", "-1"), "--min-gain: recall points")])
def test_loco_refuses_what_it_cannot_do_with_a_clear_error(tmp_path, locomo, args, message):
    run = _eval(tmp_path, str(locomo), "--loco", "--strategies", "zero-mem", *args)
    assert run.returncode != 0 and message in run.stderr and "Traceback" not in run.stderr


def test_against_a_report_of_other_questions_fails_before_the_run(tmp_path, locomo):
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"question_keys": ["conv-26\tWhat is this?"], "strategies": {}}))
    for path, message in ((other, "not on the same questions"), (tmp_path / "missing.json", "No such file")):
        run = _eval(tmp_path, str(locomo), "--loco", "--strategies", "zero-mem", "--against", str(path))
        assert run.returncode != 0 and message in run.stderr and "Traceback" not in run.stderr
        assert "ingested" not in run.stderr  # refused before the split was ingested
