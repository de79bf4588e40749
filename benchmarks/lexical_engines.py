"""Embedded BM25 engines side by side: tantivy (the lexical view) vs SQLite FTS5.

    .venv/bin/python benchmarks/lexical_engines.py --data-dir DIR [--locomo PATH] [--out FILE]

DIR is a data directory the pipeline filled with the LoCoMo dev split (e.g. `memstream ingest
locomo ../shared/data/locomo/locomo-dev.json --tenant locomo --process` with MEMSTREAM_DATA_DIR=DIR).
The tantivy side is the live lexical view itself; the FTS5 side indexes the same turn texts
(`porter` tokenizer) from the hierarchy view. Every dev question's keywords are run against its
own conversation (the boundary filter), top 10 turns; latency per query on the same queries.
(Recall is not compared here: the Zero-Mem hierarchy view needs the tantivy scores of every
unit of the boundary, which `memstream eval` measures end to end.)
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from infra.registry import Registry  # noqa: E402
from infra.settings import Settings  # noqa: E402
from schemas.ports.views import Boundary  # noqa: E402
from services.eval.locomo import questions  # noqa: E402
from services.query.analysis import keyword_words  # noqa: E402
from services.views import LiveViews  # noqa: E402
from streams.sources import locomo  # noqa: E402
from report import write_report  # noqa: E402

from streams.sources.locomo import DEFAULT_PATH as DEFAULT_LOCOMO  # noqa: E402
TENANT = "locomo"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", type=Path, required=True)
    ap.add_argument("--locomo", type=Path, default=DEFAULT_LOCOMO)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    qs = questions(locomo.load(args.locomo), None)
    views = LiveViews(Registry(Settings.load(data_dir=args.data_dir)))
    units, lexical = views.store("hierarchy"), views.store("lexical")

    fts = sqlite3.connect(":memory:")
    fts.execute("CREATE VIRTUAL TABLE t USING fts5(unit_id UNINDEXED, conversation UNINDEXED, text, tokenize='porter')")
    conversations = sorted({q.conversation for q in qs})
    for conv in conversations:
        for u in units.list_units(Boundary(TENANT, (conv,)), "turn"):
            fts.execute("INSERT INTO t VALUES (?,?,?)", (u.unit_id, conv, u.text))
    fts.commit()

    def run(search):
        times = []
        for q in qs:
            words = keyword_words(q.question)
            if not words:
                continue
            t0 = time.perf_counter()
            search(q, words)
            times.append((time.perf_counter() - t0) * 1000)
        times.sort()
        return {"queries": len(times), "p50_ms": round(statistics.median(times), 3), "p95_ms": round(times[int(0.95 * len(times)) - 1], 3)}

    def tantivy(q, words):
        return [h.unit_id for h in lexical.search("turn", " ".join(words), Boundary(TENANT, (q.conversation,)), 10)]

    def sqlite_fts5(q, words):
        match = " OR ".join('"' + w.replace('"', '""') + '"' for w in words)
        rows = fts.execute("SELECT unit_id FROM t WHERE t MATCH ? AND conversation = ? ORDER BY bm25(t) LIMIT 10", (match, q.conversation))
        return [r[0] for r in rows]

    report = {"tantivy": run(tantivy), "sqlite-fts5": run(sqlite_fts5)}
    report["ratio_fts5_over_tantivy_p50"] = round(report["sqlite-fts5"]["p50_ms"] / report["tantivy"]["p50_ms"], 1)
    write_report(report, args.out)
    views.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
