"""Zero-Mem and its ablations on the LoCoMo dev split, in-sample (shipped config) and LOCO
(per-fold configs from a tuning report).

    .venv/bin/python benchmarks/ablations.py --data-dir DIR [--tuning bench-results/tuning.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from services.query.config import DEFAULT  # noqa: E402
from services.query.zeromem import MODES  # noqa: E402
from tune_zeromem import BUDGETS, DEFAULT_LOCOMO, Bench, summarize  # noqa: E402
from report import write_report  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", type=Path, required=True)
    ap.add_argument("--locomo", type=Path, default=DEFAULT_LOCOMO)
    ap.add_argument("--tuning", type=Path, help="a tune_zeromem.py report: evaluates each fold's config on its held-out conversation")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    bench = Bench(args.data_dir, args.locomo)
    everything = np.arange(len(bench.qs))
    report = {"in_sample": {}, "loco": {}}
    for mode in MODES:
        report["in_sample"][mode] = summarize(bench, bench.recalls(DEFAULT, everything, mode), everything)
        r = report["in_sample"][mode]
        print(f"{mode:<16} in-sample B10 {r['budget_10']['all']:.4f} B25 {r['budget_25']['all']:.4f}", flush=True)
    if args.tuning:
        folds = json.loads(args.tuning.read_text())["folds"]
        for mode in MODES:
            rec = {b: np.zeros(len(bench.qs)) for b in BUDGETS}
            for f in folds:
                c = bench.convs.index(f["held_out"])
                test = np.where(bench.conv_of == c)[0]
                cfg = DEFAULT.__class__(**{k: tuple(v) if isinstance(v, list) else v for k, v in f["config"].items()})
                r = bench.recalls(cfg, test, mode)
                for b in BUDGETS:
                    rec[b][test] = r[b]
            report["loco"][mode] = summarize(bench, rec, everything)
            r = report["loco"][mode]
            print(f"{mode:<16} LOCO      B10 {r['budget_10']['all']:.4f} B25 {r['budget_25']['all']:.4f}", flush=True)
    write_report(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
