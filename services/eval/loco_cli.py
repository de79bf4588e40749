"""`memstream eval locomo PATH --loco`: the leave-one-conversation-out run (services/eval/loco.py)
behind the eval verb — ingest the split into a fresh (or the given) data directory with outbound
connections refused, then tune and score every fold, print the headline table, write the JSON."""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
from pathlib import Path

from infra.registry import Registry
from infra.settings import Settings
from schemas.errors import MemstreamError
from services.eval import intervals
from services.eval.locomo import questions, session
from services.eval.loco import (GRID, STARTS, LocoConfig, QuestionBank, against, check_pairable, evaluate, markdown,
                               question_keys, table)
from services.reports import write_json
from streams.sources import locomo

TENANT = "locomo"


def add_arguments(s) -> None:
    g = s.add_argument_group("leave-one-conversation-out (--loco)")
    g.add_argument("--loco", action="store_true",
                   help="tune Zero-Mem and each ablation on all conversations but one and score the one left out, every fold; "
                        "report held-out figures with 95%% stratified-bootstrap intervals and each ablation's paired difference")
    g.add_argument("--fold-passes", type=int, default=2, help="coordinate-descent passes per fold (default %(default)s)")
    g.add_argument("--global-passes", type=int, default=2, help="passes for the constants selected on every conversation (default %(default)s)")
    g.add_argument("--start", choices=sorted(STARTS), default="grid-middle",
                   help="where each fold's search (and the final selection) begins: grid-middle (default: each constant at the "
                        "middle of its candidates, owing nothing to the split's scores), or the shipped constants (selected on "
                        "every conversation, the held-out one included: optimistic)")
    g.add_argument("--min-gain", type=float, default=0.0, metavar="POINTS",
                   help="take a move of the search only when it raises the training objective by more than this many "
                        "recall points (default %(default)s)")
    g.add_argument("--constants", help=f"tune only these constants, comma-separated (default: all of {len(GRID)})")
    g.add_argument("--resamples", type=int, default=intervals.RESAMPLES, help="bootstrap resamples (default %(default)s)")
    g.add_argument("--seed", type=int, default=intervals.SEED, help="bootstrap seed (default %(default)s)")
    g.add_argument("--markdown", help="also write the report's tables as Markdown here (docs/results/eval-loco.md)")
    g.add_argument("--against", metavar="REPORT.json",
                   help="an earlier --loco report on the same questions (another setting): print and record this run minus "
                        "it, per strategy, paired per question with 95%% intervals and a verdict")


def check(args, strategies: list[str]) -> LocoConfig:
    """The run's configuration, or a clear error before anything starts."""
    only = tuple(c for c in args.constants.split(",") if c) if args.constants else None
    unknown = sorted(set(only or ()) - set(GRID))
    if unknown:
        raise MemstreamError(f"--constants: unknown {unknown}; tunable: {', '.join(GRID)}")
    if args.fold_passes < 1 or args.global_passes < 1 or args.resamples < 100:
        raise MemstreamError("--fold-passes and --global-passes: at least 1; --resamples: at least 100")
    if not 0 <= args.min_gain < 100:
        raise MemstreamError("--min-gain: recall points, from 0 up to 100")
    return LocoConfig(strategies=tuple(strategies), fold_passes=args.fold_passes, global_passes=args.global_passes, only=only,
                      resamples=args.resamples, seed=args.seed, start_name=args.start,
                      min_gain=args.min_gain / 100)


async def run(path: Path, cfg: LocoConfig, *, conversations: set[str] | None, k: int, settings: Settings, data_dir: Path | None,
              out: Path | None, base: dict | None = None, base_name: str = "") -> dict:
    """`base`: an earlier report (--against) to pair this run with; checked before anything is ingested."""
    samples = locomo.load(path)
    qs = questions(samples, conversations)
    if len({q.conversation for q in qs}) < 2:
        raise MemstreamError("--loco needs at least two conversations with questions (one is held out per fold)")
    if base is not None:
        try:
            check_pairable(base, question_keys(qs))
        except ValueError as e:
            raise MemstreamError(f"--against {base_name}: {e}") from e
    data_dir = data_dir or Path(tempfile.mkdtemp(prefix="memstream-loco-"))
    settings = settings.model_copy(update={"data_dir": data_dir})
    registry = Registry(settings)
    progress = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    async with session(settings, registry, samples, TENANT, conversations) as s:  # no reader is asked: it only proves zero tokens
        progress(f"ingested {s.ingest['turns']} turns in {s.ingest['seconds']} s; {len(qs)} questions")
        bank = QuestionBank(s.service, s.views, qs, TENANT, k=k)
        report = await asyncio.to_thread(evaluate, bank, cfg, progress)
        report = {"dataset": "locomo", "ingest": s.ingest, **report, "refused_connections": len(s.refused),
                  "llm_tokens": s.reader.counter.snapshot()["tokens"]}
    if base is not None:
        report["against"] = {"report": base_name, "strategies": against(report, base, cfg)}
    if out is not None:
        write_json(report, out)
    return report


async def cmd(args, strategies: list[str], settings: Settings) -> int:
    cfg = check(args, strategies)
    base = None
    if args.against:
        try:
            base = json.loads(Path(args.against).read_text())
        except (OSError, ValueError) as e:
            raise MemstreamError(f"--against {args.against}: {e}") from e
    report = await run(Path(args.path), cfg, conversations=set(args.conversations.split(",")) if args.conversations else None,
                       k=args.k, settings=settings, data_dir=Path(args.data_dir) if getattr(args, "data_dir", None) else None,
                       out=Path(args.out) if args.out else None, base=base, base_name=args.against or "")
    print(table(report))
    for name, d in ((report.get("against") or {}).get("strategies") or {}).items():
        print(f"{name} minus {args.against}: " + ", ".join(
            f"{m} {d[m]['all']['mean']:+.4f} [{d[m]['all']['ci95'][0]:+.4f}, {d[m]['all']['ci95'][1]:+.4f}] {d[m]['all']['verdict']}"
            for m in d))
    if args.markdown:
        Path(args.markdown).write_text(markdown(report) + "\n")
    sel = report.get("selected")
    if sel:
        print(f"\nconstants selected on every conversation: {sel['changes'] or 'the shipped ones, unchanged'} "
              f"(in-sample {sel['in_sample']['recall@10']:.4f} / {sel['in_sample']['recall@25']:.4f})")
    print(f"{report['variants_tried']} configurations scored; {report['llm_tokens']} LLM tokens; "
          f"{report['refused_connections']} refused connections; {report['seconds']} s")
    return 0
