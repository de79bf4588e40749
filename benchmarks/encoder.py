"""The dense encoder's own ceiling, without the rest of the pipeline.

    .venv/bin/python benchmarks/encoder.py [--locomo PATH] [--turns 512] [--out FILE]

- batch: LoCoMo dev turns (`Speaker: text`, as the dense projection encodes them) through
  `encode_with_spans` in the projection's batches — turns per second with every core;
- question: one short question at a time (the query path) — median milliseconds per question;
each on ONNX Runtime (the default) and on eager PyTorch, side by side in one run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from infra.models.flagembedding import FlagEmbeddingEncoder  # noqa: E402
from report import write_report  # noqa: E402
from streams.sources import locomo  # noqa: E402

from streams.sources.locomo import DEFAULT_PATH as DEFAULT_LOCOMO  # noqa: E402
QUESTION = "When did Caroline go to the LGBTQ support group?"


def per_call_ms(fn, n: int) -> float:
    fn()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return round(statistics.median(times), 2)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--locomo", type=Path, default=DEFAULT_LOCOMO)
    ap.add_argument("--turns", type=int, default=512)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    texts = [f"{e.speaker}: {e.full_text}" for e in locomo.events(locomo.load(args.locomo), "bench", None)][: args.turns]
    report = {}
    for runtime in ("onnx", "torch"):
        encoder = FlagEmbeddingEncoder(runtime=runtime)
        encoder.start()
        assert encoder.active_runtime == runtime, f"{runtime} is not available (see the log)"
        encoder.encode_with_spans(texts[:32], [[(0, len(t))] for t in texts[:32]])  # warm-up
        t0 = time.perf_counter()
        encoder.encode_with_spans(texts, [[(0, len(t))] for t in texts])
        seconds = time.perf_counter() - t0
        report[runtime] = {"batch": {"turns": len(texts), "seconds": round(seconds, 2), "turns_per_second": round(len(texts) / seconds, 1),
                                     "batch_size": encoder.batch_size},
                           "question_ms": per_call_ms(lambda: encoder.encode_with_spans([QUESTION], [[(9, 17)]]), 200)}
    report["speed-up onnx/torch"] = {"batch": round(report["onnx"]["batch"]["turns_per_second"] / report["torch"]["batch"]["turns_per_second"], 2),
                                     "question": round(report["torch"]["question_ms"] / report["onnx"]["question_ms"], 2)}
    write_report(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
