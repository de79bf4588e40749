"""`memstream serve --projections child`: the projections in a child process (fast model path).

Asserted: events published to the server reach every view through the child; the child runs at a
lower priority; a child killed mid-stream is restarted by the server and catches up (the views
then equal a fresh build of the same log); stopping the server stops the child, and killing the
server outright takes the child with it (no orphaned projector writing to the data directory)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from tests.e2e.fast_processes import FAST, dumps, fresh_build, subset
from tests.e2e.helpers import assert_same_views
from services.projection_child import child_pids
from tests.integration import servers

pytestmark = pytest.mark.e2e


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purpose
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_child_projections_restart_and_stop_with_the_server(tmp_path):
    events = subset()
    data = tmp_path / "data"
    with servers.memstream_serve(tmp_path, 300, "--projections", "child", data_dir=data, env=FAST) as s:
        http = httpx.Client(base_url=s.url, headers=s.headers, timeout=60)
        [child] = wait_for(lambda: child_pids(s.proc.pid), 30, "the projection child")
        assert int(Path(f"/proc/{child}/stat").read_text().split()[18]) == 10  # nice +10: searches get the CPU first

        r = http.post("/v1/events", json=events[:150])
        assert r.status_code == 200, r.text
        os.kill(child, signal.SIGKILL)  # mid-stream, most likely mid-batch
        [again] = wait_for(lambda: [c for c in child_pids(s.proc.pid) if c != child], 60, "a restarted child")
        r = http.post("/v1/events", json=events[150:])
        assert r.status_code == 200, r.text
        w = http.post("/v1/wait", json={"positions": r.json()["positions"], "timeout_seconds": 300})
        assert w.status_code == 200, w.text
        hits = http.post("/v1/search", json={"tenant_id": "crash", "question": "Who talked about Lisbon?", "max_turns": 5})
        assert hits.status_code == 200 and hits.json()["evidence"], hits.text
        assert "exited with" in s.log_path.read_text()  # the restart is in the server's log
    assert not alive(again), "stopping the server must stop its projection child"

    assert_same_views(fresh_build(data, tmp_path / "fresh"), dumps(data))


def test_killing_the_server_takes_the_child_with_it(tmp_path):
    with servers.memstream_serve(tmp_path, 300, "--projections", "child", data_dir=tmp_path / "data", env=FAST) as s:
        [child] = wait_for(lambda: child_pids(s.proc.pid), 30, "the projection child")
        s.proc.kill()
        s.proc.wait(30)
        wait_for(lambda: not alive(child), 30, "the child to follow its parent")
