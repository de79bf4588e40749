"""The rules the OpenAPI document states, one by one, as a third-party client meets them: strict
JSON types and closed bodies at the edge, one rule for every identifier, forged cursors on every
listing, a forget missing an id it needs, and records already on a log that predate the rules
(they keep decoding). The schemathesis run (test_api_fuzz.py) covers the whole document; these
name each rule's cases."""

from __future__ import annotations

import base64
import json

import pytest

from infra.settings import Settings
from schemas.events import decode_event
from tests.conftest import turn
from tests.e2e.helpers import api_client

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def client(tmp_path_factory, models):
    settings = Settings.load(data_dir=tmp_path_factory.mktemp("contract") / "data")
    with api_client(settings, models) as c:
        yield c


def ev(i: int, **over) -> dict:
    return {**json.loads(turn(i, conv="contract").model_dump_json()), **over}


_probes = iter(range(10**6))


def item(client, **over) -> dict:
    """The outcome of publishing one turn with `over` (a fresh event id unless `over` names one)."""
    r = client.post("/v1/events", json=[ev(0, **{"event_id": f"probe-{next(_probes)}", **over})])
    assert r.status_code in (200, 422), r.text
    return r.json()["items"][0] if r.status_code == 200 else r.json()["error"]["details"][0]


@pytest.mark.parametrize("field, value", [
    ("turn_index", True), ("turn_index", "5"), ("turn_index", 1.5), ("schema_version", "1"),
    ("occurred_at", 1700000000), ("occurred_at", "2024-05-01T09:30:00"), ("occurred_at", "2024-05-01"),
    ("event_id", "a/b"), ("event_id", "x/history"), ("event_id", "nul\x00"), ("event_id", "bell\x07"), ("event_id", "esc\x1b[31m"),
    ("event_id", "bidi\u202eevil"), ("event_id", " padded"), ("conversation_id", "a/b"), ("session_id", "tab\there"),
    ("agent_id", "x\u2066y"), ("speaker", "A\x1b[2J"), ("speaker", "right\u202eleft"), ("unknown_field", 1),
])
def test_a_loose_or_unsafe_event_field_is_refused_by_name(client, field, value):
    got = item(client, **{field: value})
    assert got["status"] == "rejected" and got["code"] == 422, got
    assert [e["loc"][0] for e in got["errors"]] == [field], got


@pytest.mark.parametrize("field, value", [("event_id", "conv-26:D1:3"), ("conversation_id", "Ünïcode conversation"),
                                          ("turn_index", 3.0), ("occurred_at", "2024-05-01T09:30:00+05:30")])
def test_ids_and_numbers_a_producer_may_send_are_accepted(client, field, value):
    assert item(client, **{field: value})["status"] == "accepted"


def test_unknown_fields_of_a_request_body_are_a_422_naming_them(client):
    made = client.post("/v1/admin/keys", json={"role": "writer", "tenant_id": "t1"}).json()
    for path, body, unknown in ((f"/v1/admin/keys/{made['key_id']}/rotate", {"grace_hours": 0}, "grace_hours"),
                                ("/v1/search", {"question": "x", "tenant_id": "t1", "conversationId": "c"}, "conversationId"),
                                ("/v1/wait", {"positions": {}, "timeout": 1}, "timeout"),
                                ("/v1/forget", {"tenant_id": "t1", "conversation": "c"}, "conversation")):
        r = client.post(path, json=body)
        assert r.status_code == 422, (path, r.text)
        assert unknown in r.json()["error"]["message"] and any(d["loc"][-1] == unknown for d in r.json()["error"]["details"])


@pytest.mark.parametrize("body", [{"positions": {}, "timeout_seconds": False}, {"positions": {"x": 1}}, {"positions": {"0": -1}},
                                  {"positions": {"0": "5"}}, {"control_offset": True}])
def test_a_wait_with_a_loose_type_is_a_422(client, body):
    assert client.post("/v1/wait", json=body).status_code == 422


def test_times_are_rfc3339_with_an_offset_everywhere(client):
    for since in (0, 0.5, "1700000000", "2024-05-01T09:30:00"):
        r = client.post("/v1/search", json={"question": "x", "tenant_id": "t1", "since": since})
        assert r.status_code == 422 and r.json()["error"]["details"][0]["loc"] == ["body", "since"], r.text
    assert client.get("/v1/admin/audit", params={"since": "0.5"}).status_code == 422
    assert client.get("/v1/admin/audit", params={"since": "2026-01-01T00:00:00Z"}).status_code == 200


