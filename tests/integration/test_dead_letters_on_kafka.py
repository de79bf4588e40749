"""A view that throws on one event, on Kafka with a faust worker and the real servers (the fast
model path): the record is dead-lettered with the reason by each of the four projections, which
go on (every other turn is in every view, the positions reach the log's end); after the cause is
gone (a worker without the fault), `memstream dlq replay` brings the record back and every view
equals an uninterrupted run over all turns.

The fault is injected with MEMSTREAM_FAULT_POISON (schemas/faults.py): every projection raises on
a turn whose text holds the marker. The same runner path isolates a store that rejects one
document (a StoreError from the store's write); hostile records that are not valid events are
covered on Kafka by tests/integration/test_kafka_consumer_fuzz.py."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

from infra.registry import Registry
from schemas.ports.views import VIEW_NAMES
from tests.e2e import helpers
from tests.e2e.fast_processes import FAST, subset
from tests.e2e.helpers import assert_same_views, strip_positions
from tests.integration import servers
from tests.integration.fault_stack import distributed, end_offsets, stack, stop_worker, uninterrupted  # noqa: F401 (stack: the fixture)
from tests.integration.test_distributed_pipeline import lag

pytestmark = [pytest.mark.integration, pytest.mark.e2e]
MARKER = "poison-" + uuid.uuid4().hex[:8]


def test_a_view_that_throws_on_one_event_dead_letters_it_and_goes_on(stack, tmp_path):  # noqa: F811
    from fastapi.testclient import TestClient

    from services.api import create_app

    settings = stack
    turns = [e for e in subset() if e["type"] == "TurnRecorded"][:40]
    turns[17] = {**turns[17], "text": f"{turns[17]['text']} {MARKER}"}
    registry = Registry(settings)
    admin = helpers.make_key(settings)
    worker, log_path = None, tmp_path / "worker.log"
    try:
        ready = tmp_path / "worker.ready"
        worker = servers.spawn_worker(settings, log_path, ready, MEMSTREAM_FAULT_POISON=MARKER, **FAST)
        alive = lambda: worker.poll() is not None and log_path.read_text()[-3000:]  # noqa: E731
        helpers.until(ready.exists, "the worker to start", 300, alive=alive)
        with TestClient(create_app(settings, process=False, registry=registry), headers=helpers.bearer(admin)) as api:
            r = api.post("/v1/events", json=turns)
            assert r.status_code == 200, r.text
            end = {int(p): o for p, o in r.json()["positions"].items()}
            helpers.until(lambda: all(v == 0 for v in lag(settings, end).values()), "every view past the poisoned turn", 300, alive=alive)
            dead = api.get("/v1/dead-letters").json()["dead_letters"]
            assert len(dead) == 1 and sorted(dead[0]["projections"]) == sorted(VIEW_NAMES), dead
            assert "MEMSTREAM_FAULT_POISON" in dead[0]["reason"] and MARKER not in dead[0]["reason"]
            assert turns[17]["event_id"] in dead[0]["value"] and MARKER not in dead[0]["value"]  # the record as logged: sealed
            assert dead[0]["replayed"] is False
        assert_same_views(strip_positions(uninterrupted(tmp_path / "without", turns[:17] + turns[18:])),
                          strip_positions(distributed(registry)), atol=1e-5)
        stop_worker(worker)

        ready = tmp_path / "worker2.ready"  # the cause fixed: a worker without the fault
        worker = servers.spawn_worker(settings, tmp_path / "worker2.log", ready, **FAST)
        helpers.until(ready.exists, "the second worker to start", 300)
        env = {**servers.memstream_env(settings), **FAST}
        out = subprocess.run([sys.executable, "-m", "services.cli", "dlq", "replay"], env={**os.environ, **env},
                             capture_output=True, text=True, timeout=300, cwd=servers.REPO)
        assert out.returncode == 0, out.stderr[-3000:]
        end = end_offsets(settings)
        helpers.until(lambda: all(v == 0 for v in lag(settings, end).values()), "every view to take the replayed turn", 300)
        assert_same_views(strip_positions(uninterrupted(tmp_path / "all", turns)), strip_positions(distributed(registry)), atol=1e-5)
    finally:
        if worker is not None:
            stop_worker(worker)

