"""Retention, export and the audit trail, end to end with the real models (embedded):

- export: GET /v1/export and `memstream export` give the raw turns still held (a forgotten one
  left out, a duplicate once, log order), only to the tenant's writer or an admin naming the
  tenant; `memstream ingest jsonl` re-imports the file into a fresh data directory, where the
  hierarchy view equals the tenant's part of the original;
- the audit trail: key changes, forgets with their completion (who, scope, when, partitions,
  keys destroyed) and exports, paged with a cursor over GET /v1/admin/audit, the same as
  `memstream audit --json`, admins only, and no memory text in it after the data is gone;
- retention: `memstream tenants set T --retain-days N` makes the pipeline forget T's old turns by
  itself (and a late old turn later), never the recent ones or another tenant's, and the ops
  snapshot, /metrics and `memstream tenants list` show the setting and the last sweep;
- pending forgets and the request -> complete time on /v1/ops/snapshot and /metrics: a forget
  waits for a paused view, and completes once it resumes.
"""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timedelta, timezone

import pytest

from infra.settings import Settings
from services.cli import main
from tests.canary import new_canary
from tests.conftest import T0, turn
from tests.e2e.helpers import api_client, bearer, make_key, make_pipeline, metric_sum, strip_positions, until

pytestmark = pytest.mark.e2e


def items_of(*turns) -> list[dict]:
    return [json.loads(t.model_dump_json()) for t in turns]


def wait(client, positions: dict, **extra) -> None:
    r = client.post("/v1/wait", json={"positions": positions, "timeout_seconds": 120, **extra})
    assert r.status_code == 200, r.text


def everything_waited(client) -> None:
    """Every view and the eraser at the event topic's end as it is now."""
    state = client.app.state.memstream
    end = client.portal.call(state.pipeline.log.end_offsets, state.settings.log.topic)
    wait(client, {str(p): off for p, off in end.items()})


def tenant_part(dump: dict, tenant: str) -> dict:
    """The hierarchy view's canonical dump restricted to one tenant, without log positions."""
    return strip_positions({"turns": [t for t in dump["turns"] if t["tenant"] == tenant],
                            "units": [u for u in dump["units"] if u["provenance"]["tenant_id"] == tenant]})


def run_cli(capsys, *argv) -> str:
    capsys.readouterr()
    assert main(list(argv)) == 0
    return capsys.readouterr().out


def test_export_gives_the_turns_still_held_and_ingest_jsonl_reimports_them(tmp_path, models, capsysbinary):
    settings = Settings.load(data_dir=tmp_path / "a")
    canary = new_canary("exp")
    c1 = [turn(i, conv="c1", tenant="t1", text=f"turn {i} of the first talk about the ferry timetable") for i in range(7)]
    c1[3] = turn(3, conv="c1", tenant="t1", text=f"my locker code is {canary}")
    c2 = [turn(i, conv="c2", tenant="t1", session="s2", speaker="Bob", text=f"turn {i} about the garden and tomatoes") for i in range(5)]
    other = [turn(i, conv="c1", tenant="t2", text=f"another tenant's turn {i}") for i in range(3)]
    with api_client(settings, models) as client:
        writer, reader = make_key(settings, "writer", "t1"), make_key(settings, "reader", "t1")
        stranger = make_key(settings, "writer", "t2")
        r = client.post("/v1/events", json=items_of(*c1, *c2, *other, c2[1]))  # c2's second turn twice: exported once
        assert r.status_code == 200, r.text
        wait(client, r.json()["positions"])
        f = client.post("/v1/forget", json={"conversation_id": "c1", "event_id": c1[3].event_id}, headers=bearer(writer))
        assert f.status_code == 202, f.text
        wait(client, f.json()["positions"])

        exported = client.get("/v1/export", headers=bearer(writer))
        assert exported.status_code == 200, exported.text
        assert exported.headers["content-type"].startswith("application/x-ndjson")
        events = [json.loads(line) for line in exported.text.splitlines()]
        position = {(e["tenant_id"], e["event_id"]): (i["partition"], i["offset"]) for e, i in zip(items_of(*c1, *c2, *other), r.json()["items"])}
        expected = sorted((t for t in c1 + c2 if t.event_id != c1[3].event_id), key=lambda t: position["t1", t.event_id])
        assert [e["event_id"] for e in events] == [t.event_id for t in expected], "log order, each event once, the forgotten one left out"
        assert events == items_of(*expected), "the raw events, field for field"
        assert canary not in exported.text
        only_c2 = client.get("/v1/export", params={"conversation_id": "c2"}, headers=bearer(writer))
        assert [json.loads(line)["event_id"] for line in only_c2.text.splitlines()] == [t.event_id for t in c2]
        odd = client.get("/v1/export", params={"conversation_id": "Ā-talk"}, headers=bearer(writer))  # found by the API fuzz
        assert odd.status_code == 200 and odd.text == "" and odd.headers["content-disposition"] == 'attachment; filename="memstream-t1-_-talk.jsonl"'
        assert client.get("/v1/export", params={"tenant_id": "t1"}).text == exported.text  # an admin names the tenant
        assert client.get("/v1/export").status_code == 403  # ... and must
        assert client.get("/v1/export", headers=bearer(reader)).status_code == 403
        assert client.get("/v1/export", params={"tenant_id": "t1"}, headers=bearer(stranger)).status_code == 403
        original = tenant_part(client.app.state.memstream.views.store("hierarchy").canonical_dump(), "t1")

    # The CLI gives the same bytes; `memstream ingest jsonl` re-imports them into a fresh data directory.
    capsysbinary.readouterr()
    assert main(["--data-dir", str(settings.data_dir), "export", "--tenant", "t1"]) == 0
    cli_export = capsysbinary.readouterr().out
    assert cli_export.decode() == exported.text
    path = tmp_path / "t1.jsonl"
    path.write_bytes(cli_export)
    fresh = tmp_path / "b"
    assert main(["--data-dir", str(fresh), "ingest", "jsonl", str(path)]) == 0
    assert b"appended 11 events" in capsysbinary.readouterr().out

    async def rebuilt():
        pipeline, _ = make_pipeline(fresh, models)
        await pipeline.start()
        try:
            await pipeline.process_until_caught_up()
            return pipeline.store("hierarchy").canonical_dump()
        finally:
            await pipeline.close()

    assert tenant_part(asyncio.run(rebuilt()), "t1") == original, "the re-imported memory is the same memory"

    # Every export is in the audit trail: who, which tenant and conversation, how many turns.
    assert main(["--data-dir", str(settings.data_dir), "audit", "--json", "--tenant", "t1"]) == 0
    exports = [e for e in json.loads(capsysbinary.readouterr().out) if e["kind"] == "export"]
    assert [(e["by"].split(":")[0], e["conversation_id"], e["turns"], e["complete"]) for e in exports] == [
        ("key", None, 11, True), ("key", "c2", 5, True), ("key", "Ā-talk", 0, True), ("key", None, 11, True), ("cli", None, 11, True)]
    assert exports[0]["by"] == f"key:{writer['key_id']}"


