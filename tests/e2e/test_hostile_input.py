"""Hostile and broken input at the HTTP edge, by class (each class a test; other inputs of the
same class are tried too): cross-site writes, input that used to cause 500s, poisoned stored
data, limits that apply while reading, and answers that always say what was committed."""

from __future__ import annotations

import json

import pytest

from infra.settings import Settings
from schemas.query import STRATEGIES
from tests.conftest import turn
from tests.e2e.helpers import api_client, bearer, make_key

pytestmark = pytest.mark.e2e


@pytest.fixture
def client(tmp_path, models):
    settings = Settings.load(data_dir=tmp_path / "hostile", api={"max_body_bytes": 300_000, "max_request_bytes": 20_000, "max_batch": 100})
    with api_client(settings, models) as c:
        c.settings = settings
        yield c


def ev(i, **over):
    return {**json.loads(turn(i).model_dump_json()), **over}


def error(resp, status, code=None):
    assert resp.status_code == status, resp.text
    body = resp.json()["error"]
    assert code is None or body["code"] == code
    return body


def test_cross_site_writes_are_refused(client):
    body = json.dumps([ev(0)])
    for ctype in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", ""):
        headers = {"content-type": ctype} if ctype else {}
        error(client.post("/v1/events", content=body, headers=headers), 415, "unsupported_media_type")
    tenant_forget = {"type": "ForgetRequested", "event_id": "f", "tenant_id": "t1", "requested_at": "2025-01-01T00:00:00Z",
                     "scope": {"level": "tenant"}}
    for origin in ("https://evil.example", "null", "http://testserver.evil"):
        error(client.post("/v1/events", json=tenant_forget, headers={"Origin": origin}), 403, "forbidden")
        error(client.post("/v1/admin/projections/graph/pause", json={}, headers={"Origin": origin}), 403)
    assert client.post("/v1/events", json=[ev(0)], headers={"Origin": "http://testserver"}).status_code == 200  # same origin
    assert "access-control-allow-origin" not in client.options("/v1/events", headers={
        "Origin": "https://evil.example", "Access-Control-Request-Method": "POST"}).headers
    assert client.get("/v1/status", headers={"Origin": "https://evil.example"}).status_code == 200  # reads carry no CORS grant


def test_configured_origins_get_cors(tmp_path, models):
    settings = Settings.load(data_dir=tmp_path / "cors", api={"cors_origins": ("https://app.example",)})
    with api_client(settings, models) as client:
        pre = client.options("/v1/search", headers={"Origin": "https://app.example", "Access-Control-Request-Method": "POST",
                                                    "Access-Control-Request-Headers": "authorization,content-type"})
        assert pre.headers["access-control-allow-origin"] == "https://app.example"
        r = client.post("/v1/events", json=[ev(0)], headers={"Origin": "https://app.example"})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "https://app.example"
        error(client.post("/v1/events", json=[ev(1)], headers={"Origin": "https://other.example"}), 403)


@pytest.mark.parametrize("raw, fragment", [
    (b"[" * 5000 + b"]" * 5000, "nested"),
    (b'{"events": ' + b"[" * 70 + b"]" * 70 + b"}", "nested"),
    (b'[{"turn_index": ' + b"1" * 4000 + b"}]", "digits"),
    (b'[{"turn_index": -' + b"9" * 50 + b"}]", "digits"),
    (b'[{"event_id": "\\ud800x"}]', "surrogate"),
    (b'[{"metadata": {"k": "\\udc00"}}]', "surrogate"),
    (b'[{"turn_index": NaN}]', "finite"),
    (b'[{"turn_index": Infinity}]', "finite"),
    (b'{"text": "\xc3\x28"}', "UTF-8"),
])
def test_input_that_used_to_500_is_a_400_with_the_reason(client, raw, fragment):
    for path in ("/v1/events", "/v1/search"):
        e = error(client.post(path, content=raw, headers={"content-type": "application/json"}), 400, "bad_request")
        assert fragment in e["message"] and "Traceback" not in json.dumps(e)
    ndjson = raw if not raw.startswith(b"[") else raw[1:-1]
    error(client.post("/v1/events", content=ndjson + b"\n", headers={"content-type": "application/x-ndjson"}), 400)


@pytest.mark.parametrize("when", ["9999-12-31T23:59:59-05:00", "0001-01-01T00:00:00+05:00", "0001-01-01T00:00:00Z",
                                  "9999-12-31T23:59:59Z", "1899-12-31T23:59:59Z", "2200-01-01T00:00:00Z", "2200-01-01T00:00:00+01:00",
                                  "1899-12-31T23:00:00-02:00"])
