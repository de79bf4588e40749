"""Held-out recall of the two query paths, bounded and whole, with the same constants per fold.

`memstream eval locomo --loco` chooses Zero-Mem's constants on four conversations and scores the
fifth; on the bounded path its descent costs ~11 minutes per fold on two cores (each of ~60
configurations re-runs every question's graph walk on its own candidates), so a full run there
takes hours. The constants a recorded `--loco` report chose for each fold were chosen without
that fold's questions, so scoring each held-out conversation with its fold's constants on both
paths is a leak-free held-out comparison of the paths, questions paired. Also the in-sample figure
of the shipped constants on both paths.

    .venv/bin/python benchmarks/loco_paths.py --report docs/results/eval-loco.json --out loco-paths.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from infra.registry import Registry
from infra.settings import Settings
from services.eval import intervals
from services.eval import locomo as harness
from services.eval.loco import OBJECTIVE, STARTS, QuestionBank
from services.query.config import DEFAULT, DEFAULT_BOUNDS
from services.query.service import QueryService
from streams.sources import locomo


def _constants(changes: dict) -> dict:
    return {k: tuple(v) if isinstance(v, list) else v for k, v in changes.items()}


def _summary(values: np.ndarray, strata: np.ndarray) -> dict:
    return intervals.stratified(values, strata).as_dict()


async def run(args) -> dict:
    report = json.loads(args.report.read_text())
    folds = report["strategies"]["zero-mem"]["folds"]
    start = STARTS[report["procedure"]["start"]](None)
    samples = locomo.load(args.locomo)
    data_dir = Path(tempfile.mkdtemp(prefix="memstream-loco-paths-"))
    settings = Settings.load(data_dir=data_dir).model_copy(update={"data_dir": data_dir})
    registry = Registry(settings)
    out: dict = {"report": str(args.report), "report_start": report["procedure"]["start"], "paths": {}, "in_sample": {}}
    async with harness.session(settings, registry, samples, "locomo", None) as s:
        qs = harness.questions(samples, None)
        services = {"bounded": QueryService(s.views, registry.encoder(), registry.extractor(), bounds=DEFAULT_BOUNDS),
                    "whole": QueryService(s.views, registry.encoder(), registry.extractor(), bounds=None)}
        banks = {path: QuestionBank(svc, s.views, qs, "locomo") for path, svc in services.items()}
        strata = banks["bounded"].conv_of
        held = {path: {m: np.zeros(len(qs)) for m in OBJECTIVE} for path in banks}
        t0 = time.perf_counter()
        for fold in folds:
            cfg = start.with_(**_constants(fold["changes"]))
            for path, bank in banks.items():
                test = np.where(bank.conv_of == bank.conversations.index(fold["held_out"]))[0]
                r = bank.zero_mem(cfg, "zero-mem", test)
                for m in OBJECTIVE:
                    held[path][m][test] = r[m]
            print(f"fold {fold['held_out']}: " + ", ".join(
                f"{p} {held[p]['recall@10'][test].mean():.4f}/{held[p]['recall@25'][test].mean():.4f}" for p in banks)
                + f" (recorded {fold['test']['recall@10']:.4f}/{fold['test']['recall@25']:.4f}; {time.perf_counter() - t0:.0f} s)",
                flush=True)
        everything = np.arange(len(qs))
        shipped = {path: bank.zero_mem(DEFAULT, "zero-mem", everything) for path, bank in banks.items()}
    for path in banks:
        out["paths"][path] = {m: _summary(held[path][m], strata) for m in OBJECTIVE}
        out["in_sample"][path] = {m: _summary(shipped[path][m], strata) for m in OBJECTIVE}
    out["bounded_minus_whole"] = {
        "held_out": {m: intervals.paired(held["bounded"][m], held["whole"][m], strata).as_dict() for m in OBJECTIVE},
        "in_sample": {m: intervals.paired(shipped["bounded"][m], shipped["whole"][m], strata).as_dict() for m in OBJECTIVE}}
    out["recorded_held_out"] = {m: report["strategies"]["zero-mem"]["loco"][m]["all"] for m in OBJECTIVE}
    out["questions"] = len(qs)
    out["seconds"] = round(time.perf_counter() - t0, 1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--locomo", type=Path, default=locomo.DEFAULT_PATH)
    ap.add_argument("--report", type=Path, default=Path("docs/results/eval-loco.json"),
                    help="a `memstream eval locomo --loco` report: its per-fold constants are used")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    out = asyncio.run(run(args))
    args.out.write_text(json.dumps(out, indent=2))
    print(json.dumps({k: out[k] for k in ("paths", "in_sample", "bounded_minus_whole")}, indent=1))


if __name__ == "__main__":
    main()
