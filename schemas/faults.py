"""Fault injection for the crash tests: the one test hook every layer may call.

`MEMSTREAM_FAULT=<point>[:<n>]` makes the process SIGKILL itself the n-th time (default: the
first) it reaches `<point>` — no cleanup, no flush, no `finally`: what a power cut or the OOM
killer does to the process. Unset (the default), `hit()` costs one attribute check.

Points (where the code calls `hit`):
- `view-written`: a store wrote a change set's view data but not yet its positions (inside the
  SQLite transaction before its commit; between the index commit and the ledger write in
  tantivy; between the document writes and the positions document on the servers);
- `forget-view-written`: a server store (OpenSearch, Qdrant) wrote a forget's view data (its
  sessions' recomputed windows and episodes among them) but has not removed its turns from the
  ledger yet;
- `position-written`: the runner applied a step (view and positions) but has not committed the
  consumer group yet (the embedded runner; the faust worker's batch before faust acks it);
- `mid-batch`: a batch that needs several steps (a forget ends a step) has applied some of them;
- `replay-built`: a replay finished its new generation and has not switched readers to it;
- `replay-switched`: a replay switched the catalog and has not dropped the old generation.

`MEMSTREAM_FAULT_POISON=<marker>` makes every projection raise on a turn whose text contains
`<marker>` (`poisoned`): a view that throws on one event, for the dead-letter tests in processes
the test cannot patch (a faust worker on Kafka).

Read from the environment at the first `hit()`, not at import.
"""

from __future__ import annotations

import os
import signal
import sys

POINTS = ("view-written", "forget-view-written", "position-written", "mid-batch", "replay-built", "replay-switched")
_armed: tuple[str, int] | None | bool = False  # False: not read yet
_seen: dict[str, int] = {}


def _arm() -> tuple[str, int] | None:
    spec = os.environ.get("MEMSTREAM_FAULT", "").strip()
    if not spec:
        return None
    point, _, count = spec.partition(":")
    if point not in POINTS or (count and not count.isdigit()):
        raise ValueError(f"MEMSTREAM_FAULT={spec!r}: expected one of {', '.join(POINTS)}, optionally :N (the N-th time)")
    return point, int(count or 1)


def hit(point: str) -> None:
    """Die here (SIGKILL) if the armed fault is this point's n-th visit."""
    global _armed
    if _armed is False:
        _armed = _arm()
    if _armed is None or _armed[0] != point:
        return
    _seen[point] = _seen.get(point, 0) + 1
    if _seen[point] == _armed[1]:
        sys.stderr.write(f"memstream: MEMSTREAM_FAULT: killing process {os.getpid()} at {point} (visit {_seen[point]})\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)


_poison: str | None | bool = False  # False: not read yet


def poisoned(view: str, texts) -> None:
    """Raise if MEMSTREAM_FAULT_POISON is set and one of `texts` contains it."""
    global _poison
    if _poison is False:
        _poison = os.environ.get("MEMSTREAM_FAULT_POISON") or None
    if _poison is not None and any(_poison in t for t in texts):
        # (the marker is not repeated: a dead letter's reason must not copy memory text)
        raise RuntimeError(f"MEMSTREAM_FAULT_POISON: the {view} projection refuses a turn holding the poison marker")
