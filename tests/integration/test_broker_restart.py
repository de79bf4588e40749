"""A Kafka broker restart under load costs lag, never memory (Kafka + OpenSearch + Neo4j/GDS + the
Qdrant server, the fast model path).

A publisher keeps posting 5-turn batches to the API while a `memstream worker` projects; the broker
is stopped for real (infra/servers/stop.sh), a publish is made while it is away, and it is started
again on its own data (start.sh); the publishers retry a 503 with the same event ids, as the client
does. Asserted: every publish is answered 200 or 503 with Retry-After —
the one made while the broker is away is a 503 once the log's request timeout (10 s here,
MEMSTREAM_LOG_REQUEST_TIMEOUT_SECONDS) has passed, never a 200 — never a 500; the API's producer and the worker's consumers reconnect by themselves;
every acknowledged event reaches every view exactly once: the final views equal an uninterrupted
embedded run over the acknowledged events (canonical dumps of all four)."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta, timezone

import pytest

from infra.registry import Registry
from tests.e2e import helpers
from tests.e2e.fast_processes import FAST
from tests.e2e.helpers import assert_same_views, strip_positions
from tests.integration import servers
from tests.integration.test_distributed_pipeline import lag
from tests.integration.fault_stack import distributed, end_offsets, server as _server, stack, stop_worker, uninterrupted  # noqa: F401 (stack: the fixture)

pytestmark = [pytest.mark.integration, pytest.mark.e2e]


def turn(i: int) -> dict:
    t0 = datetime(2026, 5, 1, 8, 0, tzinfo=timezone.utc)
    return {"type": "TurnRecorded", "event_id": f"load-{i}", "tenant_id": "crash", "conversation_id": f"conv-{i % 3}",
            "session_id": f"s{i // 60}", "agent_id": "agent-load", "turn_index": i, "speaker": ["Ada", "Bo", "Mira"][i % 3],
            "text": f"{['Ada', 'Bo', 'Mira'][i % 3]} booked the ferry to Lisbon for day {i}.", "occurred_at": (t0 + timedelta(minutes=i)).isoformat()}


def test_a_broker_restart_under_load_costs_lag_never_memory(stack, tmp_path):  # noqa: F811
    from fastapi.testclient import TestClient

    from services.api import create_app

    settings = stack.model_copy(update={"log": stack.log.model_copy(update={"request_timeout_seconds": 10.0})})
    ready, log_path = tmp_path / "worker.ready", tmp_path / "worker.log"
    worker = servers.spawn_worker(settings, log_path, ready, MEMSTREAM_LOG_REQUEST_TIMEOUT_SECONDS="10", **FAST)
    alive = lambda: worker.poll() is not None and log_path.read_text()[-3000:]  # noqa: E731
    registry = Registry(settings)
    admin = helpers.make_key(settings)
    acknowledged: list[dict] = []
    codes: list[int] = []
    problems: list[str] = []
    try:
        helpers.until(ready.exists, "the worker to start", 300, alive=alive)
        with TestClient(create_app(settings, process=False, registry=registry), headers=helpers.bearer(admin)) as api:
            def publish(items: list[dict]):
                r = api.post("/v1/events", json=items)
                codes.append(r.status_code)
                if r.status_code in (200, 207):
                    body = r.json()
                    acknowledged.extend(items[o["index"]] for o in body["items"] if o["status"] == "accepted")
                elif r.status_code == 503:
                    if not r.headers.get("Retry-After"):
                        problems.append(f"503 without Retry-After: {r.text[:300]}")
                else:
                    problems.append(f"{r.status_code}: {r.text[:300]}")
                return r

            stop, counter = threading.Event(), iter(range(0, 10**6, 5))

            def until_accepted(items: list[dict]) -> None:
                """A well-behaved client: a 503 is retried with the same event ids until accepted (a 503'd
                batch may have reached the log anyway; the ids make the retry harmless)."""
                while publish(items).status_code != 200:
                    time.sleep(1.0)

            def load():
                while not stop.is_set():
                    i = next(counter)
                    until_accepted([turn(i + k) for k in range(5)])
                    time.sleep(0.1)

            thread = threading.Thread(target=load)
            thread.start()
            try:
                helpers.until(lambda: len(acknowledged) >= 50, "the load to be accepted", 120)
                _server("stop", "kafka")
                try:
                    i = next(counter)
                    t0 = time.monotonic()
                    away_items = [turn(i + k) for k in range(5)]
                    away = publish(away_items)
                    waited = time.monotonic() - t0
                    assert away.status_code == 503 and away.headers.get("Retry-After"), away.text
                    assert "unavailable" in away.json()["error"]["message"], away.text  # the log (or, first, the key ring reading it)
                finally:
                    _server("start", "kafka")
                until_accepted(away_items)
                helpers.until(lambda: codes[-3:] == [200, 200, 200], "publishing to work again after the restart", 180)
                time.sleep(2.0)
            finally:
                stop.set()
                thread.join()
            assert problems == [], problems[:5]
            positions = end_offsets(settings)
            helpers.until(lambda: all(v == 0 for v in lag(settings, positions).values()), "every view to catch up after the restart",
                          300, alive=alive)
    finally:
        stop_worker(worker)
    print(f"broker restart: {len(acknowledged)} turns acknowledged in {len(codes)} publishes ({codes.count(503)} answered 503); "
          f"the publish while the broker was away answered 503 after {waited:.1f} s")

    assert_same_views(strip_positions(uninterrupted(tmp_path / "embedded", acknowledged)), strip_positions(distributed(registry)),
                      atol=1e-5)
