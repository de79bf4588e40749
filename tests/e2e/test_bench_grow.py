"""`memstream bench grow`, the CI point: conv-26 grown to 2,000 turns among filler sessions, ten
agent-loop rounds against a serve, twenty haystack questions and a tenant of four conversations,
on the declared fast model path. It checks the output's shape and invariants, never its timings
(those come from the full run with the real models)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.e2e.fast_processes import BIN

pytestmark = pytest.mark.e2e

STRATEGIES = {"zero-mem", "zero-mem-whole", "bm25", "dense"}


def _grow(tmp_path, locomo, *args, extra_env=None):
    e = {k: v for k, v in os.environ.items() if not k.startswith("MEMSTREAM_")}
    e.update(MEMSTREAM_ENCODER_MODEL="hashing", MEMSTREAM_NER_MODEL="lexicon", **(extra_env or {}))
    return subprocess.run([str(BIN), "bench", "grow", "--locomo", str(locomo), "--root", str(tmp_path / "root"),
                           "--out", str(tmp_path / "grow.json"), *args], env=e, capture_output=True, text=True, timeout=600)


def _in_unit(x: dict) -> bool:
    return 0.0 <= x["ci95"][0] <= x["mean"] <= x["ci95"][1] <= 1.0


def test_bench_grow_small_point_finds_every_written_turn_and_reports_recall(tmp_path, locomo):
    run = _grow(tmp_path, locomo, "--sizes", "2000", "--rounds", "10", "--questions", "20", "--tenant",
                "--tenant-conversations", "4", "--tenant-turns", "1500", "--tenant-searches", "10", "--write-rate", "20")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "filler" in run.stderr and "turns/s" in run.stderr
    r = json.loads((tmp_path / "grow.json").read_text())
    assert r["command"].startswith("memstream bench grow") and r["machine"]["cores"] >= 1
    assert len(r["machine"]["load_average_before"]) == len(r["machine"]["load_average_after"]) == 3
    assert r["config"]["encoder"].startswith("hashing") and r["failures"] == {"written_turn_misses": 0, "errors": 0}
    (point,) = r["sizes"]
    assert point["size"] == point["stored_turns"] == 2000 and point["filler_turns"] == 2000 - 419

    loop = point["loop"]
    assert loop["rounds"] == 10 and loop["written_turn_misses"] == 0 and loop["errors"] == 0
    for condition in ("after_write", "idle"):
        c = loop[condition]
        assert c["client_ms"]["n"] == c["server_total_ms"]["n"] == 10
        assert c["written"]["client_ms"]["n"] == c["dev"]["client_ms"]["n"] == 5
        assert c["client_ms"]["p50_ci95"][0] <= c["client_ms"]["p50"] <= c["client_ms"]["p50_ci95"][1]
    assert loop["add_to_searchable_ms"]["n"] == 10

    hay = point["haystack"]
    assert hay["questions"] == 20 and set(hay["strategies"]) == STRATEGIES
    assert hay["strategies"]["zero-mem"]["path"] == "bounded" and hay["strategies"]["zero-mem-whole"]["path"] == "whole boundary"
    for s in hay["strategies"].values():
        b10, b25 = s["recall"]["budget_10"], s["recall"]["budget_25"]
        assert _in_unit(b10["all"]) and _in_unit(b25["all"]) and b10["all"]["mean"] <= b25["all"]["mean"]
        assert b10["all"]["n"] == 20 and sum(v["n"] for k, v in b10.items() if k != "all") == 20
        assert s["latency_ms"]["n"] == 20
    assert set(hay["zero_mem_minus"]) == {"zero-mem-whole", "bm25", "dense"}
    assert all(-1.0 <= v["mean"] <= 1.0 for d in hay["zero_mem_minus"].values() for v in d["budget_10"].values())
    assert _in_unit(hay["gold_in_bounded_candidates"]["all"])

    t = r["tenant"]
    assert t["stored_turns_before"] == 1500 and t["conversations"] == 4 and t["errors"] == 0
    assert t["tenant_wide"]["client_ms"]["n"] == t["agent_scoped"]["client_ms"]["n"] == 10
    assert t["writer"]["turns_acknowledged"] == t["writer"]["turns_sent"] > 0 and t["writer"]["errors"] == 0
    assert t["writer"]["views_caught_up_s_after_writer_stopped"] is not None
    assert (tmp_path / "grow.png").stat().st_size > 10_000

    # A second run resumes the store: nothing appended again, the loop's turns kept.
    state = json.loads((tmp_path / "root" / "conversation" / "grow.json").read_text())
    assert state["filler_turns"] == 2000 - 419 and state["loop_turns"] == 10
    again = _grow(tmp_path, locomo, "--sizes", "2000", "--parts", "haystack", "--questions", "2")
    assert again.returncode == 0, again.stderr[-3000:]
    (point,) = json.loads((tmp_path / "grow.json").read_text())["sizes"]
    assert point["ingest"]["turns"] == 0 and point["stored_turns"] == 2010 and "loop" not in point


@pytest.mark.parametrize("args, env, message", [(("--parts", "loop,nope"), {}, "--parts"),
                                                (("--sizes", "1k"), {}, "--sizes"),
                                                ((), {"MEMSTREAM_LOG_URL": "kafka://127.0.0.1:9"}, "MEMSTREAM_LOG_URL")])
def test_bench_grow_refuses_bad_options_before_growing_anything(tmp_path, locomo, args, env, message):
    run = _grow(tmp_path, locomo, *args, extra_env=env)
    assert run.returncode != 0 and message in run.stderr and not (tmp_path / "root").exists()
