"""`memstream backup` while `memstream serve` runs and ingest goes on, then `memstream restore`:
the restored views are exactly what a rebuild of the restored log gives, and a forget made after
the backup is re-applied — its canary is in no file of the data directory and opens from no
record (fast model path; real processes)."""

from __future__ import annotations

import json
import shutil
import threading

import pytest

from memstream_client import Client
from tests.canary import new_canary, scan
from tests.e2e.helpers import assert_same_views
from tests.e2e.fast_processes import FAST, cli, dumps, env, subset
from tests.integration import servers

pytestmark = pytest.mark.e2e


def _victim(canary: str) -> list[dict]:
    return [{"type": "TurnRecorded", "event_id": f"v{i}", "tenant_id": "crash", "conversation_id": "victim", "session_id": "s1",
             "agent_id": "agent-v", "turn_index": i, "speaker": "Vera", "occurred_at": f"2026-04-01T10:0{i}:00+00:00",
             "text": f"the vault code is {canary}" if i == 2 else f"turn {i} about the vault"} for i in range(5)]


def test_a_backup_taken_while_serving_restores_whole_and_a_later_forget_stays_forgotten(tmp_path):
    canary = new_canary("b")
    data, backup_dir = tmp_path / "data", tmp_path / "backup"
    events = tmp_path / "events.jsonl"
    events.write_text("".join(json.dumps(e) + "\n" for e in subset()[:150] + _victim(canary)))
    cli(data, "ingest", "jsonl", str(events))
    with servers.memstream_serve(tmp_path, data_dir=data, env=FAST) as served:
        writer = servers.cli_key(data, "writer", "crash", env=env(data))["key"]
        with Client(served.url, writer) as ms:
            ms.wait({0: 0}, 60)  # the key is enforced
            more = subset()[150:]
            stop = threading.Event()

            def keep_writing():  # ingest goes on during the backup
                for i in range(0, len(more), 10):
                    if stop.is_set():
                        return
                    ms.add([e for e in more[i:i + 10] if e["type"] == "TurnRecorded"])

            writer_thread = threading.Thread(target=keep_writing)
            writer_thread.start()
            made = cli(data, "backup", str(backup_dir), "--json")
            stop.set()
            writer_thread.join()
            manifest = json.loads(made.stdout)
            assert set(manifest["views"]) == {"hierarchy", "lexical", "dense", "graph"}
            assert scan([backup_dir], [canary.encode()]), "positive control: the backup holds the canary"
            forgot = ms.forget(conversation_id="victim")
            assert ms.wait(forgot.positions, 120)
        assert scan([data], [canary.encode()]) == []
    out = cli(data, "restore", str(backup_dir))
    assert "5 forgotten turns made since are forgotten again" in out.stdout, out.stdout
    replaced = [p for p in tmp_path.iterdir() if p.name.startswith("data.replaced-")]
    assert len(replaced) == 1  # the replaced directory is kept, never deleted
    cli(data, "process", "--until-caught-up")
    assert scan([data], [canary.encode()]) == [], "a forgotten turn came back from the backup"
    ours = dumps(data)
    assert not [t for v in ours.values() for t in v["turns"] if t["conversation"] == "victim"]
    # the restored views are what a rebuild of the restored log gives
    rebuilt = tmp_path / "rebuilt"
    shutil.copytree(data, rebuilt)
    cli(rebuilt, "replay", "--projection", "all")
    assert_same_views(dumps(rebuilt), ours)


def test_restore_refuses_while_a_process_runs_and_backup_refuses_a_used_directory(tmp_path):
    data = tmp_path / "data"
    events = tmp_path / "events.jsonl"
    events.write_text("".join(json.dumps(e) + "\n" for e in subset()[:40]))
    cli(data, "ingest", "jsonl", str(events), "--process")
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "x").write_text("x")
    refused = cli(data, "backup", str(tmp_path / "used"), check=False)
    assert refused.returncode == 2 and "not empty" in refused.stderr
    cli(data, "backup", str(tmp_path / "b"))
    with servers.memstream_serve(tmp_path, data_dir=data, env=FAST):
        busy = cli(data, "restore", str(tmp_path / "b"), check=False)
        assert busy.returncode == 2 and "stop serve" in busy.stderr
