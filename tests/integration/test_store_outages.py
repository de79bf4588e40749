"""A store outage costs lag, never memory (Kafka + OpenSearch + Neo4j/GDS + the Qdrant server).

While a `memstream worker` projects, Neo4j, then Qdrant, then OpenSearch are stopped for real
(infra/servers/stop.sh) and started again (start.sh, same data and ports):

- the projection of the store that is down retries with back-off; the worker's /metrics shows it
  ERROR or STALLED with the reason; the other projections keep up with new events;
- queries fall back where a fallback exists and say so (no graph -> hierarchy-only, no dense
  view -> BM25); without the unit store (OpenSearch) search answers 503 with Retry-After naming
  the view, and a publish (the data keys live there too) 503 — never a 200 for an event then lost,
  never a 500;
- the store back, its projection catches up by itself; the final views equal an uninterrupted
  embedded run's (fast model path in both).
"""

from __future__ import annotations

import uuid

import pytest

from infra.registry import Registry
from schemas.ports.views import VIEW_NAMES
from tests.e2e import helpers
from tests.e2e.helpers import assert_same_views, strip_positions
from tests.e2e.fast_processes import FAST, subset
from tests.integration import servers
from tests.integration.fault_stack import distributed, server as _server, stack, stop_worker, uninterrupted  # noqa: F401 (stack: the fixture)
from tests.integration.test_distributed_pipeline import lag

pytestmark = [pytest.mark.integration, pytest.mark.e2e]
def _turns(events: list[dict]) -> list[dict]:
    return [e for e in events if e["type"] == "TurnRecorded"]


OPS = "ops-" + uuid.uuid4().hex


def test_a_store_outage_costs_lag_never_memory(stack, tmp_path):  # noqa: F811
    from fastapi.testclient import TestClient

    from services.api import create_app

    settings = stack
    turns = _turns(subset())[:120]
    groups = [turns[i:i + 30] for i in range(0, 120, 30)]
    port = servers.free_ports(1)[0]
    ready, log_path = tmp_path / "worker.ready", tmp_path / "worker.log"
    worker = servers.spawn_worker(settings, log_path, ready, "--metrics-port", str(port), MEMSTREAM_OPS_SAMPLE_SECONDS="0.3",
                                  MEMSTREAM_OPS_WINDOW_SECONDS="5", MEMSTREAM_OPS_TOKEN=OPS, **FAST)
    alive = lambda: worker.poll() is not None and log_path.read_text()[-3000:]  # noqa: E731
    registry = Registry(settings)
    admin = helpers.make_key(settings)
    published: list[dict] = []
    try:
        helpers.until(ready.exists, "the worker to start", 300, alive=alive)
        with TestClient(create_app(settings, process=False, registry=registry), headers=helpers.bearer(admin)) as api:
            def publish(items: list[dict]) -> dict[int, int]:
                r = api.post("/v1/events", json=items)
                assert r.status_code == 200, r.text
                published.extend(items)
                return {int(p): o for p, o in r.json()["positions"].items()}

            def search(strategy: str = "zero-mem"):
                return api.post("/v1/search", json={"question": "Who planned the ferry to Lisbon?", "tenant_id": "crash", "strategy": strategy})

            end = publish(groups[0])
            helpers.until(lambda: all(v == 0 for v in lag(settings, end).values()), "every view to catch up", 300, alive=alive)
            assert search().json()["strategy"] == "zero-mem"

            for group, (server, view, fallback) in zip(groups[1:3], [("neo4j", "graph", "hierarchy-only"), ("qdrant", "dense", "bm25")]):
                _server("stop", server)
                try:
                    end = publish(group)  # Kafka and the key store are up: accepted
                    others = [v for v in VIEW_NAMES if v != view]
                    helpers.until(lambda: (lg := lag(settings, end, others)) and all(lg[v] == 0 for v in others),
                                  f"the other views to keep up while {server} is down", 300, alive=alive)
                    r = search()
                    assert r.status_code == 200, r.text
                    body = r.json()
                    assert body["strategy"] == fallback and any(f"the {view} view is unavailable" in n for n in body["notes"]), body["notes"]
                    assert body["evidence"]
                    m = helpers.until(lambda: (s := scrape_info(port)) and s["status"].get((view, "ERROR"), 0) + s["status"].get((view, "STALLED"), 0)
                                      and s["reasons"].get(view) and s, f"the worker's /metrics to show {view} failing with its reason", 120)
                    assert "TransientError" in m["reasons"][view], m["reasons"]
                finally:
                    _server("start", server)
                helpers.until(lambda: lag(settings, end)[view] == 0, f"{view} to catch up by itself once {server} is back", 300, alive=alive)

            _server("stop", "opensearch")
            try:
                r = search()
                assert r.status_code == 503 and r.headers.get("Retry-After"), r.text
                assert r.json()["error"]["code"] == "view_unavailable" and "hierarchy" in r.json()["error"]["message"]
                refused = api.post("/v1/events", json=groups[3][:5])
                assert refused.status_code == 503 and refused.headers.get("Retry-After"), refused.text  # never a 200 then lost
                assert api.get("/v1/status").status_code in (200, 503)
            finally:
                _server("start", "opensearch")
            end = publish(groups[3])
            helpers.until(lambda: all(v == 0 for v in lag(settings, end).values()), "every view to catch up after the outages", 300,
                          alive=alive)
    finally:
        stop_worker(worker)
    assert_same_views(strip_positions(uninterrupted(tmp_path / "embedded", published)), strip_positions(distributed(registry)), atol=1e-5)


def scrape_info(port: int) -> dict:
    """The worker's projection status gauges and last-error reasons."""
    import urllib.request

    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers={"Authorization": f"Bearer {OPS}"})
    text = urllib.request.urlopen(request, timeout=10).read().decode()
    status, reasons = {}, {}
    for name, labels, value in helpers.metric_samples(text):
        if name == "memstream_projection_status" and value:
            status[(labels["projection"], labels["status"])] = value
        if name == "memstream_projection_last_error_info" and value:
            reasons[labels["projection"]] = labels["reason"]
    return {"status": status, "reasons": reasons}