def test_timestamps_outside_the_range_are_field_errors(client, when):
    r = client.post("/v1/events", json=[ev(0, occurred_at=when), ev(1)])
    assert r.status_code == 207, r.text
    bad = r.json()["items"][0]
    assert bad["code"] == 422 and bad["errors"][0]["loc"] == ["occurred_at"] and "1900" in bad["errors"][0]["msg"]
    forget = {"type": "ForgetRequested", "event_id": "f", "tenant_id": "t1", "requested_at": when, "scope": {"level": "conversation", "conversation_id": "c1"}}
    assert client.post("/v1/events", json=[forget]).status_code == 422
    e = error(client.post("/v1/search", json={"question": "what happened last week?", "tenant_id": "t1", "as_of": when}), 422)
    assert e["code"] == "invalid_request"


def test_poisoned_stored_data_never_makes_a_search_fail(client, monkeypatch):
    """Turns stored before the occurred_at bound existed (written by an older release) at the
    ends of the calendar: every strategy still answers, relative dates included."""
    from datetime import datetime, timezone

    import schemas.rules as rules

    state = client.app.state.memstream
    monkeypatch.setattr(rules, "LOG_TIME_MIN", datetime.min.replace(tzinfo=timezone.utc))  # the old, unbounded rule
    monkeypatch.setattr(rules, "LOG_TIME_MAX", datetime.max.replace(tzinfo=timezone.utc))

    from schemas.events import encode_event
    from schemas.ports.event_log import NewRecord

    early = turn(0, text="the oldest memory of the kayak", conv="poison").model_copy(update={"occurred_at": datetime(1, 1, 1, tzinfo=timezone.utc)})
    late = turn(1, text="the newest memory of the kayak", conv="poison").model_copy(update={"occurred_at": datetime(9999, 12, 31, 23, 59, tzinfo=timezone.utc)})
    appended = client.portal.call(state.pipeline.log.append, state.settings.log.topic,
                                  [NewRecord(key="t1/poison", value=encode_event(e)) for e in (early, late)])
    positions = {a.partition: a.offset + 1 for a in appended}
    assert client.post("/v1/wait", json={"positions": positions, "timeout_seconds": 60}).status_code == 200
    monkeypatch.undo()
    for strategy in STRATEGIES:
        for question in ("what happened last week with the kayak?", "what is planned for next week?", "what about next month and next year?",
                         "when was the kayak trip?", "what did they do yesterday?",
                         "What happened in 2023?"):
            r = client.post("/v1/search", json={"question": question, "tenant_id": "t1", "conversation_id": "poison", "strategy": strategy})
            assert r.status_code == 200, (strategy, question, r.text)
            assert r.json()["evidence"]


def test_limits_apply_while_reading(client):
    """The edge stops reading a body as soon as it passes the limit (driven at the ASGI level:
    the test client would buffer the whole body before sending it)."""
    import asyncio

    from services.http_guard import EdgeGuard

    reached, sent, read = [], [], [0]

    async def app(scope, receive, send):
        reached.append(scope["path"])

    async def receive():
        read[0] += 1
        return {"type": "http.request", "body": b" " * 10_000, "more_body": read[0] < 1000}  # 10 MB in all

    async def send(message):
        sent.append(message)

    guard = EdgeGuard(app, body_limit=lambda path: 300_000, ndjson_paths=())
    scope = {"type": "http", "method": "POST", "path": "/v1/events", "headers": [(b"content-type", b"application/json"),
                                                                               (b"transfer-encoding", b"chunked")]}
    asyncio.run(guard(scope, receive, send))
    assert sent[0]["status"] == 413 and reached == [] and read[0] == 31  # 31 x 10 kB: just past the limit, then refused
    big_question = {"question": "x" * 30_000, "tenant_id": "t1"}
    error(client.post("/v1/search", json=big_question), 413, "too_large")  # /v1/search has its own (smaller) limit
    error(client.post("/v1/search", content=json.dumps(big_question).encode(), headers={"content-type": "application/json",
                                                                                      "content-length": "25"}), 413)
    error(client.post("/v1/wait", json={"positions": {"99": 1}}), 404, "not_found")  # a partition the topic lacks
    error(client.post("/v1/wait", json={"positions": {"-1": 1}}), 422)
    error(client.post("/v1/events", json=[ev(i) for i in range(101)]), 422, "invalid_request")  # past MEMSTREAM_API_MAX_BATCH


