"""API keys, roles and tenants through the HTTP API (its ASGI app, projections running): who may
do what, what everyone else is told, and that a key change is enforced."""

from __future__ import annotations

import json
import time

import pytest

from infra.settings import Settings
from tests.conftest import turn
from tests.e2e.helpers import api_client, bearer, make_key, sample_items

pytestmark = pytest.mark.e2e


def ev(i, **over):
    return {**json.loads(turn(i).model_dump_json()), **over}


def forget(level="conversation", tenant="t1", **scope):
    return {"type": "ForgetRequested", "event_id": f"forget-{level}", "tenant_id": tenant, "requested_at": "2025-02-01T00:00:00Z",
            "scope": {"level": level, **({"conversation_id": "c1"} if level != "tenant" else {}), **scope}}


@pytest.fixture
def stack(tmp_path, models):
    settings = Settings.load(data_dir=tmp_path / "sec", ops={"token": "ops-token-for-tests-" + "x" * 20, "sample_seconds": 0.2})
    with api_client(settings, models, key=None) as client:
        keys = {name: make_key(settings, role, tenant, name) for name, role, tenant in (
            ("reader1", "reader", "t1"), ("writer1", "writer", "t1"), ("writer2", "writer", "t2"), ("reader2", "reader", "t2"))}
        keys["admin"] = client.admin_key
        yield client, keys, settings


def error(resp, status):
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"error"} and body["error"]["message"] and resp.headers.get("x-request-id")
    return body["error"]


def test_every_endpoint_but_the_open_ones_wants_a_key_and_says_the_same_401(stack):
    client, keys, _ = stack
    doc = client.get("/openapi.json").json()
    assert client.get("/healthz").status_code == 200
    assert client.get("/dashboard/assets/dashboard.js").status_code == 200
    bodies = set()
    for path, ops in doc["paths"].items():
        for method in ops:
            url = path.replace("{name}", "graph").replace("{key_id}", "0123456789abcdef")
            if path in ("/healthz", "/openapi.json", "/dashboard", "/dashboard/session", "/dashboard/assets/{name}"):
                continue
            for headers in ({}, bearer("msk_0123456789abcdef_" + "A" * 43), bearer("not-a-key"), {"Authorization": "Basic eDp5"}):
                for tenant in ("t1", "no-such-tenant"):
                    r = client.request(method.upper(), url, headers=headers, json={"tenant_id": tenant, "question": "q"})
                    e = error(r, 401)
                    assert r.headers["www-authenticate"].startswith("Bearer")
                    bodies.add((e["code"], e["message"]))
    assert len(bodies) == 1  # one answer for everything: nothing to learn about tenants or keys


def test_roles(stack):
    client, keys, _ = stack
    r1, w1, admin = bearer(keys["reader1"]), bearer(keys["writer1"]), bearer(keys["admin"])
    assert error(client.post("/v1/events", json=[ev(0)], headers=r1), 403)["code"] == "forbidden"
    published = client.post("/v1/events", json=[ev(0), ev(1)], headers=w1)
    assert published.status_code == 200, published.text
    assert client.post("/v1/wait", json={"positions": published.json()["positions"], "timeout_seconds": 60}, headers=r1).json()["caught_up"] is True
    found = client.post("/v1/search", json={"question": "topic 1"}, headers=r1)  # tenant defaults to the key's
    assert found.status_code == 200 and found.json()["evidence"]
    status = client.get("/v1/status", headers=r1).json()
    assert status["auth"] == {"mode": "api-keys", "key_id": keys["reader1"]["key_id"], "role": "reader", "tenant_id": "t1"}
    assert all(set(v) == {"view", "backend", "lag_events", "lag_seconds", "caught_up", "paused"} for v in status["views"])
    assert "positions" in client.get("/v1/status", headers=admin).json()["views"][0]
    for path in ("/v1/dead-letters", "/v1/admin/keys", "/metrics", "/v1/ops/snapshot"):
        for who in (r1, w1):
            error(client.get(path, headers=who), 403)
        assert client.get(path, headers=admin).status_code == 200
    for who in (r1, w1):
        error(client.post("/v1/admin/projections/graph/pause", headers=who), 403)
        error(client.post("/v1/admin/keys", json={"role": "admin"}, headers=who), 403)
    error(client.post("/v1/search", json={"question": "topic 1"}, headers=admin), 403)  # an admin key names the tenant
    assert client.post("/v1/search", json={"question": "topic 1", "tenant_id": "t1"}, headers=admin).status_code == 200


