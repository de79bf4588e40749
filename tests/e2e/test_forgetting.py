"""Forgetting reaches every byte, embedded: a canary planted in forgotten turns (text, attachment,
metadata) is found by a byte-level scan of every file of the data directory before the forget and
nowhere after it — nor the destroyed keys' bytes — and still nowhere after a replay of every view,
after `dlq replay`, and after the forgotten event is published again (refused: a forgotten id
is refused forever). Every other conversation's data is untouched (dumps compared with a pipeline
that never saw the forgotten one)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from infra.settings import Settings
from schemas.ports.keystore import key_id
from schemas.ports.views import VIEW_NAMES
from tests.canary import key_needles, new_canary, open_everything, scan
from tests.conftest import turn
from tests.e2e.helpers import api_client, assert_same_views, bearer, make_key, make_pipeline, publish, strip_positions

pytestmark = pytest.mark.e2e
BIN = Path(sys.executable).with_name("memstream")


def conversation(conv: str, canary: str | None, tenant: str = "t1", agent: str = "agent-a", n: int = 8, session: str = "s1") -> list[dict]:
    """A short conversation; with a canary, one turn carries it in its text, an attachment and its metadata."""
    items = []
    for i in range(n):
        text = f"turn {i} of {conv}: they talk about the ferry to the island and the weather on day {i}"
        extra = {}
        if canary and i == 3:
            text = f"the secret code word is {canary} and nobody else may know it"
            extra = {"attachments": [{"kind": "image_caption", "text": f"a note reading {canary}"}], "metadata": {"note": canary}}
        items.append(json.loads(turn(i, conv=conv, tenant=tenant, session=session, agent=agent, text=text, **extra).model_dump_json()))
    return items


def log_records(client) -> list:
    state = client.app.state.memstream
    log, topic = state.pipeline.log, state.settings.log.topic

    async def read():
        out = []
        for t in (topic, state.settings.dlq_topic):
            for p, end in (await log.end_offsets(t)).items():
                out.extend(await log.read(t, p, 0, max_records=end + 1))
        return out

    return client.portal.call(read)


def wait(client, body: dict) -> None:
    r = client.post("/v1/wait", json={**body, "timeout_seconds": 120})
    assert r.json().get("caught_up") is True, r.text


@pytest.fixture
def stack(tmp_path, models):
    settings = Settings.load(data_dir=tmp_path / "forget")
    with api_client(settings, models) as client:
        client.settings = settings
        yield client


def test_a_forgotten_conversation_leaves_no_byte_behind_and_stays_forgotten(stack, tmp_path, models):
    client, data = stack, stack.settings.data_dir
    canary = new_canary("c")
    victim, kept = conversation("victim", canary), conversation("kept", None)
    r = client.post("/v1/events", json=victim + kept)
    assert r.status_code == 200, r.text
    wait(client, {"positions": r.json()["positions"]})
    state = client.app.state.memstream
    keys = state.pipeline.keystore.get([key_id("t1", "victim", e["event_id"]) for e in victim])
    assert len(keys) == len(victim)
    secrets_ = [k.secret for k in keys.values()]
    assert scan([data], [canary.encode()]), "positive control: the scan must see the canary before the forget"
    assert scan([data], key_needles(secrets_)), "positive control: the scan must see the data keys before the forget"
    found = client.post("/v1/search", json={"question": "what is the secret code word?", "tenant_id": "t1", "conversation_id": "victim"})
    assert canary in found.text

    forget = client.post("/v1/forget", json={"tenant_id": "t1", "conversation_id": "victim", "reason": "the user asked"})
    assert forget.status_code == 202, forget.text
    wait(client, {"positions": forget.json()["positions"]})

    def assert_gone(when: str) -> None:
        assert scan([data], [canary.encode()]) == [], f"canary on disk {when}"
        assert scan([data], key_needles(secrets_)) == [], f"destroyed key bytes on disk {when}"
        assert open_everything(log_records(client), state.pipeline.keystore, [canary]) == [], f"a record still opens to the canary {when}"
        for strategy in ("zero-mem", "bm25", "dense"):
            r = client.post("/v1/search", json={"question": f"secret code word {canary}", "tenant_id": "t1", "strategy": strategy})
            assert r.status_code in (200, 404) and canary not in r.text, (when, strategy)

    assert_gone("after the forget")
    # the same event id again: refused, never resurrected
    again = client.post("/v1/events", json=[victim[3]])
    assert again.status_code == 409 and again.json()["error"]["details"][0]["code"] == 409, again.text
    # (without the forgotten turn's attachment and metadata, which carry the canary)
    new = {**{k: v for k, v in victim[3].items() if k not in ("attachments", "metadata")}, "event_id": "victim-new-turn",
           "text": "a new turn after the forget, about the ferry"}
    fresh = client.post("/v1/events", json=[new])  # a new id in the forgotten conversation is new memory
    assert fresh.status_code == 200, fresh.text
    wait(client, {"positions": fresh.json()["positions"]})
    assert_gone("after re-publishing")
    # replay every view, then dlq replay: nothing comes back
    for view in VIEW_NAMES:
        client.portal.call(state.pipeline.replay, view)
    assert_gone("after a replay")
    out = subprocess.run([str(BIN), "dlq", "replay"], env={**__import__("os").environ, "MEMSTREAM_DATA_DIR": str(data)},
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert_gone("after dlq replay")
    hits = client.post("/v1/search", json={"question": "a new turn after the forget", "tenant_id": "t1", "conversation_id": "victim"}).json()
    assert {t["event_id"] for e in hits["evidence"] for t in e["turns"]} == {"victim-new-turn"}

    # what survives (the other conversation, and the new turn) is exactly what a pipeline that
    # never saw the forgotten turns holds
    async def never_saw_it():
        p, _ = make_pipeline(tmp_path / "never", models)
        await p.start()
        try:
            await publish(p, kept + [new])
            await p.process_until_caught_up()
            return {v: p.store(v).canonical_dump() for v in VIEW_NAMES}
        finally:
            await p.close()

    reference = asyncio.run(never_saw_it())
    ours = {v: state.views.store(v).canonical_dump() for v in VIEW_NAMES}
    assert_same_views(strip_positions(ours), strip_positions(reference))


@pytest.mark.parametrize("scope", ["turn", "session", "agent", "before"])
def test_partial_scopes_forget_exactly_their_turns(stack, scope):
    client, data = stack, stack.settings.data_dir
    canary = new_canary(scope[:2])
    items = conversation("c1", canary, agent="agent-a") + conversation("c2", None, agent="agent-b")
    if scope == "agent":  # the canary turn is agent-a's; agent-a also speaks in c2
        items[11]["agent_id"] = "agent-a"
    r = client.post("/v1/events", json=items)
    wait(client, {"positions": r.json()["positions"]})
    assert scan([data], [canary.encode()])
    body = {"turn": {"conversation_id": "c1", "event_id": items[3]["event_id"]}, "session": {"conversation_id": "c1", "session_id": "s1"},
            "agent": {"agent_id": "agent-a"}, "before": {"occurred_before": items[4]["occurred_at"]}}[scope]
    f = client.post("/v1/forget", json={"tenant_id": "t1", **body})
    assert f.status_code == 202, f.text
    wait(client, {"positions": f.json()["positions"]})
    assert scan([data], [canary.encode()]) == []
    left = {t["event_id"] for t in client.app.state.memstream.views.store("hierarchy").canonical_dump()["turns"]}
    gone = {"turn": {items[3]["event_id"]}, "session": {i["event_id"] for i in items[:8]},
            "agent": {i["event_id"] for i in items if i["agent_id"] == "agent-a"},
            "before": {i["event_id"] for i in items if i["occurred_at"] < items[4]["occurred_at"]}}[scope]
    assert left == {i["event_id"] for i in items} - gone


def test_forgetting_is_authorised_like_events(tmp_path, models):
    settings = Settings.load(data_dir=tmp_path / "authz")
    with api_client(settings, models) as client:
        writer, reader, other = make_key(settings, "writer", "t1"), make_key(settings, "reader", "t1"), make_key(settings, "writer", "t2")
        assert client.post("/v1/forget", json={"conversation_id": "c1"}, headers=bearer(reader)).status_code == 403
        assert client.post("/v1/forget", json={"conversation_id": "c1", "tenant_id": "t1"}, headers=bearer(other)).status_code == 403
        assert client.post("/v1/forget", json={}, headers=bearer(writer)).status_code == 403  # a whole tenant: admin only
        assert client.post("/v1/forget", json={}, headers=bearer(client.admin_key)).status_code == 403  # admin names the tenant
        assert client.post("/v1/forget", json={"tenant_id": "t1"}, headers=bearer(client.admin_key)).status_code == 202
        assert client.post("/v1/forget", json={"conversation_id": "c1"}, headers=bearer(writer)).status_code == 202
        bad = client.post("/v1/forget", json={"agent_id": "a", "conversation_id": "c1"}, headers=bearer(writer))
        assert bad.status_code == 422
        tenant_wide = {"type": "ForgetRequested", "event_id": "f-x", "tenant_id": "t1", "requested_at": "2026-01-01T00:00:00Z",
                       "scope": {"level": "tenant"}}
        assert client.post("/v1/events", json=[tenant_wide], headers=bearer(writer)).status_code == 403
