"""Operations through the HTTP API: pause/resume one projection, lag in /metrics equal to the
dashboard's snapshot, health (STALLED while paused, OK after resume), freshness, query latency
and request metrics, dead letters with their reason."""

from __future__ import annotations

import pytest

from infra.settings import Settings
from tests.e2e.helpers import api_client, sample_items, until
from tests.e2e.helpers import metric_sum as metric

pytestmark = pytest.mark.e2e


@pytest.fixture
def client(tmp_path, models):
    settings = Settings.load(data_dir=tmp_path / "ops", ops={"sample_seconds": 0.2, "window_seconds": 1.0})
    with api_client(settings, models) as c:
        yield c


def projections(client) -> dict:
    return {p["name"]: p for p in client.get("/v1/ops/snapshot").json()["projections"]}


def test_pause_lag_metrics_health_and_resume(client):
    r = client.post("/v1/admin/projections/lexical/pause", json={"reason": "incident 42"})
    assert r.status_code == 200 and r.json()["paused"] is True
    items = sample_items()
    assert client.post("/v1/events", json=items).status_code == 200

    # The other projections keep running while lexical is paused.
    snap = until(lambda: (p := projections(client))["lexical"]["lag_events"] == len(items)
                 and all(v["lag_events"] == 0 for n, v in p.items() if n != "lexical") and p)
    assert snap["lexical"]["paused"]
    text = client.get("/metrics").text
    assert metric(text, "memstream_projection_lag_events", projection="lexical") == len(items)
    assert metric(text, "memstream_projection_lag_events", projection="graph") == 0
    assert metric(text, "memstream_projection_paused", projection="lexical") == 1
    assert metric(text, "memstream_projection_lag_seconds", projection="lexical") > 0
    # Position frozen with lag > 0 over the (1 s) window: STALLED, in the snapshot and in /metrics.
    until(lambda: projections(client)["lexical"]["status"] == "STALLED")
    assert metric(client.get("/metrics").text, "memstream_projection_status", projection="lexical", status="STALLED") == 1

    # Nothing is searchable in every view yet: no freshness observed.
    assert metric(client.get("/metrics").text, "memstream_event_searchable_seconds_count") == 0

    r = client.post("/v1/admin/projections/lexical/resume")
    assert r.status_code == 200 and r.json()["paused"] is False
    until(lambda: projections(client)["lexical"]["lag_events"] == 0)
    until(lambda: projections(client)["lexical"]["status"] == "OK")
    text = client.get("/metrics").text
    assert metric(text, "memstream_projection_lag_events", projection="lexical") == 0
    assert metric(text, "memstream_projection_records_total", projection="lexical") == len(items)
    assert metric(text, "memstream_event_searchable_seconds_count") == len(items)
    assert metric(text, "memstream_projection_paused", projection="lexical") == 0


def test_query_latency_requests_and_unknown_projection(client):
    items = sample_items()
    body = client.post("/v1/events", json=items).json()
    assert client.post("/v1/wait", json={"positions": body["positions"], "timeout_seconds": 60}).json()["caught_up"] is True
    r = client.post("/v1/search", json={"question": "where did they go hiking?", "tenant_id": items[0]["tenant_id"]})
    assert r.status_code == 200, r.text
    assert client.post("/v1/admin/projections/nope/pause").status_code == 422  # the path names one of the four
    text = client.get("/metrics").text
    assert metric(text, "memstream_query_latency_seconds_count", strategy="zero-mem") == 1
    assert metric(text, "memstream_query_stage_seconds_count", strategy="zero-mem") >= 1
    assert metric(text, "memstream_http_requests_total", endpoint="/v1/search", method="POST", code="200") == 1
    assert metric(text, "memstream_http_requests_total", endpoint="/v1/admin/projections/{name}/pause", code="422") == 1
    snap = client.get("/v1/ops/snapshot").json()
    assert snap["queries"]["zero-mem"]["count"] == 1 and snap["history"]


def test_dead_letters_show_with_their_reason(client):

    from schemas.ports.event_log import NewRecord

    state = client.app.state.memstream
    # A foreign producer writes bytes that are not an event: every projection dead-letters them.
    client.portal.call(state.pipeline.log.append, state.pipeline.config.topic, [NewRecord(key="c1", value=b"\xff not json")])
    snap = until(lambda: (s := client.get("/v1/ops/snapshot").json())["dead_letters"]["pending"] == 1 and s)
    (entry,) = snap["dead_letters"]["recent"]
    assert "json" in entry["reason"].lower() or "utf-8" in entry["reason"].lower()
    # Each projection dead-letters the record on its own; one original record is pending replay.
    text = until(lambda: (t := client.get("/metrics").text) and metric(t, "memstream_projection_dead_letters_total") == 4 and t)
    assert metric(text, "memstream_dead_letters_pending") == 1
    assert "signin.js" in client.get("/dashboard").text  # no session yet: the sign-in page
    assert client.post("/dashboard/session", json={"token": client.admin_key["key"]}).status_code == 200
    html = client.get("/dashboard")
    assert html.status_code == 200 and "/dashboard/assets/dashboard.js" in html.text
    assert client.get("/dashboard/assets/dashboard.js").status_code == 200
    assert client.get("/dashboard/assets/..%2Fmetrics.py").status_code == 404