def test_tenants_are_bounded_per_request_and_per_batch_item(stack):
    client, keys, _ = stack
    w1, w2, r1 = bearer(keys["writer1"]), bearer(keys["writer2"]), bearer(keys["reader1"])
    error(client.post("/v1/search", json={"question": "topic", "tenant_id": "t2"}, headers=r1), 403)
    error(client.post("/v1/answer", json={"question": "topic", "tenant_id": "t2"}, headers=r1), 403)
    mixed = [ev(0), ev(1, tenant_id="t2"), {k: v for k, v in ev(2).items() if k != "tenant_id"}, ev(3, turn_index="x"),
             forget("tenant"), forget("conversation")]
    r = client.post("/v1/events", json=mixed, headers=w1)
    assert r.status_code == 207, r.text
    items = r.json()["items"]
    assert [(i["status"], i["code"]) for i in items] == [("accepted", 200), ("rejected", 403), ("accepted", 200), ("rejected", 422),
                                                         ("rejected", 403), ("accepted", 200)]
    assert items[1]["errors"][0]["type"] == "forbidden" and "t2" in items[1]["errors"][0]["msg"]
    assert "admin" in items[4]["errors"][0]["msg"]
    assert r.json()["accepted"] == 3
    only_foreign = client.post("/v1/events", json=[ev(5, tenant_id="t2"), ev(6, tenant_id="t3")], headers=w1)
    assert error(only_foreign, 403)["code"] == "forbidden"
    # what t1's writer published is t1's: t2's reader finds nothing of it, t1's reader does
    client.post("/v1/wait", json={"positions": r.json()["positions"], "timeout_seconds": 60}, headers=r1)
    other = client.post("/v1/events", json=[ev(0, text="kayak trip", event_id="t2-only", tenant_id="t2")], headers=w2)
    client.post("/v1/wait", json={"positions": other.json()["positions"], "timeout_seconds": 60}, headers=r1)
    mine = client.post("/v1/search", json={"question": "kayak trip", "strategy": "bm25"}, headers=bearer(keys["reader2"])).json()
    assert {t["event_id"] for e in mine["evidence"] for t in e["turns"]} == {"t2-only"}


def test_metrics_and_the_dashboard_take_the_ops_token_and_a_session_cookie(stack):
    client, keys, settings = stack
    ops = settings.ops.token.get_secret_value()
    assert client.get("/metrics", headers=bearer(ops)).status_code == 200
    assert client.get("/v1/ops/snapshot", headers=bearer(ops)).status_code == 200
    error(client.post("/v1/search", json={"question": "x", "tenant_id": "t1"}, headers=bearer(ops)), 401)  # ops token is no API key
    assert "signin.js" in client.get("/dashboard").text
    error(client.post("/dashboard/session", json={"token": "wrong"}), 401)
    error(client.post("/dashboard/session", json={"token": keys["reader1"]["key"]}), 401)  # only ops token or admin keys
    signed = client.post("/dashboard/session", json={"token": ops})
    assert signed.status_code == 200
    cookie = signed.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict") and "Path=/" in cookie
    assert "dashboard.js" in client.get("/dashboard").text
    assert client.get("/v1/ops/snapshot").status_code == 200
    error(client.get("/metrics"), 401)  # the session opens the dashboard and its snapshot; /metrics takes a bearer
    error(client.post("/v1/admin/projections/graph/pause"), 401)  # the cookie reads; it changes nothing
    value = client.cookies.get("memstream_session")
    client.cookies.clear()
    expiry, subject, session_id, signature = value.split(".")
    for forged in (f"{expiry}.{subject}.{session_id}.{signature[:-1]}{'0' if signature[-1] != '0' else '1'}",  # the signature
                   f"{int(expiry) + 10**6}.{subject}.{session_id}.{signature}",  # a later expiry
                   f"{expiry}.{keys['admin']['key_id']}.{session_id}.{signature}",  # another subject
                   f"{expiry}.{subject}.{'0' * 32}.{signature}"):  # another session
        error(client.get("/v1/ops/snapshot", cookies={"memstream_session": forged}), 401)
    assert "signin.js" in client.get("/dashboard").text
    # signed in with an admin key, the session ends with the key
    assert client.post("/dashboard/session", json={"token": keys["admin"]["key"]}).status_code == 200
    assert client.get("/v1/ops/snapshot").status_code == 200
    spare = make_key(settings, "admin", name="spare")
    revoked = client.post(f"/v1/admin/keys/{keys['admin']['key_id']}/revoke", headers=bearer(spare))
    assert revoked.status_code == 200
    client.post("/v1/wait", json={"control_offset": revoked.json()["control_offset"]}, headers=bearer(spare))
    error(client.get("/v1/ops/snapshot"), 401)


