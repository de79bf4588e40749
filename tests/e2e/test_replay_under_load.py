"""A replay of every view while events keep coming and questions keep being asked, in real
processes: `memstream serve` (embedded, the fast model path) takes a stream of publishes and
searches while `memstream replay --projection all` rebuilds the four views beside it.

Asserted: not one search or publish fails; once ingest stops and the views catch up, they equal a
fresh build of the same log (canonical dumps of all four); every replaced generation's directory is
gone, and the views' disk use is that of a fresh build (measured before the replay, after it — while
serving and once stopped — and for the fresh build; the figures are printed)."""

from __future__ import annotations

import subprocess
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx
import pytest

from schemas.ports.views import VIEW_NAMES
from tests.e2e.fast_processes import BIN, FAST, dumps, env, fresh_build, subset
from tests.e2e.helpers import assert_same_views
from tests.integration import servers

pytestmark = pytest.mark.e2e

QUESTIONS = ["Who talked about Lisbon?", "What was the weather on day 12?", "Which plan did Grace have for the ferry?"]


def disk(path: Path, *, logs: bool = True) -> int:
    """Bytes under path; logs=False leaves SQLite's write-ahead logs out (a process stopped
    under load may leave them for the next opener to checkpoint: they are not a generation)."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and (logs or not p.name.endswith(("-wal", "-shm"))))


def live_turn(i: int) -> dict:
    t0 = datetime(2026, 4, 1, 9, 0, tzinfo=timezone.utc)
    return {"type": "TurnRecorded", "event_id": f"live-{i}", "tenant_id": "crash", "conversation_id": "conv-live",
            "session_id": f"s{i // 40}", "agent_id": "agent-live", "turn_index": i % 40, "speaker": "Mira",
            "text": f"Mira wrote about the market in Kyoto on live day {i}.", "occurred_at": (t0 + timedelta(minutes=i)).isoformat()}


def test_replay_of_every_view_under_ingest_and_queries(tmp_path):
    data = tmp_path / "data"
    with servers.memstream_serve(tmp_path, 300, data_dir=data, env={**FAST, "MEMSTREAM_RUNNER_RETIRE_GRACE_SECONDS": "2"}) as s:
        headers = {"Authorization": f"Bearer {s.admin_key['key']}"}
        http = httpx.Client(base_url=s.url, headers=headers, timeout=60)
        first = http.post("/v1/events", json=subset())
        assert first.status_code == 200, first.text
        assert http.post("/v1/wait", json={"positions": first.json()["positions"], "timeout_seconds": 300}).status_code == 200
        before = disk(data / "views")

        stop, failures, counts, last_positions = threading.Event(), [], {"search": 0, "publish": 0}, {}

        def ingest():
            i = 0
            with httpx.Client(base_url=s.url, headers=headers, timeout=60) as c:
                while not stop.is_set():
                    r = c.post("/v1/events", json=[live_turn(i + k) for k in range(5)])
                    if r.status_code != 200:
                        failures.append(f"publish {r.status_code}: {r.text[:300]}")
                    else:
                        for p, off in r.json()["positions"].items():
                            last_positions[p] = max(last_positions.get(p, 0), off)
                    i, counts["publish"] = i + 5, counts["publish"] + 1
                    time.sleep(0.05)

        def search():
            with httpx.Client(base_url=s.url, headers=headers, timeout=60) as c:
                while not stop.is_set():
                    for strategy in ("zero-mem", "bm25", "dense"):
                        r = c.post("/v1/search", json={"tenant_id": "crash", "question": QUESTIONS[counts["search"] % 3],
                                                       "strategy": strategy, "max_turns": 10})
                        if r.status_code != 200 or not r.json()["evidence"]:
                            failures.append(f"search {strategy} {r.status_code}: {r.text[:300]}")
                        counts["search"] += 1

        threads = [threading.Thread(target=ingest), threading.Thread(target=search)]
        for t in threads:
            t.start()
        try:
            time.sleep(1.0)
            replay = subprocess.run([str(BIN), "replay", "--projection", "all"], env={**env(data), "MEMSTREAM_RUNNER_RETIRE_GRACE_SECONDS": "2"},
                                    capture_output=True, text=True, timeout=600)
            assert replay.returncode == 0, replay.stderr[-3000:]
            time.sleep(1.0)
        finally:
            stop.set()
            for t in threads:
                t.join()
        assert failures == [], failures[:5]
        assert counts["search"] >= 10 and counts["publish"] >= 10, counts
        assert http.post("/v1/wait", json={"positions": last_positions, "timeout_seconds": 300}).status_code == 200
        serving = disk(data / "views")  # with the write-ahead logs of a running process
        http.close()
    for view in VIEW_NAMES:
        assert [p.name for p in (data / "views" / view).glob("gen-*")] == ["gen-2"], f"{view}: the replaced generation is still on disk"

    fresh = tmp_path / "fresh"  # the same log (and data keys), views built from scratch
    dumped = dumps(data)  # opens and closes every view: what a stopped process left in write-ahead logs is checkpointed
    after = disk(data / "views", logs=False)
    assert_same_views(fresh_build(data, fresh), dumped)
    built = disk(fresh / "views", logs=False)
    print(f"views on disk: {before / 1e6:.2f} MB before the replay, {after / 1e6:.2f} MB after it with {counts['publish'] * 5} "
          f"more turns ({serving / 1e6:.2f} MB while serving, write-ahead logs included), {built / 1e6:.2f} MB for a fresh build; "
          f"{counts['search']} searches and {counts['publish']} publishes during it, none failed")
    assert after <= 1.25 * built, (after, built)  # the replaced generation alone would add ~40 %
