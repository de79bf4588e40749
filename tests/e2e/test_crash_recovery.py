"""Crash safety of the embedded pipeline: `memstream process` killed with SIGKILL at every named
fault point (schemas/faults.py) and at seeded random moments, then restarted, ends with the
same views — canonical dumps of all four compared — as a run that was never interrupted: no
unit, entity, edge or vector lost or duplicated. Replays killed before and after their catalog
switch leave no half-built or orphaned generation behind.

Runs on a 300-turn synthetic subset with the declared fast model path (hashing encoder, lexicon
NER: infra/models/fast.py), in real `memstream` processes; the real models have their own runs."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from schemas.ports.views import VIEW_NAMES
from tests.e2e.helpers import assert_same_views

pytestmark = pytest.mark.e2e
BIN = Path(sys.executable).with_name("memstream")
FAST = {"MEMSTREAM_ENCODER_MODEL": "hashing", "MEMSTREAM_NER_MODEL": "lexicon", "MEMSTREAM_RUNNER_BATCH_SIZE": "16",
        "MEMSTREAM_RUNNER_RETIRE_GRACE_SECONDS": "0", "MEMSTREAM_LOG_PARTITIONS": "2"}
NAMES = ["Ada", "Bo", "Grace", "Linus", "Mira", "Tomás"]
PLACES = ["Lisbon", "Akureyri", "Porto Alegre", "Kyoto", "Nairobi"]


def subset() -> list[dict]:
    """300 turns in 4 conversations of 3 sessions, a late turn, and forgets in the middle (a turn
    and a session), so that batches need several steps."""
    t0 = datetime(2026, 3, 1, 9, 0, tzinfo=timezone.utc)
    rng = random.Random(7)
    items: list[dict] = []
    for c in range(4):
        for s in range(3):
            for i in range(25):
                who = NAMES[(c + i) % len(NAMES)]
                text = (f"{who} talked about {rng.choice(PLACES)} and {rng.choice(NAMES)}'s plan for the {rng.choice(['ferry', 'hike', 'concert', 'market'])} "
                        f"on day {s * 25 + i}; it was {rng.choice(['rainy', 'sunny', 'windy'])}.")
                items.append({"type": "TurnRecorded", "event_id": f"c{c}-s{s}-{i}", "tenant_id": "crash", "conversation_id": f"conv-{c}",
                              "session_id": f"s{s}", "agent_id": f"agent-{i % 2}", "turn_index": i, "speaker": who, "text": text,
                              "occurred_at": (t0 + timedelta(days=s, minutes=i + 30 * c)).isoformat()})
    late = items.pop(10)  # published last: its session is re-derived
    items.append(late)
    forget_turn = {"type": "ForgetRequested", "event_id": "forget-turn", "tenant_id": "crash", "requested_at": "2026-06-01T00:00:00Z",
                   "scope": {"level": "turn", "conversation_id": "conv-1", "event_id": "c1-s0-3"}}
    forget_session = {"type": "ForgetRequested", "event_id": "forget-session", "tenant_id": "crash", "requested_at": "2026-06-01T00:00:00Z",
                      "scope": {"level": "session", "conversation_id": "conv-2", "session_id": "s1"}}
    items.insert(120, forget_turn)
    items.insert(230, forget_session)
    return items


def env(data: Path, fault: str | None = None) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith(("MEMSTREAM_LOG_", "MEMSTREAM_VIEWS_", "MEMSTREAM_FAULT"))}
    out.update(FAST, MEMSTREAM_DATA_DIR=str(data))
    if fault:
        out["MEMSTREAM_FAULT"] = fault
    return out


def cli(data: Path, *args: str, fault: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run([str(BIN), *args], env=env(data, fault), capture_output=True, text=True, timeout=600)
    if check:
        assert out.returncode == 0, f"memstream {' '.join(args)} failed ({out.returncode}):\n{out.stderr[-3000:]}"
    return out


def positions(data: Path) -> dict[str, dict[int, int]]:
    """Each view's live generation's positions, read from its SQLite file (what a restart resumes from)."""
    if not (data / "views" / "catalog.sqlite").exists():
        return {view: {} for view in VIEW_NAMES}
    catalog = sqlite3.connect(data / "views" / "catalog.sqlite")
    live = dict(catalog.execute("SELECT view, generation FROM generations WHERE state='live'").fetchall())
    catalog.close()
    files = {"hierarchy": "units.sqlite", "lexical": "ledger.sqlite", "dense": "vectors.sqlite", "graph": "graph.sqlite"}
    out = {}
    for view in VIEW_NAMES:
        path = data / "views" / view / f"gen-{live.get(view, 1)}" / files[view]
        if not path.exists():
            out[view] = {}
            continue
        c = sqlite3.connect(path)
        try:
            out[view] = dict(c.execute("SELECT partition, next_offset FROM positions").fetchall())
        except sqlite3.OperationalError:  # a store being created this instant
            out[view] = {}
        finally:
            c.close()
    return out


def total(pos: dict[int, int]) -> int:
    return sum(pos.values())


def dumps(data: Path) -> dict:
    from infra.registry import Registry
    from infra.settings import Settings

    registry = Registry(Settings.load(data_dir=data))
    out = {}
    for view in VIEW_NAMES:
        store = registry.open_view(view, registry.catalog().current(view))
        try:
            out[view] = store.canonical_dump()
        finally:
            store.close()
    return out


@pytest.fixture(scope="module")
def published(tmp_path_factory) -> Path:
    """A data directory with the subset on the log and no view built: the template every run copies."""
    d = tmp_path_factory.mktemp("crash") / "template"
    events = d.parent / "subset.jsonl"
    events.write_text("".join(json.dumps(e) + "\n" for e in subset()))
    cli(d, "ingest", "jsonl", str(events))
    return d


@pytest.fixture(scope="module")
def reference(published, tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("crash") / "reference"
    shutil.copytree(published, d)
    cli(d, "process", "--until-caught-up")
    return dumps(d)


def _end(data: Path) -> int:
    c = sqlite3.connect(data / "log.sqlite")
    n = c.execute("SELECT SUM(next_offset) FROM heads WHERE topic='memstream.events'").fetchone()[0]
    c.close()
    return n


@pytest.mark.parametrize("point, visit", [("view-written", 3), ("position-written", 4), ("mid-batch", 1)])
def test_a_kill_at_each_point_of_a_step_loses_and_duplicates_nothing(published, reference, tmp_path, point, visit):
    data = tmp_path / "data"
    shutil.copytree(published, data)
    died = cli(data, "process", "--until-caught-up", fault=f"{point}:{visit}", check=False)
    assert died.returncode == -signal.SIGKILL, (died.returncode, died.stderr[-2000:])
    assert "MEMSTREAM_FAULT: killing process" in died.stderr and point in died.stderr
    before = positions(data)
    assert any(total(p) < _end(data) for p in before.values()), f"the kill at {point} landed after the work was done: {before}"
    cli(data, "process", "--until-caught-up")
    assert_same_views(dumps(data), reference)


def test_replays_killed_before_and_after_their_switch_leave_the_views_whole_and_no_generation_behind(published, reference, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(published, data)
    cli(data, "process", "--until-caught-up")
    died = cli(data, "replay", "--projection", "all", fault="replay-built:1", check=False)
    assert died.returncode == -signal.SIGKILL, died.stderr[-2000:]
    assert len(list((data / "views" / "hierarchy").glob("gen-*"))) == 2  # the live one and the half-built one
    assert_same_views(dumps(data), reference)  # readers never saw the unfinished build
    died = cli(data, "replay", "--projection", "all", fault="replay-switched:2", check=False)  # after the second view's switch
    assert died.returncode == -signal.SIGKILL, died.stderr[-2000:]
    assert_same_views(dumps(data), reference)
    cli(data, "replay", "--projection", "all")
    for view in VIEW_NAMES:
        left = sorted(p.name for p in (data / "views" / view).glob("gen-*"))
        assert len(left) == 1, f"{view}: generations left on disk after the replays: {left}"
    assert_same_views(dumps(data), reference)


def test_seeded_random_kills_land_mid_work_and_change_nothing(published, reference, tmp_path):
    """At least 20 SIGKILLs at random moments of `memstream process`, each shown to have landed
    while work was in progress: the views' positions moved during that run and had not reached
    the log's end when it died."""
    rng = random.Random(20261202)
    kills, runs, templates = 0, 0, 0
    while kills < 20:
        templates += 1
        data = tmp_path / f"data-{templates}"
        shutil.copytree(published, data)
        end = _end(data)
        while True:
            start = positions(data)
            if all(total(p) >= end for p in start.values()):
                break
            proc = subprocess.Popen([str(BIN), "process", "--until-caught-up"], env=env(data), stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)
            runs += 1
            # wait for work to start (a position moves), then kill at a random moment of it
            deadline = time.monotonic() + 120
            while proc.poll() is None and positions(data) == start and time.monotonic() < deadline:
                time.sleep(0.02)
            time.sleep(rng.uniform(0.0, 0.4))
            if kills >= 20:  # enough: let this run finish the template
                assert proc.wait(300) == 0
                continue
            if proc.poll() is not None:
                continue  # it finished first: no kill this time
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
            after = positions(data)
            moved = any(total(after[v]) > total(start[v]) for v in VIEW_NAMES)
            unfinished = any(total(after[v]) < end for v in VIEW_NAMES)
            if moved and unfinished:
                kills += 1
        assert_same_views(dumps(data), reference)
    assert kills >= 20 and runs >= kills
    print(f"random kills: {kills} landed mid-work in {runs} runs over {templates} data directories")
