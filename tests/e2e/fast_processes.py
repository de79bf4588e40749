"""Shared by the fault tests (crash recovery, replay under load): a ~300-turn synthetic subset,
`memstream` run in real processes on the declared fast model path (hashing encoder, lexicon NER:
infra/models/fast.py), and canonical dumps of an embedded data directory's live views."""

from __future__ import annotations

import os
import random
import sqlite3
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

from schemas.ports.views import VIEW_NAMES

BIN = Path(sys.executable).with_name("memstream")
FAST = {"MEMSTREAM_ENCODER_MODEL": "hashing", "MEMSTREAM_NER_MODEL": "lexicon", "MEMSTREAM_RUNNER_BATCH_SIZE": "16",
        "MEMSTREAM_RUNNER_RETIRE_GRACE_SECONDS": "0", "MEMSTREAM_LOG_PARTITIONS": "2"}
NAMES = ["Ada", "Bo", "Grace", "Linus", "Mira", "Tomás"]
PLACES = ["Lisbon", "Akureyri", "Porto Alegre", "Kyoto", "Nairobi"]


def subset() -> list[dict]:
    """300 turns in 4 conversations of 3 sessions, a late turn, and forgets in the middle (a turn
    and a session), so that batches need several steps."""
    t0 = datetime(2026, 3, 1, 9, 0, tzinfo=timezone.utc)
    rng = random.Random(7)
    items: list[dict] = []
    for c in range(4):
        for s in range(3):
            for i in range(25):
                who = NAMES[(c + i) % len(NAMES)]
                text = (f"{who} talked about {rng.choice(PLACES)} and {rng.choice(NAMES)}'s plan for the {rng.choice(['ferry', 'hike', 'concert', 'market'])} "
                        f"on day {s * 25 + i}; it was {rng.choice(['rainy', 'sunny', 'windy'])}.")
                items.append({"type": "TurnRecorded", "event_id": f"c{c}-s{s}-{i}", "tenant_id": "crash", "conversation_id": f"conv-{c}",
                              "session_id": f"s{s}", "agent_id": f"agent-{i % 2}", "turn_index": i, "speaker": who, "text": text,
                              "occurred_at": (t0 + timedelta(days=s, minutes=i + 30 * c)).isoformat()})
    late = items.pop(10)  # published last: its session is re-derived
    items.append(late)
    forget_turn = {"type": "ForgetRequested", "event_id": "forget-turn", "tenant_id": "crash", "requested_at": "2026-06-01T00:00:00Z",
                   "scope": {"level": "turn", "conversation_id": "conv-1", "event_id": "c1-s0-3"}}
    forget_session = {"type": "ForgetRequested", "event_id": "forget-session", "tenant_id": "crash", "requested_at": "2026-06-01T00:00:00Z",
                      "scope": {"level": "session", "conversation_id": "conv-2", "session_id": "s1"}}
    items.insert(120, forget_turn)
    items.insert(230, forget_session)
    return items


def env(data: Path, fault: str | None = None) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith(("MEMSTREAM_LOG_", "MEMSTREAM_VIEWS_", "MEMSTREAM_FAULT"))}
    out.update(FAST, MEMSTREAM_DATA_DIR=str(data))
    if fault:
        out["MEMSTREAM_FAULT"] = fault
    return out


def cli(data: Path, *args: str, fault: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run([str(BIN), *args], env=env(data, fault), capture_output=True, text=True, timeout=600)
    if check:
        assert out.returncode == 0, f"memstream {' '.join(args)} failed ({out.returncode}):\n{out.stderr[-3000:]}"
    return out


def positions(data: Path) -> dict[str, dict[int, int]]:
    """Each view's live generation's positions, read from its SQLite file (what a restart resumes from)."""
    if not (data / "views" / "catalog.sqlite").exists():
        return {view: {} for view in VIEW_NAMES}
    catalog = sqlite3.connect(data / "views" / "catalog.sqlite")
    try:
        live = dict(catalog.execute("SELECT view, generation FROM generations WHERE state='live'").fetchall())
    except sqlite3.OperationalError:  # the catalog being created this instant
        return {view: {} for view in VIEW_NAMES}
    finally:
        catalog.close()
    files = {"hierarchy": "units.sqlite", "lexical": "ledger.sqlite", "dense": "vectors.sqlite", "graph": "graph.sqlite"}
    out = {}
    for view in VIEW_NAMES:
        path = data / "views" / view / f"gen-{live.get(view, 1)}" / files[view]
        if not path.exists():
            out[view] = {}
            continue
        c = sqlite3.connect(path)
        try:
            out[view] = dict(c.execute("SELECT partition, next_offset FROM positions").fetchall())
        except sqlite3.OperationalError:  # a store being created this instant
            out[view] = {}
        finally:
            c.close()
    return out


def total(pos: dict[int, int]) -> int:
    return sum(pos.values())


def dumps(data: Path) -> dict:
    from infra.registry import Registry
    from infra.settings import Settings

    registry = Registry(Settings.load(data_dir=data))
    out = {}
    for view in VIEW_NAMES:
        store = registry.open_view(view, registry.catalog().current(view))
        try:
            out[view] = store.canonical_dump()
        finally:
            store.close()
    return out




def fresh_build(data: Path, dest: Path) -> dict:
    """Dumps of views built from scratch on a copy of `data`'s log (and data keys)."""
    import shutil

    dest.mkdir()
    for f in data.glob("*.sqlite*"):
        shutil.copy(f, dest / f.name)
    cli(dest, "process", "--until-caught-up")
    return dumps(dest)
