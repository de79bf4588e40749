"""What physical erasure costs per forget in the embedded views, on the LoCoMo dev split.

    .venv/bin/python benchmarks/forget_erasure.py [--locomo PATH] [--forgets 5] [--out FILE]

The lexical view (tantivy) erases by rebuilding the tenant's index from the ledger's `docs` table
into a fresh directory (infra/lexical/tantivy.py); the SQLite views erase with secure_delete and a WAL
truncated after the change set (infra/sqlite_base.py). No model runs: the split's turns become
units and documents exactly as the hierarchy and lexical projections make them, written one
change set per session (as ingest writes them), then single turns and whole conversations are
forgotten, each the way the projection does it (the turn's session recomputed). Reported: the
index's size, the time of a forget with its erasure, and of the same forget with the erasure
step skipped (rebuild, WAL truncation), so the difference is the erasure's price.
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from infra.lexical.tantivy import TantivyLexicalIndex  # noqa: E402
from infra.units.sqlite import SqliteUnitStore  # noqa: E402
from schemas.events import ForgetScope  # noqa: E402
from schemas.ordering import order_turns  # noqa: E402
from schemas.ports.lexical import LexicalChangeSet  # noqa: E402
from schemas.ports.unit_store import UnitChangeSet  # noqa: E402
from schemas.ports.views import Forget  # noqa: E402
from schemas.units import HierarchyPolicy  # noqa: E402
from streams.projections.base import turn_row  # noqa: E402
from streams.projections.lexical import lexical_doc  # noqa: E402
from streams.segmentation import diff_units, session_units  # noqa: E402
from streams.sources import locomo  # noqa: E402
from report import write_report  # noqa: E402

TENANT = "locomo"
POLICY = HierarchyPolicy()


class _At:  # where a turn sits in the log, for turn_row
    def __init__(self, offset: int):
        self.partition, self.offset = 0, offset


def _turns(path: Path):
    rows = [turn_row(e, _At(i)) for i, e in enumerate(locomo.events(locomo.load(path), TENANT, None))]
    by_session = defaultdict(list)
    for r in rows:
        by_session[r.session_key].append(r)
    return rows, {k: order_turns(v) for k, v in sorted(by_session.items())}


def _lexical(rows, before, after):
    upserts, deletes = diff_units(session_units(before, POLICY), session_units(after, POLICY))
    return LexicalChangeSet(put_turns=rows, upsert_docs=[lexical_doc(u, True) for u in upserts], delete_docs=deletes)


def _units(rows, before, after):
    upserts, deletes = diff_units(session_units(before, POLICY), session_units(after, POLICY))
    return UnitChangeSet(put_turns=rows, upsert_units=upserts, delete_units=deletes)


def _forget_change(store, make, scope: ForgetScope):
    f = Forget(TENANT, scope)
    change = make([], [], [])
    change.put_turns = []
    if scope.partial:
        gone = defaultdict(set)
        for t in store.turns_in_scope(f):
            gone[t.session_key].add(t.turn_id)
        for key, ids in gone.items():
            before = store.session_turns(*key)
            part = make([], before, [t for t in before if t.turn_id not in ids])
            for name in ("upsert_docs", "delete_docs", "upsert_units", "delete_units"):
                if hasattr(change, name):
                    getattr(change, name).extend(getattr(part, name))
    change.forgets.append(f)
    return change


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def run(path: Path, forgets: int, seed: int) -> dict:
    rows, sessions = _turns(path)
    conversations = sorted({r.conversation_id for r in rows})
    rng = random.Random(seed)
    picked = rng.sample(rows, forgets)
    report: dict = {"turns": len(rows), "sessions": len(sessions), "conversations": len(conversations), "forgets": forgets}
    for name, open_store, make in (("lexical/tantivy", lambda d: TantivyLexicalIndex(d / "lexical", 1), _lexical),
                                   ("hierarchy/sqlite", lambda d: SqliteUnitStore(d / "units.sqlite", 1), _units)):
        out: dict = {}
        for erase in (True, False):
            d = Path(tempfile.mkdtemp(prefix="memstream-forget-bench-"))
            store = open_store(d)
            if not erase:  # the same forget without its erasure step
                if hasattr(store, "_rebuild"):
                    store._rebuild = lambda *a, **k: None
                store._truncate_wal = lambda *a, **k: None
                ledger = getattr(store, "_ledger", None)
                if ledger is not None:
                    ledger._truncate_wal = lambda *a, **k: None
            t0 = time.perf_counter()
            for i, (key, turns) in enumerate(sessions.items()):
                store.apply(make(turns, [], turns), {0: i + 1})
            load = time.perf_counter() - t0
            offset = len(sessions) + 1
            timings = {"turn": [], "conversation": []}
            for r in picked:
                change = _forget_change(store, make, ForgetScope(level="turn", conversation_id=r.conversation_id, event_id=r.event_id))
                t = time.perf_counter()
                store.apply(change, {0: offset})
                timings["turn"].append(time.perf_counter() - t)
                offset += 1
            for conv in conversations[:2]:
                change = _forget_change(store, make, ForgetScope(level="conversation", conversation_id=conv))
                t = time.perf_counter()
                store.apply(change, {0: offset})
                timings["conversation"].append(time.perf_counter() - t)
                offset += 1
            key = "with_erasure" if erase else "without_erasure"
            out[key] = {"load_seconds": round(load, 2), "files_bytes_after": _size(d),
                        "forget_turn_ms_median": round(1000 * statistics.median(timings["turn"]), 1),
                        "forget_turn_ms_max": round(1000 * max(timings["turn"]), 1),
                        "forget_conversation_ms": [round(1000 * x, 1) for x in timings["conversation"]]}
            if hasattr(store, "_rebuild"):
                out[key]["documents_after"] = len(store.canonical_dump()["docs"])
            store.close()
            shutil.rmtree(d, ignore_errors=True)
        report[name] = out
    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--locomo", type=Path, default=Path(__file__).resolve().parents[2] / "shared/data/locomo/locomo-dev.json")
    ap.add_argument("--forgets", type=int, default=5)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    write_report(run(args.locomo, args.forgets, args.seed), args.out)


if __name__ == "__main__":
    main()
