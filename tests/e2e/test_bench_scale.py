"""`memstream bench scale`, the CI smoke point: a store grown to 10k turns around one
measured LoCoMo conversation against a 1k one, on the declared fast model path. It checks the
output and the resume, not the figures (docs/results/scale.md: those come from the full run)."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.e2e.fast_processes import BIN, env

pytestmark = pytest.mark.e2e


def _run(tmp_path, root, out, locomo):
    e = {**env(tmp_path / "unused"), "MEMSTREAM_ENCODER_MODEL": "hashing-384", "MEMSTREAM_NER_MODEL": "lexicon"}
    return subprocess.run([str(BIN), "bench", "scale", "--locomo", str(locomo), "--root", str(root), "--points", "1000,10000",
                           "--conversations", "conv-26", "--questions", "20", "--tenants", "7", "--out", str(out),
                           "--plot", str(out.with_suffix(".png"))], env=e, capture_output=True, text=True, timeout=900)


def test_bench_scale_smoke_point_and_resume(tmp_path, locomo):
    root, out = tmp_path / "stores", tmp_path / "scale.json"
    run = _run(tmp_path, root, out, locomo)
    assert run.returncode == 0, run.stderr[-3000:]
    r = json.loads(out.read_text())
    (p,) = r["points"]
    assert p["small"]["stored_turns"] == 1000 and p["large"]["stored_turns"] == 10000
    assert p["small"]["questions"] == p["large"]["questions"] == 20
    assert r["config"]["measured_encoder"] == "hashing-384" and "fast path" in r["config"]["bulk_models"]
    for side in ("small", "large"):
        assert 0 < p[side]["zero_mem_ms"]["p50"] <= p[side]["zero_mem_ms"]["p95"]
        assert {"dense", "graph", "hierarchy", "lexical", "log"} <= set(p[side]["disk_bytes"])
        assert p[side]["query_process"]["rss_mb"] > 0
        assert 0.0 <= p[side]["recall"]["budget_10"]["all"] <= p[side]["recall"]["budget_25"]["all"] <= 1.0
    assert p["p95_ratio"] > 0 and isinstance(p["recall_equal"], bool)
    assert set(r["bytes_per_turn"]) == {"1000", "10000"}
    assert sum(c["turns"] for c in p["large_ingest"]) == 10000 - 419  # conv-26's 419 turns are measured
    assert r["measured_ingest"]["large"]["cpu_ms_per_turn"]["benchmark process"] > 0
    cpu = p["large_ingest_cpu_ms_per_turn"]  # embedded: every projection runs in the benchmark's process
    assert set(cpu) == {"benchmark process", "all processes", "wall"} and 0 < cpu["benchmark process"] == cpu["all processes"]
    assert (out.with_suffix(".png")).stat().st_size > 10_000
    state = json.loads((root / "large" / "fleet.json").read_text())
    assert state["measured_turns"] + state["fleet_turns"] == 10000

    # A second run resumes: nothing is appended again, the same stores are compared.
    log_size = (root / "large" / "log.sqlite").stat().st_size
    again = _run(tmp_path, root, out, locomo)
    assert again.returncode == 0, again.stderr[-3000:]
    assert (root / "large" / "log.sqlite").stat().st_size == log_size
    assert json.loads(out.read_text())["points"][0]["large_ingest"] == []
