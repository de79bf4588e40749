"""Forgetting, shared by the port suites: a dataset that every scope level cuts differently, the
reference rule (`ForgetScope.covers`), change sets built the way the projections build them (a
partial scope recomputes the sessions it touches from the turns left), canaries, and byte scans
of a store's files.

Each suite gives a `Model` of its projection (how a session's turns become a change set) and
its adapters; `check_scope` and `check_canary` are the two contract tests every suite runs:

- `check_scope`: after a forget, the store's ledger and `turns_in_scope` agree with `covers()`
  turn by turn, and the store's canonical dump equals the dump of a store of the same adapter
  that was only ever given the surviving turns;
- `check_canary`: a unique token in forgotten turns' text and speaker is found by a raw scan of
  the store's files before the forget (for stores that erase; stores that keep no plaintext must
  never hold it, and a probe written in plain through the engine proves the scan sees their
  files) and in no file after it (deferred erasure polled until the store says it is done);
  what survives equals a store that never saw the forgotten turns.
"""

from __future__ import annotations

import os
import secrets
import time
from collections import defaultdict
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Callable

import pytest

from schemas.events import ForgetScope
from schemas.ordering import order_turns
from schemas.ports.views import Forget, TurnRow
from tests.contracts.builders import T0, row

# -- the dataset ----------------------------------------------------------------------------------
TENANT = "t1"  # every forget is asked by t1; t2 shares every id and must never lose anything


def dataset() -> list[TurnRow]:
    """Two tenants x two conversations x two sessions x four turns; agents alternate (a1, a2).
    Session s2 starts at +100 min, its second turn half a second later (sub-second times)."""
    rows = []
    for tenant in ("t1", "t2"):
        for conv in ("c1", "c2"):
            for session, base in (("s1", 0.0), ("s2", 100.0)):
                for i in range(4):
                    minutes = base + (0.5 / 60 if i == 1 and session == "s2" else 10 * i)
                    rows.append(row(i, f"{conv} {session} turn {i} about topic{i % 3}", tenant=tenant, conv=conv, session=session,
                                    agent="a1" if i % 2 == 0 else "a2", minutes=minutes))
    return rows


def _at(minutes: float, seconds: float = 0.0):
    return T0 + timedelta(minutes=minutes, seconds=seconds)


SCOPES: dict[str, ForgetScope] = {
    "tenant": ForgetScope(level="tenant"),
    "conversation": ForgetScope(level="conversation", conversation_id="c1"),
    "session": ForgetScope(level="session", conversation_id="c1", session_id="s2"),
    "turn": ForgetScope(level="turn", conversation_id="c1", event_id="c1-s1-1"),
    "agent": ForgetScope(level="agent", agent_id="a2"),
    # retention: strictly before; s2's first turn (at +100 min) goes, its second (+100 min 0.5 s) stays
    "tenant-before": ForgetScope(level="tenant", occurred_before=_at(100, 0.25)),
    # an agent's old turns; the one exactly at the limit (a1 at +120 min) stays
    "agent-before": ForgetScope(level="agent", agent_id="a1", occurred_before=_at(120)),
    "session-before": ForgetScope(level="session", conversation_id="c2", session_id="s1", occurred_before=_at(20)),
}


def covered(scope: ForgetScope, rows: list[TurnRow], tenant: str = TENANT) -> set[str]:
    """Turn ids the reference rule puts inside the scope."""
    return {r.turn_id for r in rows
            if scope.covers(r.tenant_id, r.conversation_id, r.session_id, r.event_id, r.agent_id, r.occurred_at, tenant)}


def sessions(rows: list[TurnRow]) -> dict[tuple[str, str, str], list[TurnRow]]:
    out: dict[tuple[str, str, str], list[TurnRow]] = defaultdict(list)
    for r in rows:
        out[r.session_key].append(r)
    return {k: order_turns(v) for k, v in sorted(out.items())}


# -- how a projection builds change sets ----------------------------------------------------------
@dataclass
class Model:
    """A port's projection in miniature: `new_change()` and `session_change(change, key, before,
    after, added)` as in streams/projections (pure functions of the turns)."""

    new_change: Callable
    session_change: Callable
    finish: Callable = lambda store, change: None


_OFFSET = iter(range(1, 10**9))


def write(store, model: Model, rows: list[TurnRow]) -> None:
    """Put `rows` as new turns (one change set), the way `_turns_change` does."""
    change = model.new_change()
    change.put_turns.extend(rows)
    for key, added in sessions(rows).items():
        before = store.session_turns(*key)
        model.session_change(change, key, before, order_turns(before + added), added)
    model.finish(store, change)
    store.apply(change, {0: next(_OFFSET)})


