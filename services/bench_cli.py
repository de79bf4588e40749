"""`memstream bench load`: reads while writes pour in (services/bench/load.py). Without --url it
starts its own `memstream serve` on a scratch data directory (the embedded mode, the configured
models) on a free loopback port, and stops it at the end.

`memstream bench ingest`: the write path's rates and time per stage, in-process
(services/bench/ingest.py).

`memstream bench scale`: the measured tenants' latency and recall as a store grows with a
synthetic fleet (services/bench/scale.py, services/bench/fleet.py).

`memstream bench grow`: the bounded query path as one conversation grows (an agent's loop against
a serve on the store, recall in a haystack) and across a tenant being written to
(services/bench/grow.py)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from services.reports import write_json
from streams.sources import locomo


def register(sub) -> None:
    s = sub.add_parser("bench", help="benchmarks against a live deployment")
    bsub = s.add_subparsers(dest="bench_command", required=True)
    b = bsub.add_parser("load", help="N publishers at a fixed rate plus M searchers; search latency idle vs under load, freshness, "
                                     "RSS and open files (loopback only; stops by itself)")
    b.add_argument("--url", help="a running memstream serve (loopback); default: start one on a scratch directory (embedded)")
    b.add_argument("--key", help="an admin or writer key of the tenant 'bench' (default and better: $MEMSTREAM_API_KEY, which no other "
                                 "user of the machine sees; made when starting serve)")
    b.add_argument("--publishers", type=int, default=4)
    b.add_argument("--rate", type=float, default=20.0, help="events/s offered per publisher (default 20)")
    b.add_argument("--batch", type=int, default=10, help="events per publish (default 10)")
    b.add_argument("--searchers", type=int, default=2)
    b.add_argument("--idle", type=float, default=30.0, help="seconds of searches alone first (default 30)")
    b.add_argument("--duration", type=float, default=300.0, help="seconds under load (default 300)")
    b.add_argument("--strategy", default="zero-mem")
    b.add_argument("--scope", choices=("conversation", "tenant"), default="conversation",
                   help="what a search covers: one conversation, half of them being written (default), or the whole growing tenant")
    b.add_argument("--conversation-turns", type=int, default=500,
                   help="turns per conversation: a publisher starts a new one after this many; the memory is seeded with two (default 500)")
    b.add_argument("--projections", choices=("inline", "child"), default="child",
                   help="the serve this starts runs its projections in-process or in a child process (default; see memstream serve)")
    b.add_argument("--pid", action="append", default=[], metavar="NAME=PID", help="also sample this process's RSS and open files")
    b.add_argument("--out", type=Path, default=Path("bench-results/load.json"))
    b.add_argument("--plot", type=Path, help="write PNG plots here")
    b.add_argument("--title", default="memstream bench load")
    b.set_defaults(func=cmd_bench)

    c = bsub.add_parser("scale", help="the measured tenants' Zero-Mem p95 and recall in a store grown to 10k / 100k / 1M turns, "
                                      "against the smallest, queries alternating (embedded; resumable)")
    c.add_argument("--locomo", type=Path, default=locomo.DEFAULT_PATH, help="the LoCoMo dev split: the measured tenant (default: %(default)s)")
    c.add_argument("--root", type=Path, default=Path("bench-results/scale"), help="where the two stores grow (kept: a run resumes)")
    c.add_argument("--points", default="10000,100000,1000000",
                   help="stored turns: the smallest is the reference store, the others the large store's steps (default %(default)s)")
    c.add_argument("--conversations", help="measured conversations, comma-separated (default: all of the split)")
    c.add_argument("--questions", type=int, help="ask only the first N questions (smoke runs)")
    c.add_argument("--seed", type=int, default=7)
    c.add_argument("--tenants", type=int, default=40, help="synthetic tenants (default 40)")
    c.add_argument("--out", type=Path, default=Path("bench-results/scale.json"))
    c.add_argument("--plot", type=Path, help="write PNG plots here")
    c.set_defaults(func=cmd_scale)

    i = bsub.add_parser("ingest", help="append rate, add -> ready on the LoCoMo dev split with the time per stage, and the models' own "
                                       "throughput on the same turns (embedded, in-process, scratch directories)")
    i.add_argument("--locomo", type=Path, default=locomo.DEFAULT_PATH, help="the LoCoMo dev split (default: %(default)s)")
    i.add_argument("--conversations", help="comma-separated sample ids (default: all of the split)")
    i.add_argument("--append-events", type=int, default=50_000, help="events for the append rate (default %(default)s)")
    i.add_argument("--batch-size", type=int, default=256, help="records per projection batch (default %(default)s)")
    i.add_argument("--no-locomo", action="store_true", help="measure the append rate alone")
    i.add_argument("--out", type=Path, default=Path("bench-results/ingest.json"))
    i.add_argument("--plot", type=Path, help="write a PNG plot here")
    i.set_defaults(func=cmd_ingest)

    q = bsub.add_parser("query", help="publish the LoCoMo dev split through the API, then query latency per strategy at 1 and N "
                                      "concurrent clients (client and server p50/p95/p99, stage p50s, recall); loopback only")
    q.add_argument("--url", help="a running memstream serve (loopback), e.g. a distributed deployment's; default: start one on a "
                                 "scratch directory (embedded)")
    q.add_argument("--key", help="a writer or admin key of the tenant 'bench' (default and better: $MEMSTREAM_API_KEY)")
    q.add_argument("--locomo", type=Path, default=locomo.DEFAULT_PATH, help="the LoCoMo dev split (default: %(default)s)")
    q.add_argument("--conversations", help="comma-separated sample ids (default: all of the split)")
    q.add_argument("--questions", type=int, help="ask only the first N questions (smoke runs)")
    q.add_argument("--strategies", default="zero-mem,bm25,hierarchy-only")
    q.add_argument("--concurrency", default="1,4", help="concurrent clients, one round per value (default %(default)s)")
    q.add_argument("--projections", choices=("inline", "child"), default="child", help="for the serve this starts (see memstream serve)")
    q.add_argument("--out", type=Path, default=Path("bench-results/query.json"))
    q.add_argument("--plot", type=Path, help="write a PNG plot here")
    q.set_defaults(func=cmd_query)

    g = bsub.add_parser("grow", help="one LoCoMo conversation grown among filler sessions (1k/10k/100k turns): "
                                     "an agent's loop (add, wait, search after the write and with nothing written) "
                                     "against a serve on it, recall per strategy, and a whole tenant searched while "
                                     "written to (embedded; resumable)")
    g.add_argument("--locomo", type=Path, default=locomo.DEFAULT_PATH,
                   help="the LoCoMo dev split (default: %(default)s)")
    g.add_argument("--conversation", default="conv-26", help="the dev conversation grown (default %(default)s)")
    g.add_argument("--sizes", default="1000,10000,100000",
                   help="turns in the conversation, comma-separated (default %(default)s)")
    g.add_argument("--rounds", type=int, default=200, help="agent-loop rounds per size (default %(default)s)")
    g.add_argument("--parts", default="loop,haystack",
                   help="comma-separated, of loop,haystack,tenant (default %(default)s)")
    g.add_argument("--tenant", action="store_true", help="also the tenant-wide part (long)")
    g.add_argument("--whole-up-to", type=int, default=10_000,
                   help="Zero-Mem over the whole boundary too at sizes up to this (default %(default)s)")
    g.add_argument("--questions", type=int, help="the haystack asks only the first N questions (smoke runs)")
    g.add_argument("--tenant-conversations", type=int, default=200)
    g.add_argument("--tenant-turns", type=int, default=100_000)
    g.add_argument("--write-rate", type=float, default=50.0,
                   help="turns/s written to the tenant while it is searched (default %(default)s)")
    g.add_argument("--tenant-searches", type=int, default=200,
                   help="tenant-wide searches, and as many agent-scoped (default %(default)s)")
    g.add_argument("--projections", choices=("inline", "child"), default="inline",
                   help="for the serves this starts (see memstream serve; default %(default)s)")
    g.add_argument("--seed", type=int, default=7)
    g.add_argument("--root", type=Path, default=Path("bench-results/grow"),
                   help="where the stores grow (kept: a run resumes; default %(default)s)")
    g.add_argument("--out", type=Path, default=Path("bench-results/grow.json"),
                   help="the JSON report; the PNG plot goes beside it (default %(default)s)")
    g.set_defaults(func=cmd_grow)




def cmd_scale(args: argparse.Namespace) -> int:
    from services.bench.fleet import FleetShape
    from services.bench.scale import ScaleConfig, plot, run

    if not args.locomo.exists():
        raise SystemExit(f"no LoCoMo file at {args.locomo} (--locomo)")
    try:
        points = tuple(int(p.replace("_", "")) for p in args.points.split(","))
    except ValueError:
        raise SystemExit(f"--points: comma-separated turn counts, got {args.points!r}") from None
    if len(points) < 1 or min(points) < 1:
        raise SystemExit("--points: at least one positive turn count")
    cfg = ScaleConfig(locomo=args.locomo, root=args.root, points=points,
                      conversations=set(args.conversations.split(",")) if args.conversations else None,
                      questions=args.questions, shape=FleetShape(seed=args.seed, tenants=args.tenants))
    def save(report: dict) -> None:
        report["command"] = " ".join(["memstream", *sys.argv[1:]])
        write_json(report, args.out)
        if args.plot:
            plot(report, args.plot)

    result = asyncio.run(run(cfg, progress=lambda m: print(m, file=sys.stderr, flush=True), on_point=save))
    print(json.dumps({k: v for k, v in result.items() if k != "points"} | {"p95_ratios": [p["p95_ratio"] for p in result["points"]]}, indent=2))
    return 0


def cmd_ingest(args: argparse.Namespace) -> int:
    from services.bench.ingest import IngestBenchConfig, plot, run

    if args.append_events < 1 or args.batch_size < 1:
        raise SystemExit("--append-events and --batch-size: positive numbers")
    if not args.no_locomo and not args.locomo.exists():
        raise SystemExit(f"no LoCoMo file at {args.locomo} (--locomo, or --no-locomo for the append rate alone)")
    wanted = set(args.conversations.split(",")) if args.conversations else None
    if wanted and not args.no_locomo:
        unknown = wanted - {s["sample_id"] for s in locomo.load(args.locomo)}
        if unknown:
            raise SystemExit(f"--conversations: none of {sorted(unknown)} is in {args.locomo}")
    cfg = IngestBenchConfig(locomo=None if args.no_locomo else args.locomo, append_events=args.append_events, batch_size=args.batch_size,
                            conversations=wanted)
    result = asyncio.run(run(cfg, progress=lambda m: print(m, file=sys.stderr, flush=True)))
    result["command"] = " ".join(["memstream", *sys.argv[1:]])
    write_json(result, args.out)
    if args.plot:
        plot(result, args.plot)
    print(json.dumps({k: v for k, v in result.items() if k != "config"}, indent=2))
    return 0


def cmd_query(args: argparse.Namespace) -> int:
    from services.bench.query import QueryBench, QueryBenchConfig, plot

    try:
        levels = tuple(int(x) for x in args.concurrency.split(","))
    except ValueError:
        raise SystemExit(f"--concurrency: comma-separated numbers of clients, got {args.concurrency!r}") from None
    if not levels or min(levels) < 1:
        raise SystemExit("--concurrency: each level needs at least one client")
    from schemas.query import STRATEGIES

    strategies = tuple(x for x in args.strategies.split(",") if x)
    unknown = [x for x in strategies if x not in STRATEGIES]
    if unknown or not strategies:
        raise SystemExit(f"--strategies: unknown {unknown}; choose from {', '.join(STRATEGIES)}")
    with _serve(args) as (url, key, _pid):
        cfg = QueryBenchConfig(url=url, key=key, locomo=args.locomo, questions=args.questions, concurrency=levels,
                               conversations=set(args.conversations.split(",")) if args.conversations else None,
                               strategies=strategies,
                               extra={"deployment": "url" if args.url else f"scratch embedded serve (--projections {args.projections})"})
        result = asyncio.run(QueryBench(cfg, progress=lambda m: print(m, file=sys.stderr, flush=True)).run())
    result["command"] = " ".join(["memstream", *_redacted(sys.argv[1:])])
    write_json(result, args.out)
    if args.plot:
        plot(result, args.plot)
    print(json.dumps(result, indent=2))
    return 0


def cmd_grow(args: argparse.Namespace) -> int:
    from services.bench.grow import PARTS, GrowConfig, plot, run

    if not args.locomo.exists():
        raise SystemExit(f"no LoCoMo file at {args.locomo} (--locomo)")
    try:
        sizes = tuple(sorted({int(x.replace("_", "")) for x in args.sizes.split(",")}))
    except ValueError:
        raise SystemExit(f"--sizes: comma-separated turn counts, got {args.sizes!r}") from None
    parts = tuple(dict.fromkeys([*(p for p in args.parts.split(",") if p), *(["tenant"] if args.tenant else [])]))
    if not parts or set(parts) - set(PARTS):
        raise SystemExit(f"--parts: some of {', '.join(PARTS)}, got {args.parts!r}")
    if not sizes or min(sizes) < 1:
        raise SystemExit("--sizes: at least one positive turn count")
    # The serves it starts run on the default embedded log and views (_serve_on): the stores it
    # grows in-process must be the same ones.
    elsewhere = sorted(k for k in os.environ if k.startswith(("MEMSTREAM_LOG_", "MEMSTREAM_VIEWS_", "MEMSTREAM_KEYS_")))
    if elsewhere:
        raise SystemExit(f"memstream bench grow measures the embedded default; unset {', '.join(elsewhere)}")
    if args.rounds < 2 or args.tenant_searches < 1 or args.write_rate <= 0 or args.tenant_conversations < 2:
        raise SystemExit("--rounds ≥ 2, --tenant-searches ≥ 1, --write-rate > 0 and --tenant-conversations ≥ 2")
    cfg = GrowConfig(locomo=args.locomo, root=args.root, conversation=args.conversation, sizes=sizes,
                     rounds=args.rounds, parts=parts, whole_up_to=args.whole_up_to, questions=args.questions,
                     tenant_conversations=args.tenant_conversations, tenant_turns=args.tenant_turns,
                     write_rate=args.write_rate, tenant_searches=args.tenant_searches, seed=args.seed,
                     extra={"projections": args.projections})

    @contextmanager
    def serve(data_dir: Path) -> Iterator[tuple[str, str]]:
        with _serve_on(data_dir, args.projections, data_dir.parent / f"serve-{data_dir.name}.log") as (url, key, _pid):
            yield url, key

    def save(report: dict) -> None:
        report["command"] = " ".join(["memstream", *sys.argv[1:]])
        write_json(report, args.out)
        plot(report, args.out.with_suffix(".png"))

    result = run(cfg, serve, progress=lambda m: print(m, file=sys.stderr, flush=True), on_report=save)
    print(json.dumps({"out": str(args.out), "failures": result["failures"]}, indent=2))
    return 0 if not any(result["failures"].values()) else 1


def cmd_bench(args: argparse.Namespace) -> int:
    from services.bench.load import LoadConfig, LoadRun, check_loopback
    from services.projection_child import child_pids

    pids = dict(p.split("=", 1) for p in args.pid)
    with _serve(args) as (url, key, serve_pid):
        check_loopback(url)
        if serve_pid:
            pids.setdefault("serve", serve_pid)
            for child in child_pids(serve_pid):
                pids.setdefault("projections", child)
        cfg = LoadConfig(url=url, key=key, publishers=args.publishers, rate=args.rate, batch=args.batch, searchers=args.searchers,
                         idle=args.idle, duration=args.duration, strategy=args.strategy, scope=args.scope,
                         conversation_turns=args.conversation_turns, pids={k: int(v) for k, v in pids.items()})
        run = LoadRun(cfg, progress=lambda m: print(m, file=sys.stderr, flush=True))
        result = asyncio.run(run.run())
    result["command"] = " ".join(["memstream", *_redacted(sys.argv[1:])])
    write_json(result, args.out)
    if args.plot:
        run.plot(args.plot, args.title)
    print(json.dumps(result, indent=2))
    return 0 if result["errors"] == 0 else 1


def _redacted(argv: list[str]) -> list[str]:
    """The command as run, for the report, without the key (prefer MEMSTREAM_API_KEY: a command
    line is visible to every user of the machine)."""
    out, hide = [], False
    for a in argv:
        if hide:
            out.append("***")
        elif a.startswith("--key="):
            out.append("--key=***")
        else:
            out.append(a)
        hide = a == "--key"
    return out


@contextmanager
def _serve(args) -> Iterator[tuple[str, str, int | None]]:
    if args.url:
        key = args.key or os.environ.get("MEMSTREAM_API_KEY")
        if not key:
            raise SystemExit(f"memstream bench {args.bench_command} --url needs --key or MEMSTREAM_API_KEY")
        yield args.url.rstrip("/"), key, None
        return
    with tempfile.TemporaryDirectory(prefix="memstream-bench-") as tmp:
        with _serve_on(Path(tmp) / "data", args.projections, Path(tmp) / "serve.log") as served:
            yield served


@contextmanager
def _serve_on(data_dir: Path, projections: str, log_path: Path) -> Iterator[tuple[str, str, int]]:
    """`memstream serve` on `data_dir` (embedded, the configured models) on a free loopback port,
    with a new admin key; stopped at the end. Its output goes to `log_path` (appended)."""
    binary = str(Path(sys.executable).with_name("memstream"))
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MEMSTREAM_LOG_", "MEMSTREAM_VIEWS_", "MEMSTREAM_KEYS_"))}
    env.update(MEMSTREAM_DATA_DIR=str(data_dir), MEMSTREAM_OPS_TOKEN="ops-" + secrets.token_urlsafe(16),
               MEMSTREAM_API_RATE_LIMIT_PER_SECOND="0")
    made = subprocess.run([binary, "keys", "create", "--role", "admin", "--json", "--name", "bench"], env=env,
                          capture_output=True, text=True, timeout=120)
    if made.returncode != 0:
        raise SystemExit(f"memstream keys create failed: {made.stderr[-2000:]}")
    key = json.loads(made.stdout)["key"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = open(log_path, "ab")
    proc = subprocess.Popen([binary, "serve", "--host", "127.0.0.1", "--port", str(port), "--projections", projections],
                            env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"memstream serve exited: {log_path.read_text(errors='replace')[-2000:]}")
            try:
                with urllib.request.urlopen(f"{url}/healthz", timeout=5):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit("memstream serve did not answer /healthz within 300 s") from None
                time.sleep(0.5)
        yield url, key, proc.pid
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
