"""`memstream eval locomo` end to end on one dev conversation: ingest through the log, every
strategy asked, the report in the documented shape, tokens counted by the reader proxy.
Skips cleanly without the LoCoMo file (it is read from ../shared, never copied here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from services.query.config import DEFAULT
from tests.conftest import REPO

pytestmark = pytest.mark.e2e

CATEGORIES = {"all", "multi-hop", "temporal", "open-domain", "single-hop"}


def test_eval_report_shape_and_ordering_on_one_conversation(locomo, tmp_path):
    out = tmp_path / "eval.json"
    run = subprocess.run(
        [sys.executable, "-m", "services.cli", "eval", "locomo", str(locomo), "--conversations", "conv-30",
         "--strategies", "zero-mem,bm25,dense", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=900, env={**os.environ, "TMPDIR": str(tmp_path)})  # its fresh data dir
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["dataset"] == "locomo" and report["questions"] > 50
    assert report["ingest"]["turns"] > 300 and report["ingest"]["seconds"] > 0 and report["ingest"]["llm_tokens"] == 0
    assert report["reader_requests"] == 0 and report["refused_connections"] == 0
    for name in ("zero-mem", "bm25", "dense"):
        s = report["strategies"][name]
        assert s["llm_tokens"] == 0
        assert set(s["recall"]) == {"budget_10", "budget_25"}
        for row in s["recall"].values():
            assert set(row) == CATEGORIES and all(v is None or 0.0 <= v <= 1.0 for v in row.values())
        assert s["recall"]["budget_10"]["all"] <= s["recall"]["budget_25"]["all"]
        assert 0 < s["latency_ms"]["p50"] <= s["latency_ms"]["p95"]
        assert s["stage_ms_p50"]["evidence"] > 0
    stages = set(report["strategies"]["zero-mem"]["stage_ms_p50"])
    assert {"encode", "graph_view", "hierarchy_view"} <= stages
    assert ("closure" in stages) == (DEFAULT.closure_graph > 0)  # the closure's PageRank is timed when the constants run it
    zero, bm25, dense = (report["strategies"][n]["recall"] for n in ("zero-mem", "bm25", "dense"))
    for b in ("budget_10", "budget_25"):  # the method's whole point; margins are ~0.2 on the dev split
        assert zero[b]["all"] > max(bm25[b]["all"], dense[b]["all"])
    assert "zero-mem" in run.stdout  # the readable table