def _b64(value) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")


FORGED = [_b64(v) for v in ([253402300800000000, "t"], [1e23, "t"], [-1e23, "t"], [2**63, "t"], [-(2**63), "t"],
                            [-6.2135596800000001e16, "t"], [1e38, "t"])] + ["", "!!!", "0" * 5000, "1:2:3:4", "9" * 17 + ":t_" + "0" * 20]
LISTINGS = [("/v1/turns", {"tenant_id": "t1"}), ("/v1/admin/keys", {}), ("/v1/dead-letters", {}), ("/v1/admin/audit", {})]


@pytest.mark.parametrize("path, params", LISTINGS)
def test_a_forged_cursor_is_a_400_or_a_position_never_a_5xx(client, path, params):
    for cursor in FORGED:
        r = client.get(path, params={**params, "cursor": cursor})
        assert r.status_code in (400, 422), (cursor[:40], r.status_code, r.text[:300])
    extremes = {"/v1/turns": ["-9999999999999999:t_" + "0" * 20, "9999999999999999:t_" + "f" * 20],
                "/v1/admin/keys": ["0" * 16, "f" * 16], "/v1/dead-letters": ["x:0:0", "memstream.events:999999999:9999999999999999"],
                "/v1/admin/audit": ["0", "9999999999999999"]}[path]
    for cursor in extremes:  # every string the pattern allows is a position
        r = client.get(path, params={**params, "cursor": cursor})
        assert r.status_code == 200, (cursor, r.text[:300])


def test_listings_page_with_the_cursors_they_give_out(client):
    items = [ev(i, event_id=f"page-{i}") for i in range(5)]
    w = client.post("/v1/events", json=items).json()
    assert client.post("/v1/wait", json={"positions": w["positions"], "timeout_seconds": 60}).json()["caught_up"] is True
    seen, cursor = [], None
    while True:
        page = client.get("/v1/turns", params={"tenant_id": "t1", "conversation_id": "contract", "limit": 2,
                                               **({"cursor": cursor} if cursor else {})}).json()
        seen += [t["event_id"] for t in page["turns"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert {f"page-{i}" for i in range(5)} <= set(seen) and len(seen) == len(set(seen))


def test_a_forget_missing_an_id_it_needs_says_which(client):
    for body, field in (({"tenant_id": "t1", "event_id": "e1"}, "conversation_id"), ({"tenant_id": "t1", "session_id": "s"}, "conversation_id"),
                        ({"tenant_id": "t1", "agent_id": "a", "conversation_id": "c"}, "conversation_id")):
        r = client.post("/v1/forget", json=body)
        assert r.status_code == 422, r.text
        error = r.json()["error"]
        assert field in error["message"] and error["details"][0]["loc"] == ["body", field], error


def test_a_wait_that_runs_out_answers_and_says_why(client):
    r = client.post("/v1/wait", json={"positions": {"0": 10**9}, "timeout_seconds": 0.05})
    assert r.status_code == 200 and r.json()["caught_up"] is False and "did not reach" in r.json()["reason"]
    assert r.headers["x-request-id"]


def test_records_already_on_a_log_keep_decoding_under_the_older_rules():
    """The edge's rules are new: a record a log holds from before them (an id with '/', a speaker
    with a control character, an integer beyond 2^53 in its metadata, a time written in 1899 at an
    offset that puts it in 1900 UTC) still decodes — replay never loses it."""
    raw = {**ev(0), "event_id": "legacy/id", "speaker": "Old\x07Bot", "metadata": {"n": 2**60},
           "occurred_at": "1899-12-31T23:30:00-01:00"}
    event = decode_event(json.dumps(raw).encode())
    assert event.event_id == "legacy/id" and event.metadata["n"] == 2**60
    with pytest.raises(Exception):
        decode_event(json.dumps(raw).encode(), edge=True)


def test_a_key_name_with_control_characters_is_refused(client):
    r = client.post("/v1/admin/keys", json={"role": "admin", "name": "ops\x1b[31m"})
    assert r.status_code == 422 and r.json()["error"]["details"][0]["loc"][-1] == "name"
