"""`memstream` command line. Each command reads settings once, builds what it needs through
services/runtime.py, and exits non-zero with a one-line explanation on error."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from schemas.errors import MemstreamError
from schemas.ports.views import VIEW_NAMES, Boundary

log = logging.getLogger("memstream.cli")

SAMPLE = Path(__file__).parent / "sample" / "conversation.jsonl"


# -- helpers ---------------------------------------------------------------------------------
def _settings(args):
    from infra.settings import Settings

    overrides: dict[str, Any] = {}
    if getattr(args, "data_dir", None):
        overrides["data_dir"] = Path(args.data_dir)
    return Settings.load(**overrides)


def _existing(settings):
    """For commands that inspect or steer existing memory: an embedded log that does not exist
    yet means a wrong --data-dir, not an empty memory (do not create one silently)."""
    from infra.registry import Registry

    path = Registry(settings).embedded_log_path()
    if path is not None and not path.exists():
        raise MemstreamError(f"no memstream log at {path}; point --data-dir (or MEMSTREAM_DATA_DIR) at a data directory "
                             "that `memstream ingest`, `serve` or `demo` has written")
    return settings


class Progress:
    """One line per view on a TTY (rewritten in place), otherwise a line every few seconds."""

    def __init__(self, target: dict[int, int], stream=sys.stderr):
        self.total = max(sum(target.values()), 1)
        self.target = target
        self.stream = stream
        self.done: dict[str, int] = {}
        self.tty = stream.isatty()
        self._last = 0.0
        self.t0 = time.monotonic()

    def __call__(self, view: str, positions: dict[int, int]) -> None:
        self.done[view] = sum(min(positions.get(p, 0), off) for p, off in self.target.items())
        now = time.monotonic()
        if not self.tty and now - self._last < 5:
            return
        self._last = now
        parts = []
        for v, n in sorted(self.done.items()):
            pct = 100 * n / self.total
            bar = "#" * int(pct / 10)
            parts.append(f"{v} [{bar:<10}] {pct:5.1f}%")
        line = " | ".join(parts) + f"  {now - self.t0:5.1f}s"
        self.stream.write(("\r" + line) if self.tty else line + "\n")
        self.stream.flush()

    def finish(self) -> None:
        if self.tty:
            self.stream.write("\n")


def _table(rows: list[list[Any]], header: list[str]) -> str:
    cells = [header] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells)


# -- commands --------------------------------------------------------------------------------
async def cmd_ingest(args) -> int:
    from services.runtime import build_pipeline
    from streams.ingest import read_jsonl

    settings = _settings(args)
    pipeline = build_pipeline(settings)
    await pipeline.start_log()
    try:
        publisher = pipeline.publisher()
        t0 = time.perf_counter()
        if args.format == "locomo":
            from streams.sources import locomo

            convs = set(args.conversations.split(",")) if args.conversations else None
            events = list(locomo.events(locomo.load(args.path), args.tenant, convs))
            appended = await publisher.publish(events)
            print(f"appended {len(appended)} events from {args.path} (tenant={args.tenant}) in {time.perf_counter() - t0:.2f}s")
        else:
            with open(args.path, encoding="utf-8", errors="strict") as f:
                numbered, bad = read_jsonl(f)
            results = await publisher.publish_items([item for _, item in numbered])
            lines = [n for n, _ in numbered]
            rejected = [(lines[r.index], r) for r in results if r.status == "rejected"] + [(r.index, r) for r in bad]
            accepted = sum(r.status == "accepted" for r in results)
            print(f"appended {accepted} events from {args.path}; rejected {len(rejected)}")
            for line, r in sorted(rejected, key=lambda x: x[0]):
                for e in r.errors:
                    loc = ".".join(str(p) for p in e["loc"]) or "(event)"
                    print(f"  line {line + 1}: {loc}: {e['msg']}", file=sys.stderr)
            if rejected and not accepted:
                return 2
    finally:
        await pipeline.close()
    if args.process:
        return await cmd_process(argparse.Namespace(**{**vars(args), "until_caught_up": True, "views": None}))
    return 0


async def cmd_process(args) -> int:
    from services.runtime import build_pipeline, settle_heap

    settings = _settings(args)
    views = tuple(args.views.split(",")) if getattr(args, "views", None) else VIEW_NAMES
    pipeline = build_pipeline(settings, views=views)
    await pipeline.start()
    settle_heap()
    try:
        if args.until_caught_up:
            target = await pipeline.log.end_offsets(settings.log.topic)
            progress = Progress(target)
            t0 = time.perf_counter()
            await pipeline.process_until_caught_up(progress, target)
            progress.finish()
            print(f"caught up with {sum(target.values())} records in {time.perf_counter() - t0:.2f}s (model load {pipeline.model_load_seconds:.2f}s)")
            for view in await pipeline.paused_views():
                print(f"{view} is paused and was left where it is (`memstream resume {view}`)")
            for view, seconds in (await pipeline.erase_deferred()).items():
                print(f"{view}: a forget's physical erasure is deferred by the store (about {seconds:.0f} s more); it is recorded "
                      "and runs in the next `memstream process`, `serve` or worker")
        else:
            stop = asyncio.Event()
            _stop_on_signals(stop)
            print("processing; Ctrl-C to stop", file=sys.stderr)
            await pipeline.run(stop)
    finally:
        await pipeline.close()
    return 0


def _stop_on_signals(stop: asyncio.Event) -> None:
    import signal

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except NotImplementedError:  # pragma: no cover
            pass


async def cmd_status(args) -> int:
    """One table per sample from services/ops/monitor.py (the sample /metrics and the dashboard
    use). Health needs a window: a one-shot status that sees lag watches for a few seconds."""
    from services.ops.metrics import Metrics
    from services.ops.monitor import OpsMonitor
    from services.runtime import build_pipeline

    settings = _existing(_settings(args))
    pipeline = build_pipeline(settings)
    await pipeline.start_log()
    monitor = OpsMonitor(pipeline, Metrics(), interval=args.interval, window_seconds=settings.ops.window_seconds)
    try:
        snap = await monitor.sample()
        if not args.watch:
            deadline = time.monotonic() + args.settle
            while any(p["lag_events"] for p in snap["projections"]) and time.monotonic() < deadline:
                await asyncio.sleep(args.interval)
                snap = await monitor.sample()
            if args.json:
                print(json.dumps(snap, default=str, indent=2))
            else:
                print(_status_text(snap, {}))
            return 0
        tty = sys.stdout.isatty()
        while True:
            rebuild = await _rebuild_progress(pipeline, snap)
            text = _status_text(snap, rebuild)
            if tty:
                sys.stdout.write("\x1b[H\x1b[2J" + text + "\n")
            else:
                sys.stdout.write(text + "\n\n")
            sys.stdout.flush()
            await asyncio.sleep(args.interval)
            snap = await monitor.sample()
    finally:
        await pipeline.close()


def _bar(done: int, total: int, width: int = 20) -> str:
    frac = 1.0 if total <= 0 else min(1.0, done / total)
    return f"[{'#' * int(frac * width):<{width}}] {100 * frac:5.1f}%"


async def _rebuild_progress(pipeline, snap: dict) -> dict[str, tuple[int, int, int]]:
    """view -> (generation, position, end) for generations a replay is building right now."""
    out = {}
    for p in snap["projections"]:
        for gen in p["rebuilding"]:
            try:
                store = pipeline.backends.open_view(p["name"], gen)
                positions = await asyncio.to_thread(store.positions)
                await asyncio.to_thread(store.close)
            except Exception:  # noqa: BLE001 - the rebuild may have just finished and been switched
                continue
            end = sum(x["end_offset"] for x in p["partitions"])
            out[p["name"]] = (gen, sum(positions.values()), end)
    return out


def _status_text(snap: dict, rebuild: dict) -> str:
    rows = []
    for p in snap["projections"]:
        position = sum(x["position"] for x in p["partitions"])
        end = sum(x["end_offset"] for x in p["partitions"])
        rows.append([p["name"], p["status"] + (" (paused)" if p["paused"] else ""), p["backend"], p["generation"], position, end,
                     p["lag_events"], f"{p['lag_seconds']:.1f}", f"{p['rate']:.1f}", _bar(position, end) if p["lag_events"] else "caught up"])
    lines = [_table(rows, ["view", "status", "backend", "gen", "position", "end", "lag", "lag_s", "rec/s", "progress"])]
    for p in snap["projections"]:
        if p.get("last_error"):
            lines.append(f"{p['name']} {p['status']}: {p['last_error']} (retried with back-off)")
    for view, (gen, done, end) in sorted(rebuild.items()):
        lines.append(f"replay {view} -> generation {gen}: {_bar(done, end)} ({done}/{end})")
    f, d = snap["freshness"], snap["dead_letters"]
    if f["count"]:
        lines.append(f"freshness (append -> searchable): p50 {f['p50_seconds']:.2f}s p95 {f['p95_seconds']:.2f}s over {f['count']} events")
    lines.append(f"dead letters: {d['total']} ({d['pending']} pending replay)")
    fg = snap.get("forgetting") or {}
    if fg.get("pending") is not None:
        oldest = f" (oldest requested {fg['oldest_pending_seconds']:.0f}s ago)" if fg["pending"] else ""
        lines.append(f"forgets: {fg['pending']} pending{oldest}")
    for r in fg.get("retention", []):
        s = r["last_sweep"]
        sweep = "no sweep yet" if s is None else f"last sweep {s['requested_at'][:19]} ({'complete' if s['complete'] else 'in progress'})"
        lines.append(f"retention {r['tenant_id']}: {r['retain_days']} days; {sweep}")
    lines.append(f"health judged over the last {snap['window_seconds']:.0f}s of samples" if len(rows) else "no projections")
    return "\n".join(lines)


async def cmd_control(args) -> int:
    from schemas.control import ProjectionControl
    from services.runtime import build_pipeline

    settings = _existing(_settings(args))
    pipeline = build_pipeline(settings)
    await pipeline.start_log()
    try:
        paused = args.command == "pause"
        await pipeline.control.request(ProjectionControl(type="ProjectionPaused" if paused else "ProjectionResumed",
                                                         projection=args.projection, reason=args.reason or "",
                                                         requested_by=f"cli:{os.getpid()}"))
    finally:
        await pipeline.close()
    if paused:
        print(f"{args.projection}: paused (runners stop after their current batch; `memstream resume {args.projection}` restarts it)")
    else:
        print(f"{args.projection}: resumed (it catches up from its last position)")
    return 0


async def cmd_replay(args) -> int:
    from services.runtime import build_pipeline

    settings = _settings(args)
    views = VIEW_NAMES if args.projection == "all" else (args.projection,)
    pipeline = build_pipeline(settings, views=views)
    await pipeline.start_log()
    await asyncio.to_thread(pipeline.backends.encoder().start)
    await asyncio.to_thread(pipeline.backends.extractor().start)
    try:
        for view in views:
            target = await pipeline.log.end_offsets(settings.log.topic)
            progress = Progress(target)
            t0 = time.perf_counter()
            gen = await pipeline.replay(view, progress)
            progress.finish()
            print(f"{view}: rebuilt generation {gen} from offset 0 in {time.perf_counter() - t0:.2f}s and switched readers to it")
    finally:
        await pipeline.close()
    return 0


async def cmd_dlq(args) -> int:
    from services.runtime import build_pipeline
    from streams.dlq import list_dead_letters, replay_dead_letters

    settings = _settings(args)
    pipeline = build_pipeline(settings)
    await pipeline.start_log()
    try:
        if args.dlq_command == "list":
            entries = await list_dead_letters(pipeline.log, settings.dlq_topic)
            if args.json:
                print(json.dumps([{**{k: v for k, v in e.__dict__.items() if k != "value"}, "value": e.value.decode("utf-8", "replace")}
                                  for e in entries], indent=2, default=str))
            else:
                rows = [[e.origin, ",".join(e.projections), "yes" if e.replayed else "no", e.reason[:100]] for e in entries]
                print(_table(rows, ["origin", "projections", "replayed", "reason"]) if rows else "no dead letters")
        else:
            from streams.sealing import Opener

            report = await replay_dead_letters(pipeline.log, settings.dlq_topic, force=args.force, dry_run=args.dry_run,
                                               opener=Opener(pipeline.keystore))
            verb = "would replay" if args.dry_run else "replayed"
            print(f"{verb} {len(report.replayed)} dead letter(s)")
            for e, reason in report.still_invalid:
                print(f"  still invalid, left pending: {e.origin}: {reason}", file=sys.stderr)
    finally:
        await pipeline.close()
    return 0


async def cmd_inspect(args) -> int:
    from services.inspect_views import describe
    from services.runtime import build_pipeline

    pipeline = build_pipeline(_settings(args))
    await pipeline.start_log()
    await asyncio.to_thread(pipeline.backends.encoder().start)
    try:
        for view in VIEW_NAMES:
            gen = pipeline.catalog.current(view)
            if gen is None:
                print("nothing processed yet: run `memstream process --until-caught-up`")
                return 1
        # Read-only: open the live generations without taking writer locks.
        from services.views import LiveViews

        views = LiveViews(pipeline.backends)
        describe(views, Boundary(args.tenant, (args.conversation,) if args.conversation else None), probe=args.query)
        views.close()
    finally:
        await pipeline.close()
    return 0


async def cmd_demo(args) -> int:
    """The main job on the embedded default: sample conversation -> log -> every view."""
    from services.inspect_views import describe
    from services.runtime import build_pipeline
    from streams.ingest import read_jsonl

    settings = _settings(args)
    pipeline = build_pipeline(settings)
    print(f"data directory: {settings.data_dir.resolve()}  (event log: {settings.log.url}, views: embedded)")
    t0 = time.perf_counter()
    await pipeline.start()
    print(f"models loaded in {pipeline.model_load_seconds:.1f}s: encoder {settings.encoder.model}, NER {pipeline.backends.extractor().model_name}")
    try:
        with open(SAMPLE, encoding="utf-8") as f:
            numbered, _ = read_jsonl(f)
        results = await pipeline.publisher().publish_items([item for _, item in numbered])
        accepted = [r for r in results if r.status == "accepted"]
        print(f"\n1. published {len(accepted)} TurnRecorded events to '{settings.log.topic}' "
              f"(partition {accepted[0].partition}, offsets {accepted[0].offset}..{accepted[-1].offset})")
        t1 = time.perf_counter()
        await pipeline.process_until_caught_up()
        print(f"2. four projections caught up in {time.perf_counter() - t1:.2f}s:")
        for s in await pipeline.status():
            print(f"   {s.view:<9} {s.backend:<8} generation {s.generation}  position {sum(s.positions.values())}/{sum(s.end_offsets.values())}  lag {s.lag_events}")
        print("\n3. what each view holds for conversation 'lisbon-trip' (tenant 'demo'):")
        describe(pipeline, Boundary("demo", ("lisbon-trip",)), out=lambda s: print("   " + s), probe="Maya vegetarian dinner")
        await asyncio.to_thread(_demo_questions, settings, pipeline.backends)
        print(f"\ndone in {time.perf_counter() - t0:.1f}s. Try: memstream status | memstream replay --projection all | "
              "memstream keys create --role admin, then memstream serve")
    finally:
        await pipeline.close()
    return 0


def _search_request(args):
    from datetime import datetime

    from schemas.query import SearchRequest

    def when(v):
        return datetime.fromisoformat(v.replace("Z", "+00:00")) if v else None

    return SearchRequest(question=args.question, tenant_id=args.tenant, conversation_id=args.conversation, agent_id=args.agent,
                         session_id=args.session, since=when(args.since), until=when(args.until), as_of=when(args.as_of),
                         strategy=args.strategy, k=args.k, max_turns=args.max_turns)


def cmd_search(args) -> int:
    from pydantic import ValidationError

    from infra.registry import Registry
    from services.api import build_query_service, build_reader
    from services.views import LiveViews

    settings = _settings(args)
    try:
        request = _search_request(args)
    except ValidationError as exc:
        raise MemstreamError("invalid search: " + "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())) from None
    registry = Registry(settings)
    views = LiveViews(registry)
    service = build_query_service(settings, registry, views)
    service.start()
    try:
        if args.answer:
            from services.query.answering import answer

            reader = build_reader(settings)
            result = answer(service, reader, request)
        else:
            result = service.search(request)
    finally:
        views.close()
    if args.json:
        print(result.model_dump_json(indent=2))
        return 0
    print(f"strategy {result.strategy}  route {result.route or '-'}  {len(result.evidence)} units, "
          f"{sum(len(e.turns) for e in result.evidence)} turns  total {result.timings_ms.get('total', 0):.1f} ms  LLM tokens {result.llm_tokens}")
    if result.profile:
        print(f"profile: {json.dumps(result.profile)}")
    for e in result.evidence:
        refs = ", ".join(f"{t.source_ref or t.event_id}@p{t.partition}:{t.offset}" for t in e.turns)
        print(f"{e.rank:>3}. [{e.role}] {e.kind} {e.session_id} {e.occurred_from:%Y-%m-%d}  ({refs})")
        for line in e.text.splitlines()[:6]:
            print(f"       {line[:160]}")
    if getattr(result, "answer", None) is not None:
        print(f"\nanswer: {result.answer}   (reader said: {result.reader_answer!r}; calibration: {result.calibration.get('action')})")
    return 0


async def cmd_eval(args) -> int:
    from schemas.query import STRATEGIES
    from services.eval.locomo import run, table

    strategies = args.strategies.split(",") if args.strategies else list(STRATEGIES)
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown:
        raise MemstreamError(f"unknown strategies {unknown}; known: {', '.join(STRATEGIES)}")
    budgets = [int(b) for b in args.budgets.split(",")]
    settings = _settings(args)
    if args.loco:  # leave-one-conversation-out: services/eval/loco_cli.py
        from services.eval import loco_cli

        if budgets != [10, 25]:
            raise MemstreamError("--loco reports the budgets 10 and 25 (its objective); leave --budgets out")
        return await loco_cli.cmd(args, strategies, settings)
    data_dir = Path(args.data_dir) if args.data_dir else None
    report = await run(Path(args.path), conversations=set(args.conversations.split(",")) if args.conversations else None,
                       strategies=strategies, budgets=budgets, out=Path(args.out) if args.out else None, k=args.k,
                       data_dir=data_dir, settings=settings, progress=lambda m: print(m, file=sys.stderr))
    ing = report["ingest"]
    print(f"LoCoMo: {report['questions']} questions; ingest {ing['turns']} turns in {ing['seconds']}s "
          f"({ing['turns'] / max(ing['seconds'], 1e-9):.0f} turns/s; model load {ing['model_load_seconds']}s; {ing['llm_tokens']} LLM tokens)")
    print(table(report, budgets))
    for name, result in report["strategies"].items():
        a = result.get("answer_in_candidates") or {}
        if name == "zero-mem" and a.get("questions"):
            print(f"zero-mem: the gold answer is among the typed answer candidates A(q) of the evidence for {a['all']:.1%} "
                  f"of the {a['questions']} date/number/name questions (no reader)")
    print(f"reader requests: {report['reader_requests']}; refused outbound connections: {report['refused_connections']}")
    return 0


DEMO_QUESTIONS = (
    "When is the trip to Sintra?",
    "What does Maya eat now?",
    "Which flight takes them back to Berlin?",
)


def _demo_questions(settings, registry) -> None:
    from schemas.query import SearchRequest
    from services.api import build_query_service, build_reader
    from services.views import LiveViews

    views = LiveViews(registry)
    service = build_query_service(settings, registry, views)
    service.start()
    reader = build_reader(settings)
    print("\n4. Zero-Mem evidence for sample questions (no LLM call; each turn names its event and log position):")
    try:
        for question in DEMO_QUESTIONS:
            request = SearchRequest(question=question, tenant_id="demo", conversation_id="lisbon-trip", max_turns=3)
            result = service.search(request)
            print(f"   Q: {question}   [route {result.route}, {result.timings_ms['total']:.0f} ms, {result.llm_tokens} LLM tokens]")
            for e in result.evidence:
                for t in e.turns:
                    print(f"      [{t.occurred_at:%Y-%m-%d}] {t.speaker}: {t.text[:110]}  <- {t.event_id} @ p{t.partition}:{t.offset} ({e.role})")
            if reader is not None:
                from services.query.answering import answer

                a = answer(service, reader, request)
                print(f"      answer: {a.answer}")
        if reader is None:
            print("   (set MEMSTREAM_READER_URL to an OpenAI-compatible endpoint to also get calibrated answers)")
    finally:
        views.close()
        if reader is not None:
            reader.close()


def cmd_worker(args) -> int:
    """Projections as faust workers on Kafka."""
    from urllib.parse import urlparse

    from services.runtime import build_pipeline
    from streams.faust_worker import run_worker

    settings = _settings(args)
    if not urlparse(settings.log.url).scheme.startswith("kafka"):
        raise MemstreamError("`memstream worker` runs projections on Kafka (set MEMSTREAM_LOG_URL=kafka://host:port); "
                             "with the embedded log, `memstream process` or `memstream serve` run them")
    views = (args.projection,) if args.projection else VIEW_NAMES

    async def create_topics() -> None:  # before faust subscribes: it ignores missing topics
        p = build_pipeline(settings, views=views)
        await p.start_log()
        await p.log.close()

    asyncio.run(create_topics())
    from services.ops.metrics import Metrics

    metrics = Metrics()
    pipeline = build_pipeline(settings, views=views, metrics=metrics)
    port = args.metrics_port if args.metrics_port is not None else settings.ops.worker_metrics_port

    def start_metrics(app) -> None:
        # The query service's gauges for this worker's views, plus the counters only the
        # process that applies records has (records, failed batches, dead letters).
        if port is None:
            return
        from services.ops.metrics_server import start_metrics_server
        from services.ops.monitor import OpsMonitor

        token = settings.ops.token.get_secret_value() if settings.ops.token else None
        if token is None:
            log.warning("MEMSTREAM_OPS_TOKEN is not set: /metrics on port %s answers 401 to everyone", port)
        start_metrics_server(port, settings.ops.worker_metrics_host, metrics.registry, token)
        # Freshness means "visible in every view": only the query service, which sees them all,
        # observes it; a worker may run one projection.
        monitor = OpsMonitor(pipeline, metrics, interval=settings.ops.sample_seconds, window_seconds=settings.ops.window_seconds,
                             mode="kafka", observe_freshness=False)
        app.add_future(monitor.run(asyncio.Event()))

    bootstrap, security = pipeline.backends.kafka_connection()
    run_worker(pipeline, views, bootstrap, credentials=security.faust_credentials(), batch_size=settings.runner.batch_size,
               loglevel="INFO" if args.verbose else "WARNING", ready_file=os.environ.get("MEMSTREAM_WORKER_READY_FILE"),
               on_started=start_metrics)
    return 0


def cmd_serve(args) -> int:
    import uvicorn

    from services.api import NO_KEY, create_app, is_loopback

    settings = _settings(args)
    api = {"host": args.host or settings.api.host, "port": args.port or settings.api.port}
    if args.tls_cert or args.tls_key:
        if not (args.tls_cert and args.tls_key):
            raise MemstreamError("--tls-cert and --tls-key go together (a PEM certificate and its private key)")
        api.update(tls_cert=Path(args.tls_cert), tls_key=Path(args.tls_key))
    settings = settings.model_copy(update={"api": settings.api.model_copy(update=api)})
    if args.insecure_no_auth and not is_loopback(settings.api.host):
        raise MemstreamError(f"--insecure-no-auth is accepted only on a loopback address (127.0.0.1, ::1), not {settings.api.host}")
    if not args.insecure_no_auth and not asyncio.run(_has_key(settings)):
        raise MemstreamError(NO_KEY)
    if args.insecure_no_auth:
        print(f"memstream: WARNING: authentication is off (--insecure-no-auth): anyone who reaches {settings.api.host}:"
              f"{settings.api.port} is an admin of every tenant", file=sys.stderr)
    projections = "none" if args.no_process else args.projections
    app = create_app(settings, process={"inline": True, "child": "child", "none": False}[projections], insecure=args.insecure_no_auth)
    tls = {"ssl_certfile": str(settings.api.tls_cert), "ssl_keyfile": str(settings.api.tls_key)} if settings.api.tls_cert else {}
    uvicorn.run(app, host=settings.api.host, port=settings.api.port, log_level="debug" if args.verbose else "warning", **tls)
    return 0


async def _has_key(settings) -> bool:
    from services.runtime import build_pipeline
    from streams.keys import KeyRing

    pipeline = build_pipeline(settings, views=())
    await pipeline.start_log()
    try:
        ring = KeyRing(pipeline.log, settings.log.topic)
        await ring.ensure_topic()
        await ring.refresh(force=True)
        return ring.has_active_key()
    finally:
        await pipeline.close()


def cmd_schemas(args) -> int:
    from schemas.export import check, export
    from services import openapi_doc

    if args.check:
        stale = check() + ([str(openapi_doc.DOC)] if openapi_doc.stale() else [])
        if stale:
            print("stale JSON Schema / OpenAPI files (run `memstream schemas export`): " + ", ".join(stale), file=sys.stderr)
            return 1
        print("JSON Schema files and the OpenAPI document are up to date")
        return 0
    for path in [*export(), openapi_doc.export()]:
        print(f"wrote {path}")
    return 0


# -- parser ----------------------------------------------------------------------------------
def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="memstream", description="Event-sourced streaming memory for LLM agent fleets.")
    p.add_argument("--data-dir", help="where embedded stores live (default: $MEMSTREAM_DATA_DIR or ./.memstream)")
    p.add_argument("-v", "--verbose", action="store_true")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("demo", help="ingest the sample conversation through the log into every view and show them")
    s.set_defaults(func=cmd_demo)

    s = sub.add_parser("ingest", help="publish events to the log")
    s.add_argument("format", choices=["locomo", "jsonl"])
    s.add_argument("path")
    s.add_argument("--tenant", default="locomo", help="tenant for LoCoMo conversations (jsonl events carry their own)")
    s.add_argument("--conversations", help="LoCoMo sample ids to ingest, comma-separated (default: all)")
    s.add_argument("--process", action="store_true", help="then process until every view has caught up")
    s.set_defaults(func=cmd_ingest)

    s = sub.add_parser("process", help="run the projections")
    s.add_argument("--until-caught-up", action="store_true", help="stop once everything appended so far is processed")
    s.add_argument("--views", help=f"comma-separated subset of {','.join(VIEW_NAMES)}")
    s.set_defaults(func=cmd_process)

    s = sub.add_parser("status", help="each view's lag, freshness and health (OK/LAGGING/STALLED/ERROR)")
    s.add_argument("--json", action="store_true")
    s.add_argument("--watch", action="store_true", help="refresh until interrupted, with progress bars for catch-up and replay")
    s.add_argument("--interval", type=float, default=1.0, help="seconds between samples")
    s.add_argument("--settle", type=float, default=3.0, help="one-shot: seconds to watch a lagging view before judging its health")
    s.set_defaults(func=cmd_status)

    for name, text in (("pause", "stop one projection (the others keep running)"), ("resume", "restart a paused projection")):
        s = sub.add_parser(name, help=text)
        s.add_argument("projection", choices=VIEW_NAMES)
        s.add_argument("--reason", help="kept with the request on the control topic")
        s.set_defaults(func=cmd_control)

    s = sub.add_parser("replay", help="rebuild views from offset 0 into fresh storage and switch atomically")
    s.add_argument("--projection", default="all", choices=["all", *VIEW_NAMES])
    s.set_defaults(func=cmd_replay)

    s = sub.add_parser("dlq", help="dead letters: records projections could not process")
    dsub = s.add_subparsers(dest="dlq_command", required=True)
    d = dsub.add_parser("list")
    d.add_argument("--json", action="store_true")
    d = dsub.add_parser("replay", help="re-append pending dead letters to their source topic")
    d.add_argument("--force", action="store_true", help="replay even records that still fail validation")
    d.add_argument("--dry-run", action="store_true")
    s.set_defaults(func=cmd_dlq)

    s = sub.add_parser("inspect", help="show what each view holds for a tenant/conversation")
    s.add_argument("--tenant", required=True)
    s.add_argument("--conversation")
    s.add_argument("--query", help="probe text for the lexical and dense views")
    s.set_defaults(func=cmd_inspect)

    s = sub.add_parser("search", help="evidence for a question, with provenance (zero LLM tokens)")
    s.add_argument("question")
    s.add_argument("--tenant", required=True)
    s.add_argument("--conversation")
    s.add_argument("--agent")
    s.add_argument("--session")
    s.add_argument("--since", help="ISO time")
    s.add_argument("--until", help="ISO time")
    s.add_argument("--as-of", help="ISO time that relative expressions refer to")
    s.add_argument("--strategy", default="zero-mem")
    s.add_argument("--k", type=int, default=5, help="primary candidates M(q) before closure")
    s.add_argument("--max-turns", type=int, default=25, help="evidence budget in turns")
    s.add_argument("--answer", action="store_true", help="also ask the configured reader (MEMSTREAM_READER_URL)")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_search)

    s = sub.add_parser("eval", help="evaluate retrieval strategies on LoCoMo (evidence recall at turn budgets)")
    s.add_argument("dataset", choices=["locomo"])
    s.add_argument("path")
    s.add_argument("--conversations", help="sample ids, comma-separated (default: all in the file)")
    s.add_argument("--strategies", help="comma-separated (default: all)")
    s.add_argument("--budgets", default="10,25")
    s.add_argument("--k", type=int, default=5, help="primary candidates M(q) before closure")
    s.add_argument("--out", help="write the JSON report here")
    from services.eval.loco_cli import add_arguments as loco_arguments

    loco_arguments(s)
    s.set_defaults(func=cmd_eval)

    s = sub.add_parser("worker", help="run projections as faust-streaming workers on Kafka")
    s.add_argument("--projection", choices=VIEW_NAMES, help="one projection and its own consumer group (default: all four in one app)")
    s.add_argument("--metrics-port", type=int, help="serve Prometheus /metrics on this port (default: $MEMSTREAM_OPS_WORKER_METRICS_PORT)")
    s.set_defaults(func=cmd_worker)

    s = sub.add_parser("serve", help="run the HTTP API (and, embedded, the projections in-process)")
    s.add_argument("--host")
    s.add_argument("--port", type=int)
    s.add_argument("--projections", choices=("inline", "child", "none"), default="inline",
                   help="where the projections run: in this process (default), in a child process at a lower priority so that "
                        "searches stay fast under sustained ingest, or nowhere (another process runs them)")
    s.add_argument("--no-process", action="store_true", help="the same as --projections none")
    s.add_argument("--insecure-no-auth", action="store_true", help="no API keys at all (loopback addresses only; announced in the log and /v1/status)")
    s.add_argument("--tls-cert", help="serve HTTPS with this PEM certificate (chain) ...")
    s.add_argument("--tls-key", help="... and this PEM private key")
    s.set_defaults(func=cmd_serve)

    from services import audit_cli, backup_cli, bench_cli, export_cli, forget_cli, keys_cli, mcp_cli, tenants_cli

    keys_cli.register(sub)
    backup_cli.register(sub)
    mcp_cli.register(sub)
    bench_cli.register(sub)
    forget_cli.register(sub)
    tenants_cli.register(sub)
    export_cli.register(sub)
    audit_cli.register(sub)

    s = sub.add_parser("schemas", help="JSON Schema files for producers in other languages")
    s.add_argument("action", choices=["export"])
    s.add_argument("--check", action="store_true", help="fail if the committed files are stale")
    s.set_defaults(func=cmd_schemas)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    from services.runtime import configure_logging

    configure_logging(args.verbose)
    try:
        result = args.func(args)
        if asyncio.iscoroutine(result):
            result = asyncio.run(result)
        return int(result or 0)
    except MemstreamError as exc:
        print(f"memstream: {exc}", file=sys.stderr)
        return 2
    except (OSError, UnicodeDecodeError) as exc:
        print(f"memstream: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