def test_internal_failures_say_nothing_of_the_internals(client, monkeypatch):
    state = client.app.state.memstream

    def broken(request):
        raise RuntimeError("SECRET-INTERNAL-DETAIL /srv/memstream/views")

    from fastapi.testclient import TestClient

    monkeypatch.setattr(state.query, "search", broken)
    quiet = TestClient(client.app, raise_server_exceptions=False, headers=dict(client.headers))  # the same running app
    r = quiet.post("/v1/search", json={"question": "anything", "tenant_id": "t1"}, headers={"X-Request-Id": "req-123"})
    e = error(r, 500, "internal_error")
    assert "SECRET" not in r.text and "RuntimeError" not in r.text and "/srv" not in r.text
    assert e["request_id"] == "req-123" and "req-123" in e["message"]


def test_a_failing_append_reports_exactly_what_was_committed(client, monkeypatch):
    """The log takes part of a batch and then fails: the answer marks the committed items
    accepted (with their positions) and the others failed, 503-retryable — never a bare 500."""
    from schemas.errors import TransientError
    from schemas.ports.event_log import AppendFailed

    state = client.app.state.memstream
    log = state.pipeline.log
    real = log.append

    async def half(topic, records):
        done = await real(topic, records[: len(records) // 2])
        raise AppendFailed(done + [None] * (len(records) - len(done)), TransientError("broker went away"))

    monkeypatch.setattr(log, "append", half)
    items = [ev(i, conversation_id="c1") for i in range(4)]
    r = client.post("/v1/events", json=items)
    assert r.status_code == 207, r.text
    body = r.json()
    assert [(i["status"], i["code"]) for i in body["items"]] == [("accepted", 200)] * 2 + [("failed", 503)] * 2
    monkeypatch.setattr(log, "append", real)
    end = client.portal.call(log.end_offsets, state.settings.log.topic)
    assert sum(end.values()) == 2 and body["positions"] == {str(p): o for p, o in end.items() if o}
    async def nothing(topic, records):
        raise AppendFailed([None] * len(records), TransientError("broker went away"))

    monkeypatch.setattr(log, "append", nothing)
    r = client.post("/v1/events", json=items)
    assert error(r, 503, "unavailable") and r.headers["retry-after"] == "1"


def test_another_tenants_key_cannot_use_hostile_input_to_escape_its_tenant(client):
    writer = make_key(client.settings, "writer", "t1")
    for raw in ([{**ev(0), "tenant_id": "t2"}], [{**ev(0), "tenant_id": ["t1"]}], [{**ev(0), "tenant_id": None}]):
        r = client.post("/v1/events", json=raw, headers=bearer(writer))
        assert r.status_code in (403, 422), r.text
    r = client.post("/v1/search", json={"question": "q", "tenant_id": "T1"}, headers=bearer(writer))
    assert r.status_code in (403, 422)


def test_ill_typed_type_and_version_are_item_errors_not_500s(client):
    """Found by fuzzing the decoders: an unhashable `type` or `schema_version` (a list, an
    object) raised TypeError, a 500 for the whole batch."""
    r = client.post("/v1/events", json=[{"type": []}, {**ev(0), "schema_version": [1]}, {**ev(1), "type": {"TurnRecorded": 1}}, ev(2)])
    assert r.status_code == 207, r.text
    items = r.json()["items"]
    assert [i["status"] for i in items] == ["rejected", "rejected", "rejected", "accepted"]
    assert items[0]["errors"][0]["loc"] == ["type"] and items[1]["errors"][0]["loc"] == ["schema_version"]


def test_a_content_length_of_other_digits_is_no_500():
    """str.isdigit() is True for '²' and other characters int() refuses: the edge raised ValueError
    on such a Content-Length (h11 and httptools refuse it before the app; other servers may not)."""
    import asyncio

    from services.http_guard import EdgeGuard

    reached, sent = [], []

    async def app(scope, receive, send):
        reached.append(scope["path"])

    async def receive():
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message):
        sent.append(message)

    for declared in ("²", "¹³", "1²"):  # headers are latin-1: these are the bytes b"\xb2", b"\xb9\xb3", b"1\xb2"
        scope = {"type": "http", "method": "POST", "path": "/v1/search",
                 "headers": [(b"content-type", b"application/json"), (b"content-length", declared.encode("latin-1"))]}
        asyncio.run(EdgeGuard(app, body_limit=lambda path: 1000, ndjson_paths=())(scope, receive, send))
    assert reached == ["/v1/search"] * 3 and sent == []  # the body is read and measured as sent, as without the header
