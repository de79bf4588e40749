"""`memstream export`: a tenant's memory as JSON Lines, for operators with local access to the log
and the data key store (the same export GET /v1/export streams; services/export.py).

    memstream export --tenant T [--conversation C] > memory.jsonl
    memstream ingest jsonl memory.jsonl            # re-imports it (e.g. into another data directory)

The turns go to stdout, one event per line; a summary goes to stderr. The export is recorded in
the audit trail (who, tenant, conversation, how many turns).
"""

from __future__ import annotations

import argparse
import sys


def register(sub) -> None:
    s = sub.add_parser("export", help="a tenant's memory (the raw turns still held) as JSON Lines on stdout")
    s.add_argument("--tenant", required=True)
    s.add_argument("--conversation", help="only this conversation")
    s.set_defaults(func=cmd_export)


async def cmd_export(args: argparse.Namespace) -> int:
    from schemas.events import encode_event
    from services.cli import _existing, _settings
    from services.export import export_turns, record_export
    from services.keys_cli import _who
    from services.runtime import build_pipeline

    settings = _existing(_settings(args))
    pipeline = build_pipeline(settings, views=())
    await pipeline.start_log()
    turns, complete = 0, False
    out = sys.stdout.buffer
    try:
        async for event in export_turns(pipeline.log, settings.log.topic, pipeline.keystore, args.tenant, args.conversation):
            out.write(encode_event(event) + b"\n")
            turns += 1
        out.flush()
        complete = True
    finally:
        await record_export(pipeline.log, settings.log.topic, args.tenant, args.conversation, turns, complete, _who())
        await pipeline.close()
    what = f"conversation {args.conversation} of tenant {args.tenant}" if args.conversation else f"tenant {args.tenant}"
    print(f"exported {turns} turns of {what}", file=sys.stderr)
    return 0
