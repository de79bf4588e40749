"""Crash safety of the embedded pipeline: `memstream process` killed with SIGKILL at every named
fault point (schemas/faults.py) and at seeded random moments, then restarted, ends with the
same views — canonical dumps of all four compared — as a run that was never interrupted: no
unit, entity, edge or vector lost or duplicated. Replays killed before and after their catalog
switch leave no half-built or orphaned generation behind.

Runs on a 300-turn synthetic subset with the declared fast model path (hashing encoder, lexicon
NER: infra/models/fast.py), in real `memstream` processes; the real models have their own runs."""

from __future__ import annotations

import json
import random
import shutil
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from schemas.ports.views import VIEW_NAMES
from tests.e2e.fast_processes import BIN, cli, dumps, env, positions, subset, total
from tests.e2e.helpers import assert_same_views

pytestmark = pytest.mark.e2e
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
