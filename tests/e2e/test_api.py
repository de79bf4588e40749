"""The HTTP API, driven through its ASGI app with the in-process projections running.

Bad input gets a clear error in one body shape, and valid items of a batch are never lost
because another item was invalid."""

from __future__ import annotations

import json

import pytest

from infra.settings import Settings
from schemas.ports.views import Boundary
from tests.conftest import turn
from tests.e2e.helpers import api_client, sample_items

pytestmark = pytest.mark.e2e


@pytest.fixture
def client(tmp_path, models):
    settings = Settings.load(data_dir=tmp_path / "api", api={"max_batch": 50, "max_body_bytes": 200_000})
    with api_client(settings, models) as c:
        yield c


def ev(i, **over):
    return {**json.loads(turn(i).model_dump_json()), **over}


def assert_error(resp, status, code):
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"error"} and body["error"]["code"] == code and body["error"]["message"]
    return body["error"]


def test_publish_then_read_your_writes(client):
    r = client.post("/v1/events", json={"events": sample_items()})
    assert r.status_code == 200
    body = r.json()
    assert body["accepted"] == 15 and body["rejected"] == 0
    assert [i["offset"] for i in body["items"]] == list(range(15))
    w = client.post("/v1/wait", json={"positions": body["positions"], "timeout_seconds": 60})
    assert w.status_code == 200, w.text
    views = client.get("/v1/status").json()["views"]
    assert {v["view"] for v in views} == {"hierarchy", "graph", "lexical", "dense"}
    assert all(v["lag_events"] == 0 for v in views)


def test_json_lines_are_accepted(client):
    body = "\n".join(json.dumps(ev(i)) for i in range(3)) + "\n"
    r = client.post("/v1/events", content=body.encode(), headers={"content-type": "application/x-ndjson"})
    assert r.status_code == 200 and r.json()["accepted"] == 3


def test_partial_batch_keeps_valid_items_and_names_bad_fields(client):
    items = [ev(0), ev(1, turn_index="x"), ev(2), {**ev(3), "text": "y" * 40_000}, ev(4, occurred_at="yesterday")]
    r = client.post("/v1/events", json=items)
    assert r.status_code == 207
    body = r.json()
    assert [i["status"] for i in body["items"]] == ["accepted", "rejected", "accepted", "rejected", "rejected"]
    assert body["items"][1]["errors"][0]["loc"] == ["turn_index"]
    assert body["items"][3]["errors"][0]["loc"] == ["text"] and "32000" in body["items"][3]["errors"][0]["msg"]
    assert body["items"][4]["event_id"] == "c1-s1-4" and body["items"][4]["errors"][0]["loc"] == ["occurred_at"]
    client.post("/v1/wait", json={"positions": body["positions"], "timeout_seconds": 60})
    status = {v["view"]: v for v in client.get("/v1/status").json()["views"]}
    assert sum(status["hierarchy"]["positions"].values()) == 2  # exactly the two valid events


def test_nothing_valid_is_a_422_with_every_item_explained(client):
    details = assert_error(client.post("/v1/events", json=[{"type": "TurnRecorded"}, {"nope": 1}]), 422, "invalid_event")["details"]
    assert [d["index"] for d in details] == [0, 1]
    assert any(e["loc"] == ["event_id"] for e in details[0]["errors"])
    assert "type" in json.dumps(details[1]["errors"])


def test_malformed_bodies_are_rejected_with_the_reason(client):
    assert "not valid JSON" in assert_error(client.post("/v1/events", content=b'{"events": [', headers={"content-type": "application/json"}), 400, "bad_request")["message"]
    assert "UTF-8" in assert_error(client.post("/v1/events", content=b'{"text": "\xff"}', headers={"content-type": "application/json"}), 400, "bad_request")["message"]
    assert_error(client.post("/v1/events", json=[]), 400, "bad_request")
    assert_error(client.post("/v1/events", json={"events": "x"}), 400, "bad_request")
    assert_error(client.post("/v1/events", json=[ev(i) for i in range(51)]), 422, "invalid_request")  # the document's maxItems
    assert_error(client.post("/v1/events", content=b"[" + b" " * 200_001 + b"]", headers={"content-type": "application/json"}), 413, "too_large")
    assert_error(client.get("/v1/nothing-here"), 404, "not_found")
    assert_error(client.post("/v1/wait", json={"positions": "soon"}), 422, "invalid_request")


def test_duplicate_event_ids_are_harmless(client):
    r = client.post("/v1/events", json=[ev(0), ev(0), ev(1)])
    assert r.status_code == 200
    client.post("/v1/wait", json={"positions": r.json()["positions"], "timeout_seconds": 60})
    r2 = client.post("/v1/events", json=[ev(0)])
    client.post("/v1/wait", json={"positions": r2.json()["positions"], "timeout_seconds": 60})
    turns = client.app.state.memstream.views.store("hierarchy").list_units(Boundary("t1"), "turn")
    assert len(turns) == 2
    assert client.get("/v1/dead-letters").json()["dead_letters"] == []


def test_openapi_document_describes_the_api(client):
    doc = client.get("/openapi.json").json()
    assert {"/v1/events", "/v1/wait", "/v1/status", "/v1/dead-letters"} <= set(doc["paths"])
    assert {"Event", "TurnRecorded", "ForgetRequested"} <= set(doc["components"]["schemas"])
