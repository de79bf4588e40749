"""`memstream audit`: the audit trail — key changes, retention settings, pause/resume, forgets with
their completion, exports — for operators with local access to the control topic (the same
entries GET /v1/admin/audit pages through).

    memstream audit [--tenant T] [--since TIME] [--json]
"""

from __future__ import annotations

import argparse
import json


def register(sub) -> None:
    s = sub.add_parser("audit", help="the audit trail: key changes, retention, forgets and their completion, exports")
    s.add_argument("--tenant", help="only this tenant's entries")
    s.add_argument("--since", help="only entries at or after this ISO time (e.g. 2026-01-31T00:00:00Z)")
    s.add_argument("--json", action="store_true", help="a JSON array of entries")
    s.set_defaults(func=cmd_audit)


async def cmd_audit(args: argparse.Namespace) -> int:
    from services.audit import describe, parse_time
    from services.cli import _existing, _settings, _table
    from services.runtime import build_pipeline
    from streams.audit import AuditTrail

    settings = _existing(_settings(args))
    since = parse_time(args.since) if args.since else None
    pipeline = build_pipeline(settings, views=())
    await pipeline.start_log()
    try:
        trail = AuditTrail(pipeline.log, settings.log.topic)
        await trail.refresh()
        entries, _ = trail.page(tenant_id=args.tenant, since=since, limit=len(trail.entries) + 1)
    finally:
        await pipeline.close()
    if args.json:
        print(json.dumps(entries, indent=2))
        return 0
    rows = [[e["at"][:19].replace("T", " "), e["kind"], e["action"], e["tenant_id"] or "-", e["by"] or "-", describe(e)] for e in entries]
    print(_table(rows, ["at (UTC)", "kind", "action", "tenant", "by", "what"]) if rows else "no audit entries")
    return 0