def test_signing_out_ends_the_session_on_the_server(stack, tmp_path, models):
    """The old cookie stops working once the browser signs out — here and on another replica of
    the same deployment (its own app and key ring over the same log) — and sign-out clears the
    cookie with the attributes sign-in set."""
    client, keys, settings = stack
    ops = settings.ops.token.get_secret_value()
    client.cookies.clear()
    assert client.post("/dashboard/session", json={"token": ops}).status_code == 200
    cookie = client.cookies.get("memstream_session")
    with api_client(settings, models, key=None, process=False) as replica:
        assert replica.get("/v1/ops/snapshot", cookies={"memstream_session": cookie}).status_code == 200
        out = client.delete("/dashboard/session")
        assert out.status_code == 200 and out.json() == {"signed_in": False}
        cleared = out.headers["set-cookie"]
        assert "SameSite=strict" in cleared.replace("Strict", "strict") and "HttpOnly" in cleared and "Max-Age=0" in cleared
        error(client.get("/v1/ops/snapshot", cookies={"memstream_session": cookie}), 401)
        time.sleep(settings.api.key_refresh_seconds * 2)  # the bound every replica applies a control-topic record within
        error(replica.get("/v1/ops/snapshot", cookies={"memstream_session": cookie}), 401)
        assert "signin.js" in replica.get("/dashboard", cookies={"memstream_session": cookie}).text
    client.cookies.clear()


def test_keys_over_http_create_rotate_revoke_and_every_change_is_enforced_after_wait(stack):
    client, keys, _ = stack
    admin = bearer(keys["admin"])
    made = client.post("/v1/admin/keys", json={"role": "writer", "tenant_id": "t7", "name": "agent-7"}, headers=admin)
    assert made.status_code == 201
    new = made.json()
    assert set(new) >= {"key", "key_id", "tenant_id", "role", "control_offset"} and new["key"].startswith("msk_")
    listing = client.get("/v1/admin/keys", headers=admin).json()["keys"]
    assert new["key_id"] in {k["key_id"] for k in listing} and all("key" not in k and "secret_sha256" not in k for k in listing)
    assert new["key"] not in json.dumps(listing)
    assert client.post("/v1/events", json=[ev(0, tenant_id="t7")], headers=bearer(new)).status_code == 200
    rotated = client.post(f"/v1/admin/keys/{new['key_id']}/rotate", json={"grace_seconds": 3600}, headers=admin).json()
    assert rotated["key"] != new["key"] and rotated["previous_secret_valid_until"]
    for k in (new, rotated):  # both work during the grace period
        assert client.get("/v1/status", headers=bearer(k)).status_code == 200
    again = client.post(f"/v1/admin/keys/{new['key_id']}/rotate", json={"grace_seconds": 0}, headers=admin).json()
    client.post("/v1/wait", json={"control_offset": again["control_offset"]}, headers=admin)
    error(client.get("/v1/status", headers=bearer(rotated)), 401)
    assert client.get("/v1/status", headers=bearer(again)).status_code == 200
    gone = client.post(f"/v1/admin/keys/{new['key_id']}/revoke", headers=admin).json()
    assert client.post("/v1/wait", json={"control_offset": gone["control_offset"], "timeout_seconds": 10}, headers=admin).json()["caught_up"] is True
    error(client.get("/v1/status", headers=bearer(again)), 401)
    error(client.post("/v1/admin/keys/ffffffffffffffff/revoke", headers=admin), 404)
    error(client.post("/v1/admin/keys", json={"role": "writer"}, headers=admin), 422)  # a writer key needs a tenant


def test_rate_limits_answer_429_with_retry_after(tmp_path, models):
    settings = Settings.load(data_dir=tmp_path / "rl", api={"rate_limit_per_second": 0.5, "rate_limit_burst": 3})
    with api_client(settings, models) as client:
        codes = [client.get("/v1/status").status_code for _ in range(4)]
        assert codes == [200, 200, 200, 429]
        r = client.get("/v1/status")
        assert error(r, 429)["code"] == "rate_limited" and int(r.headers["retry-after"]) >= 1
        other = make_key(settings, "reader", "t1")
        assert client.get("/v1/status", headers=bearer(other)).status_code == 200  # per key


def test_no_key_no_start_and_insecure_only_on_loopback(tmp_path, models):
    from fastapi.testclient import TestClient

    from schemas.errors import ConfigurationError
    from services.api import create_app
    from tests.e2e.helpers import registry_with

    settings = Settings.load(data_dir=tmp_path / "nokey")
    with pytest.raises(ConfigurationError, match="memstream keys create"):
        with TestClient(create_app(settings, registry=registry_with(settings, models))):
            pass
    with pytest.raises(ConfigurationError, match="loopback"):
        create_app(Settings.load(data_dir=tmp_path / "x", api={"host": "0.0.0.0"}), insecure=True)
    with TestClient(create_app(settings, registry=registry_with(settings, models), insecure=True)) as client:
        status = client.get("/v1/status").json()
        assert status["auth"]["mode"] == "insecure-no-auth"
        assert client.get("/v1/ops/snapshot").json()["auth_mode"] == "insecure-no-auth"
        assert client.post("/v1/events", json=sample_items()).status_code == 200