def forget(store, model: Model, scope: ForgetScope, tenant: str = TENANT) -> None:
    """Apply a forget the way `_forget_change` does: the store drops the scope; a partial scope's
    sessions are recomputed from the turns left."""
    f = Forget(tenant, scope)
    change = model.new_change()
    change.forgets.append(f)
    if scope.partial:
        gone: dict[tuple[str, str, str], set[str]] = defaultdict(set)
        for t in store.turns_in_scope(f):
            gone[t.session_key].add(t.turn_id)
        for key in sorted(gone):
            before = store.session_turns(*key)
            model.session_change(change, key, before, [t for t in before if t.turn_id not in gone[key]], [])
    model.finish(store, change)
    store.apply(change, {0: next(_OFFSET)})


def ledger_ids(store, rows: list[TurnRow]) -> set[str]:
    """Turn ids of `rows` the store's ledger still holds."""
    found = set()
    by_conv: dict[tuple[str, str], list[str]] = defaultdict(list)
    for r in rows:
        by_conv[(r.tenant_id, r.conversation_id)].append(r.event_id)
    for (tenant, conv), events in by_conv.items():
        found |= {t.turn_id for t in store.find_turns(tenant, conv, events).values()}
    return found


def assert_same_dump(a, b, atol: float = 1e-6, path: str = "dump") -> None:
    """Canonical dumps equal, floats within `atol` (Qdrant re-normalises vectors: an upserted
    point's vector may differ from a fresh one's in the last float32 bit)."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), f"{path}: keys differ: {set(a) ^ set(b)}"
        for k in a:
            assert_same_dump(a[k], b[k], atol, f"{path}.{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), f"{path}: lengths differ ({len(a)} vs {len(b)})"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_dump(x, y, atol, f"{path}[{i}]")
    elif isinstance(a, float) and isinstance(b, float):
        assert abs(a - b) <= atol, f"{path}: {a} != {b}"
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def check_scope(store, make_reference: Callable[[], object], model: Model, name: str) -> None:
    """What remains after forgetting `SCOPES[name]` is exactly what `covers()` says."""
    rows, scope = dataset(), SCOPES[name]
    gone = covered(scope, rows)
    assert gone and gone != {r.turn_id for r in rows}, "the scope must cut the dataset"
    write(store, model, rows)
    assert {t.turn_id for t in store.turns_in_scope(Forget(TENANT, scope))} == gone  # the store's own rule
    forget(store, model, scope)
    survivors = [r for r in rows if r.turn_id not in gone]
    assert ledger_ids(store, rows) == {r.turn_id for r in survivors}
    assert store.turns_in_scope(Forget(TENANT, scope)) == []
    reference = make_reference()
    write(reference, model, survivors)
    assert_same_dump(store.canonical_dump(), reference.canonical_dump())


# -- canaries and byte scans -----------------------------------------------------------------------
_RARE = "ghjkmnpqvwxyz"  # no hex digit (ids are hex) and few English 4-grams


def canary() -> str:
    """One lowercase alphanumeric token (tokenizers keep it whole), unique per call: `zq`, twelve
    random letters, `canary`."""
    return "zq" + "".join(secrets.choice(_RARE) for _ in range(12)) + "canary"


def core(token: str) -> str:
    """What a scan looks for: the canary without its common suffix. LZ4 (tantivy's doc store,
    Lucene's stored fields) writes the first occurrence of new bytes as a literal, but encodes a
    repeat of anything it has seen — the suffix `canary` of a second canary, any 4 bytes matching
    an id — as a back-reference, so only the random core is reliably contiguous; and a scan for
    less is stricter after the forget."""
    return token.removesuffix("canary")


def _extents(fh, size: int):
    """(start, end) of the regions of a file that hold data: sparse files (Qdrant and Neo4j
    preallocate tens of MB) have holes, which read as zeros and hold nothing."""
    fd, pos = fh.fileno(), 0
    while pos < size:
        try:
            start = os.lseek(fd, pos, os.SEEK_DATA)
            end = os.lseek(fd, start, os.SEEK_HOLE)
        except OSError:  # no data after pos (ENXIO), or the filesystem cannot tell: read the rest
            if pos == 0:
                yield 0, size
            return
        yield start, end
        pos = end


def scan(root: Path, needles: list[str], chunk: int = 8 << 20) -> dict[str, list[str]]:
    """Which files under `root` contain each needle, read as raw bytes (`grep -a`), never through
    the engine. Files that vanish while being read (an engine rotating its logs) are skipped."""
    raw = {n.encode(): n for n in needles}
    longest = max(map(len, raw))
    found: dict[str, list[str]] = {n: [] for n in needles}
    for directory, _, files in os.walk(root):
        for f in files:
            path = Path(directory) / f
            hit: set[str] = set()
            try:
                with open(path, "rb") as fh:
                    for start, end in _extents(fh, os.fstat(fh.fileno()).st_size):
                        fh.seek(start)
                        tail, left = b"", end - start
                        while left > 0 and (block := fh.read(min(chunk, left))):
                            left -= len(block)
                            data = tail + block
                            hit |= {n for b, n in raw.items() if b in data}
                            tail = data[-longest:]
            except OSError:
                continue
            for n in hit:
                found[n].append(str(path.relative_to(root)))
    return found


def data_dir(name: str) -> Path:
    """A test server's data directory, for scans; skips (loudly) when it is not known."""
    from tests.integration.servers import server_data_dir

    d = server_data_dir(name)
    if d is None or not d.is_dir():
        pytest.skip(f"ERASURE NOT CHECKED: the {name} server's data directory is unknown "
                    f"(set MEMSTREAM_TEST_{name.upper()}_DATA or let the tests start the server)")
    return d


def wait_erased(store, timeout: float = 180.0) -> float:
    """Poll a store's deferred erasure until it reports none pending; returns the seconds it took."""
    t0 = time.monotonic()
    pending = store.erase_pending()
    while pending is not None:
        assert time.monotonic() - t0 < timeout, f"erasure still pending after {timeout:.0f} s"
        if pending > 0:
            time.sleep(min(pending, 1.0))
        pending = store.erase_due()
    return time.monotonic() - t0


def canary_rows() -> tuple[list[TurnRow], dict[str, str], ForgetScope, ForgetScope]:
    """c1 and c2 of tenant t1 plus c3: canary A in one turn of c1 (text and speaker), canary B in
    every turn of c3. Returns the rows, the canaries, and the two forgets (A's turn: partial;
    c3: a whole conversation)."""
    a, b = canary(), canary()
    long_name = " speaker of a name long enough for any engine to store it as plain bytes"
    rows = []
    for conv in ("c1", "c2", "c3"):
        for i in range(5):
            text, speaker = f"{conv} turn {i} about topic{i % 3}", "Ann" if i % 2 == 0 else "Bob"
            if conv == "c1" and i == 2:
                text, speaker = f"we talked about {a} at length", a + long_name
            if conv == "c3":
                text, speaker = f"{conv} turn {i}: {b} again", b + long_name
            rows.append(row(i, text, conv=conv, speaker=speaker, agent="a1" if i % 2 == 0 else "a2"))
    return rows, {"A": a, "B": b}, ForgetScope(level="turn", conversation_id="c1", event_id="c1-s1-2"), \
        ForgetScope(level="conversation", conversation_id="c3")


def check_canary(store, root: Path, make_reference: Callable[[], object], model: Model, *, keeps_plaintext: bool,
                 probe: Callable[[str], None] | None = None, between: Callable[[list[TurnRow], ForgetScope], None] | None = None) -> dict:
    """The canary contract (module docstring). `keeps_plaintext`: the store holds turn text in
    its files and must erase it (positive control: the scan finds the canaries before the
    forget); otherwise it must never hold it, and `probe(token)` writes a plain token through the
    engine that the scan must find. `between(rows, scope)` runs after the scan and before the
    forgets (e.g. destroying data keys first, as the eraser may). Returns what was measured."""
    rows, canaries, turn_scope, conv_scope = canary_rows()
    needles = [core(c) for c in canaries.values()]
    write(store, model, rows)
    if keeps_plaintext:
        seen = scan(root, needles)
        assert all(seen[n] for n in needles), f"positive control: the scan must see the canaries before the forget, saw {seen}"
    else:
        assert probe is not None
        token = core(canary())
        probe(token)
        seen = scan(root, [*needles, token])
        assert seen.pop(token), "positive control: a plain value written through the engine must be visible to the scan"
        assert seen == {n: [] for n in needles}, f"plaintext of turns in the store's files: {seen}"
    if between is not None:
        between(rows, turn_scope)
    forget(store, model, turn_scope)
    forget(store, model, conv_scope)
    seconds = wait_erased(store)
    left = scan(root, needles)
    assert left == {n: [] for n in needles}, f"forgotten text still in the store's files: {left}"
    gone = covered(turn_scope, rows) | covered(conv_scope, rows)
    survivors = [r for r in rows if r.turn_id not in gone]
    assert ledger_ids(store, rows) == {r.turn_id for r in survivors}
    reference = make_reference()
    write(reference, model, survivors)
    assert_same_dump(store.canonical_dump(), reference.canonical_dump())  # every other turn and conversation intact
    return {"erasure_seconds": seconds, "seen_before": seen}
