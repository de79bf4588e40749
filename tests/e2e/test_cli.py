"""The console script as a user runs it (subprocesses, real files, real models)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import turn

pytestmark = pytest.mark.e2e

BIN = Path(sys.executable).with_name("memstream")


def run(data_dir: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "MEMSTREAM_DATA_DIR": str(data_dir)}
    proc = subprocess.run([str(BIN), *args], env=env, capture_output=True, text=True, timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError(f"memstream {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def test_demo_shows_every_view_with_provenance(tmp_path):
    out = run(tmp_path / "demo", "demo").stdout
    assert "published 15 TurnRecorded events" in out
    for view in ("hierarchy", "graph", "lexical", "dense"):
        assert f"{view:<9}" in out and "lag 0" in out
    assert "event=lisbon-trip-001 log=p" in out  # provenance down to the log position
    assert "personalised PageRank" in out and "BM25 turns" in out and "cosine sentences" in out


def test_ingest_process_status_dlq_and_replay(tmp_path):
    data = tmp_path / "cli"
    good = [json.loads(turn(i).model_dump_json()) for i in range(6)]
    lines = [json.dumps(e) for e in good[:3]] + ["{not json", json.dumps({**good[3], "turn_index": -5})] + [json.dumps(e) for e in good[3:]]
    path = tmp_path / "events.jsonl"
    path.write_text("\n".join(lines) + "\n")
    proc = run(data, "ingest", "jsonl", str(path))
    assert "appended 6 events" in proc.stdout and "rejected 2" in proc.stdout
    assert "line 4: line.4: not valid JSON" in proc.stderr and "line 5: turn_index" in proc.stderr
    status = json.loads(run(data, "status", "--json", "--settle", "1.5", "--interval", "0.5").stdout)
    # Nothing runs the projections: the positions do not move while lag > 0.
    assert all(v["lag_events"] == 6 and v["status"] == "STALLED" for v in status["projections"])
    assert all(v["lag_seconds"] > 0 for v in status["projections"])
    run(data, "pause", "graph")
    out = run(data, "process", "--until-caught-up")
    assert "caught up with 6 records" in out.stdout and "graph is paused" in out.stdout
    status = {v["name"]: v for v in json.loads(run(data, "status", "--json", "--settle", "0").stdout)["projections"]}
    assert status["graph"]["paused"] and status["graph"]["lag_events"] == 6
    assert all(v["lag_events"] == 0 for name, v in status.items() if name != "graph")
    run(data, "resume", "graph")
    assert "caught up with 6 records" in run(data, "process", "--until-caught-up").stdout
    status = json.loads(run(data, "status", "--json").stdout)
    assert all(v["lag_events"] == 0 and v["generation"] == 1 and v["status"] == "OK" and not v["paused"] for v in status["projections"])
    assert "no dead letters" in run(data, "dlq", "list").stdout
    out = run(data, "replay", "--projection", "lexical").stdout
    assert "lexical: rebuilt generation 2 from offset 0" in out
    status = {v["name"]: v for v in json.loads(run(data, "status", "--json").stdout)["projections"]}
    assert status["lexical"]["generation"] == 2 and status["lexical"]["lag_events"] == 0
    bad = run(data, "ingest", "jsonl", str(tmp_path / "missing.jsonl"), check=False)
    assert bad.returncode != 0
