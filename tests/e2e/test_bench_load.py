"""`memstream bench load` end to end, tiny and on the fast model path: it starts its own serve
(projections in a child process), seeds, runs its idle and load phases, stops by itself, and
writes a report whose figures are consistent with what it did. The figures themselves are the
benchmark's business (docs/results/load.md), not this test's: the machine is shared."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.e2e.fast_processes import BIN, env

pytestmark = pytest.mark.e2e


def test_bench_load_runs_and_reports(tmp_path):
    out, png = tmp_path / "load.json", tmp_path / "load.png"
    run = subprocess.run([str(BIN), "bench", "load", "--publishers", "2", "--rate", "10", "--batch", "5", "--searchers", "1",
                          "--idle", "3", "--duration", "6", "--conversation-turns", "40", "--out", str(out), "--plot", str(png)],
                         env=env(tmp_path / "unused"), capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["errors"] == 0 and r["config"]["scope"] == "conversation"
    assert 0 < r["held_events_per_s"] <= r["offered_events_per_s"]
    assert r["freshness"]["n"] > 0 and r["freshness"]["p50_s"] <= r["freshness"]["p99_s"]
    assert r["search"]["idle"]["n"] > 0 and r["search"]["load"]["n"] > 0 and r["search"]["idle_after"]["n"] > 0
    assert set(r["search"]["load_by_conversation"]) <= {"being_written", "finished"}
    server = r["search"]["server_side"]["load"]  # the server's own timings of the same searches
    assert server["n"] == r["search"]["load"]["n"] and server["p50_ms"] <= r["search"]["load"]["p50_ms"]
    assert {"total", "encode"} & set(server["stages_p99_ms"]) == {"encode"}
    assert {"serve", "projections"} <= set(r["processes"]) and r["processes"]["projections"]["rss_mb_last"] > 0
    assert png.stat().st_size > 10_000
    assert r["command"].startswith("memstream bench load")


def test_bench_load_refuses_a_remote_address(tmp_path):
    run = subprocess.run([str(BIN), "bench", "load", "--url", "http://192.0.2.10:8080", "--key", "x", "--out", str(tmp_path / "x.json")],
                         env=env(tmp_path / "unused"), capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and "loopback" in run.stderr


def test_the_recorded_command_never_holds_the_key():
    from services.bench_cli import _redacted

    assert _redacted(["bench", "load", "--key", "msk_secret", "--url", "http://127.0.0.1:1", "--key=msk_other"]) == \
        ["bench", "load", "--key", "***", "--url", "http://127.0.0.1:1", "--key=***"]
