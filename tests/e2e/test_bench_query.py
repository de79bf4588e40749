"""`memstream bench query`: one LoCoMo conversation published through the API of a
scratch serve on the declared fast model path, then its first questions at 1 and 2 concurrent
clients. It checks the output and the command's errors, not the figures (docs/results/query.md: those come from
the full run with the real models)."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.e2e.fast_processes import BIN, env

pytestmark = pytest.mark.e2e


def _bench(tmp_path, *args):
    e = {**env(tmp_path / "unused"), "MEMSTREAM_ENCODER_MODEL": "hashing", "MEMSTREAM_NER_MODEL": "lexicon"}
    return subprocess.run([str(BIN), "bench", "query", *args], env=e, capture_output=True, text=True, timeout=900)


def test_bench_query_publishes_the_split_and_reports_each_strategy_at_each_concurrency(tmp_path, locomo):
    out = tmp_path / "query.json"
    run = _bench(tmp_path, "--locomo", str(locomo), "--conversations", "conv-26", "--questions", "12", "--strategies", "zero-mem,bm25",
                 "--concurrency", "1,2", "--projections", "inline", "--out", str(out), "--plot", str(tmp_path / "query.png"))
    assert run.returncode == 0, run.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["ingest"]["turns"] == 419 and r["ingest"]["add_to_ready_s"] >= r["ingest"]["append_s"] > 0
    assert set(r["query"]) == {"1", "2"} and r["config"]["questions"] == 12
    for level in r["query"].values():
        assert level["searches_per_s"] > 0
        for strategy in ("zero-mem", "bm25"):
            s = level[strategy]
            assert 0 < s["client_ms"]["p50"] <= s["client_ms"]["p95"] <= s["client_ms"]["p99"]
            assert 0 < s["server_ms"]["p50"] and "lexical" in s["stage_ms_p50"]
            assert 0.0 <= s["recall"]["budget_10"]["all"] <= s["recall"]["budget_25"]["all"] <= 1.0
    assert "graph_view" in r["query"]["1"]["zero-mem"]["stage_ms_p50"] and "graph_view" not in r["query"]["1"]["bm25"]["stage_ms_p50"]
    assert (tmp_path / "query.png").stat().st_size > 0 and r["command"].startswith("memstream bench query")


@pytest.mark.parametrize("args, message", [(("--strategies", "zero-mem,nope"), "unknown ['nope']"),
                                           (("--concurrency", "1,x"), "--concurrency"), (("--concurrency", "0"), "at least one client"),
                                           (("--url", "http://10.1.2.3:9", "--key", "k"), "loopback address only")])
def test_bench_query_refuses_bad_options_before_starting_anything(tmp_path, locomo, args, message):
    run = _bench(tmp_path, "--locomo", str(locomo), *args, "--out", str(tmp_path / "q.json"))
    assert run.returncode != 0 and message in run.stderr and not (tmp_path / "q.json").exists()