def test_the_audit_trail_records_key_changes_forgets_and_completion_for_admins_only(tmp_path, models, capsys):
    settings = Settings.load(data_dir=tmp_path / "audit")
    canary = new_canary("aud")
    talk = [turn(i, conv="secret-talk", tenant="t1", text=f"turn {i}: the ferry leaves at nine") for i in range(6)]
    talk[2] = turn(2, conv="secret-talk", tenant="t1", text=f"the safe opens with {canary}")
    elsewhere = [turn(i, conv=f"other-{i}", tenant="t1", agent="agent-b", text=f"elsewhere {i}") for i in range(4)]
    with api_client(settings, models) as client:
        admin_id = client.admin_key["key_id"]
        bystander = make_key(settings, "writer", "t1", name="bystander")
        writer = client.post("/v1/admin/keys", json={"role": "writer", "tenant_id": "t1", "name": "agent-7"}).json()
        rotated = client.post(f"/v1/admin/keys/{writer['key_id']}/rotate", json={"grace_seconds": 0}).json()
        r = client.post("/v1/events", json=items_of(*talk, *elsewhere))
        wait(client, r.json()["positions"])
        f1 = client.post("/v1/forget", json={"conversation_id": "secret-talk", "reason": f"asked to forget {canary}"},
                         headers=bearer(rotated["key"]))
        assert f1.status_code == 202, f1.text
        f2 = client.post("/v1/forget", json={"tenant_id": "t1", "agent_id": "agent-b"})
        assert f2.status_code == 202, f2.text
        wait(client, {**f1.json()["positions"], **f2.json()["positions"]})
        revoked = client.post(f"/v1/admin/keys/{writer['key_id']}/revoke").json()

        pages, cursor = [], None
        while True:
            page = client.get("/v1/admin/audit", params={"limit": 2, **({"cursor": cursor} if cursor else {})})
            assert page.status_code == 200, page.text
            pages.append(page.json()["entries"])
            cursor = page.json()["next_cursor"]
            if cursor is None:
                break
        entries = [e for p in pages for e in p]
        assert all(len(p) <= 2 for p in pages) and len(pages) == -(-len(entries) // 2)
        whole = client.get("/v1/admin/audit", params={"limit": 1000}).json()
        assert whole["entries"] == entries and whole["next_cursor"] is None
        t1 = client.get("/v1/admin/audit", params={"tenant_id": "t1"}).json()["entries"]
        assert client.get("/v1/admin/audit", headers=bearer(bystander)).status_code == 403
        assert client.get("/v1/admin/audit", params={"cursor": "not-a-cursor"}).status_code == 422
        later = client.get("/v1/admin/audit", params={"since": "2199-01-01T00:00:00Z"}).json()["entries"]

    summary = [(e["kind"], e["action"], e.get("key_id") or e.get("forget_id"), e["by"]) for e in entries]
    assert summary[:4] == [("key", "created", admin_id, ""), ("key", "created", bystander["key_id"], ""),
                           ("key", "created", writer["key_id"], f"key:{admin_id}"), ("key", "rotated", writer["key_id"], f"key:{admin_id}")]
    assert entries[2]["role"] == "writer" and entries[2]["tenant_id"] == "t1" and entries[2]["name"] == "agent-7"
    assert summary[-1] == ("key", "revoked", writer["key_id"], f"key:{admin_id}")
    assert entries[-1]["control_offset"] == revoked["control_offset"]
    forgets = {e["forget_id"]: e for e in entries if e["kind"] == "forget"}
    conv, agent = forgets[f1.json()["forget_id"]], forgets[f2.json()["forget_id"]]
    assert conv["by"] == f"key:{writer['key_id']}" and conv["scope"] == {"level": "conversation", "conversation_id": "secret-talk"}
    assert conv["complete"] and conv["partitions"] == conv["partitions_complete"] == 1 and conv["keys_destroyed"] == 6
    assert agent["by"] == f"key:{admin_id}" and agent["scope"] == {"level": "agent", "agent_id": "agent-b"}
    assert agent["complete"] and agent["partitions"] == agent["partitions_complete"] == settings.log.partitions
    assert agent["keys_destroyed"] == 4
    for e in (conv, agent):
        assert datetime.fromisoformat(e["requested_at"]) <= datetime.fromisoformat(e["completed_at"]) and e["seconds"] >= 0
    assert canary not in json.dumps(entries), "no memory text (nor a reason quoting it) in the trail"
    assert {e["tenant_id"] for e in t1} == {"t1"} and len(t1) == len([e for e in entries if e["tenant_id"] == "t1"])
    assert later == []
    # `memstream audit --json` reads the same trail from the control topic.
    cli = json.loads(run_cli(capsys, "--data-dir", str(settings.data_dir), "audit", "--json"))
    assert cli == entries
    text = run_cli(capsys, "--data-dir", str(settings.data_dir), "audit", "--tenant", "t1")
    assert f"{f1.json()['forget_id']} conversation conversation_id=secret-talk: complete after" in text


def test_retention_forgets_a_tenants_old_turns_by_itself_and_the_ops_page_shows_it(tmp_path, models, capsys):
    settings = Settings.load(data_dir=tmp_path / "retention", retention={"sweep_seconds": 0.2}, ops={"sample_seconds": 0.2})
    now = datetime.now(timezone.utc)
    recent = (now - timedelta(days=2) - T0).total_seconds() / 60  # turn()'s minutes after T0 (2025-01-06, long ago)
    old = [turn(i, conv="old", tenant="r1", text=f"an old turn {i} about the harbour") for i in range(6)]
    fresh = [turn(i, conv="new", tenant="r1", minutes=recent + i, text=f"a recent turn {i} about the market") for i in range(4)]
    others = [turn(i, conv="old", tenant="r2", text=f"another tenant's old turn {i}") for i in range(3)]
    with api_client(settings, models) as client:
        r = client.post("/v1/events", json=items_of(*old, *fresh, *others))
        wait(client, r.json()["positions"])
        out = run_cli(capsys, "--data-dir", str(settings.data_dir), "tenants", "set", "r1", "--retain-days", "30")
        assert "more than 30 days ago are forgotten automatically" in out

        def sweeps(n: int):
            entries = client.get("/v1/admin/audit", params={"tenant_id": "r1"}).json()["entries"]
            done = [e for e in entries if e["kind"] == "forget" and e["by"] == "retention"]
            return done if len(done) >= n and all(e["complete"] for e in done) else None

        [first] = until(lambda: sweeps(1), "a retention forget, complete")
        everything_waited(client)
        held = lambda: {t["event_id"] for t in client.app.state.memstream.views.store("hierarchy").canonical_dump()["turns"]}  # noqa: E731
        assert held() == {t.event_id for t in fresh + others}, "only r1's turns older than 30 days are forgotten"
        assert first["scope"]["level"] == "tenant" and first["partitions_complete"] == settings.log.partitions
        cutoff = datetime.fromisoformat(first["scope"]["occurred_before"])
        assert now - timedelta(days=30) <= cutoff <= datetime.now(timezone.utc) - timedelta(days=30)
        assert first["keys_destroyed"] == len(old)

        # A late turn from long ago is forgotten by a later sweep; nothing is requested in between.
        late = turn(9, conv="new", tenant="r1", minutes=5, text="a late turn that happened long ago")
        r = client.post("/v1/events", json=items_of(late))
        wait(client, r.json()["positions"])
        done = until(lambda: sweeps(2), "a second retention forget, complete")
        assert len(done) == 2 and done[1]["keys_destroyed"] == 1, "one request per batch of old turns, no pointless repeats"
        everything_waited(client)
        assert held() == {t.event_id for t in fresh + others}
        exported = client.get("/v1/export", params={"tenant_id": "r1"}).text
        assert [json.loads(line)["event_id"] for line in exported.splitlines()] == [t.event_id for t in fresh]

        def shown():
            snap = client.get("/v1/ops/snapshot").json()["forgetting"]
            rows = {row["tenant_id"]: row for row in snap["retention"]}
            sweep = rows.get("r1", {}).get("last_sweep")
            return (snap, rows) if sweep and sweep["forget_id"] == done[1]["forget_id"] and sweep["complete"] else None

        snap, rows = until(shown, "the snapshot to show r1's last sweep")
        assert set(rows) == {"r1"} and rows["r1"]["retain_days"] == 30 and snap["pending"] == 0
        metrics = client.get("/metrics").text
        assert metric_sum(metrics, "memstream_tenant_retention_days", tenant="r1") == 30
        assert metric_sum(metrics, "memstream_retention_last_sweep_timestamp_seconds", tenant="r1") == pytest.approx(
            datetime.fromisoformat(done[1]["requested_at"]).timestamp())
        script = client.get("/dashboard/assets/dashboard.js").text
        assert client.post("/dashboard/session", json={"token": client.admin_key["key"]}).status_code == 200
        assert "renderForgetting(snap.forgetting)" in script and 'id="retention"' in client.get("/dashboard").text

    listing = {row["tenant_id"]: row for row in json.loads(run_cli(capsys, "--data-dir", str(settings.data_dir), "tenants", "list", "--json"))}
    assert listing["r1"]["retain_days"] == 30 and listing["r1"]["last_sweep"]["forget_id"] == done[1]["forget_id"]
    assert "r2" not in listing, "a tenant the control topic never names (no key, setting, forget or export) is not listed"
    cleared = run_cli(capsys, "--data-dir", str(settings.data_dir), "tenants", "set", "r1", "--retain-days", "0")
    assert "retention cleared" in cleared
    listing = {row["tenant_id"]: row for row in json.loads(run_cli(capsys, "--data-dir", str(settings.data_dir), "tenants", "list", "--json"))}
    assert listing["r1"]["retain_days"] is None


def test_a_forget_is_pending_until_every_view_is_past_it(tmp_path, models):
    settings = Settings.load(data_dir=tmp_path / "pending", ops={"sample_seconds": 0.2})
    with api_client(settings, models) as client:
        r = client.post("/v1/events", json=items_of(*(turn(i, conv="c1", tenant="t1") for i in range(5))))
        wait(client, r.json()["positions"])
        assert client.post("/v1/admin/projections/lexical/pause").status_code == 200
        f = client.post("/v1/forget", json={"tenant_id": "t1", "conversation_id": "c1"})
        forget_id, [(partition, _)] = f.json()["forget_id"], f.json()["positions"].items()

        def pending(n: int):
            snap = client.get("/v1/ops/snapshot").json()["forgetting"]
            return snap if snap["pending"] == n else None

        snap = until(lambda: pending(1), "the forget to be pending")
        [request] = snap["pending_requests"]
        assert request["forget_id"] == forget_id and request["level"] == "conversation" and request["partitions_pending"] == [int(partition)]
        assert request["requested_by"] == f"key:{client.admin_key['key_id']}"
        # The eraser completed it (the audit trail says so), but a view has not: still pending.
        until(lambda: any(e.get("forget_id") == forget_id and e["complete"]
                          for e in client.get("/v1/admin/audit").json()["entries"]), "the eraser's completion")
        assert until(lambda: pending(1), "still pending")["pending_requests"][0]["forget_id"] == forget_id
        metrics = client.get("/metrics").text
        assert metric_sum(metrics, "memstream_forgets_pending") == 1
        assert metric_sum(metrics, "memstream_forget_complete_seconds_count") == 0

        assert client.post("/v1/admin/projections/lexical/resume").status_code == 200
        wait(client, f.json()["positions"])
        snap = until(lambda: pending(0), "the forget to complete")
        assert snap["completed"]["count"] == 1 and snap["pending_requests"] == []
        metrics = client.get("/metrics").text
        assert metric_sum(metrics, "memstream_forgets_pending") == 0
        assert metric_sum(metrics, "memstream_forget_complete_seconds_count") == 1
        assert metric_sum(metrics, "memstream_forget_oldest_pending_seconds") == 0
