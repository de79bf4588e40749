"""Zero-Mem query latency with and without the overlapped question encoding, side by side.

    .venv/bin/python benchmarks/query_overlap.py --data-dir DIR [--locomo PATH] [--questions 760] [--out FILE]

DIR holds the LoCoMo dev split, ingested (`benchmarks/tune_zeromem.py --data-dir DIR --ingest`).
For each question, in alternating order, the same service answers it twice: `overlap` (the
default: the forward pass runs on the encoder's thread while the vector-free stages run,
services/query/context.py `prefetch_question`) and `serial` (the pass first, then everything
else). Both arms meet the same machine conditions; compare them within one run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from infra.registry import Registry  # noqa: E402
from infra.settings import Settings  # noqa: E402
from report import write_report  # noqa: E402
from schemas.query import SearchRequest  # noqa: E402
from services.eval.locomo import percentile, questions  # noqa: E402
from services.query.context import QueryContext  # noqa: E402
from services.query.service import QueryService  # noqa: E402
from services.views import LiveViews  # noqa: E402
from streams.sources import locomo  # noqa: E402
from streams.sources.locomo import DEFAULT_PATH as DEFAULT_LOCOMO  # noqa: E402



def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", type=Path, required=True)
    ap.add_argument("--locomo", type=Path, default=DEFAULT_LOCOMO)
    ap.add_argument("--questions", type=int, default=760)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    registry = Registry(Settings.load(data_dir=args.data_dir))
    service = QueryService(LiveViews(registry), registry.encoder(), registry.extractor())
    service.start()
    qs = questions(locomo.load(args.locomo), None)[: args.questions]
    prefetch = QueryContext.prefetch_question
    arms = {"overlap": prefetch, "serial": lambda ctx: None}  # serial: question_states encodes inline
    latency: dict[str, list[float]] = {a: [] for a in arms}
    stages: dict[str, dict[str, list[float]]] = {a: {} for a in arms}
    try:
        for n, q in enumerate(qs):
            for arm in (list(arms) if n % 2 == 0 else list(reversed(arms))):
                QueryContext.prefetch_question = arms[arm]
                req = SearchRequest(question=q.question, tenant_id="locomo", conversation_id=q.conversation, max_turns=25)
                t0 = time.perf_counter()
                resp = service.search(req)
                latency[arm].append((time.perf_counter() - t0) * 1000)
                for stage, ms in resp.timings_ms.items():
                    stages[arm].setdefault(stage, []).append(ms)
    finally:
        QueryContext.prefetch_question = prefetch
    report = {arm: {"p50_ms": round(percentile(latency[arm], 50), 2), "p95_ms": round(percentile(latency[arm], 95), 2),
                    "stage_ms_p50": {k: round(statistics.median(v), 2) for k, v in sorted(stages[arm].items())}} for arm in arms}
    report["questions"] = len(qs)
    report["serial / overlap p50"] = round(report["serial"]["p50_ms"] / report["overlap"]["p50_ms"], 2)
    write_report(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
