"""`memstream tenants`: per-tenant settings — retention — for operators with local access to the
control topic (the setting is a record there, so every process applies it; streams/retention.py).

    memstream tenants set T --retain-days N    # forget T's turns older than N days, automatically; 0 clears it
    memstream tenants list [--json]            # each tenant's retention and last sweep
"""

from __future__ import annotations

import argparse
import json

from schemas.forgetting import MAX_RETAIN_DAYS


def register(sub) -> None:
    s = sub.add_parser("tenants", help="per-tenant settings: retention")
    ts = s.add_subparsers(dest="tenants_command", required=True)
    c = ts.add_parser("set", help="set a tenant's retention")
    c.add_argument("tenant")
    c.add_argument("--retain-days", type=int, required=True, metavar="N",
                   help=f"forget turns that happened more than N days ago (0: keep forever; at most {MAX_RETAIN_DAYS})")
    c.add_argument("--json", action="store_true")
    c = ts.add_parser("list", help="every tenant the control topic names, with its retention and last sweep")
    c.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_tenants)


async def cmd_tenants(args: argparse.Namespace) -> int:
    from schemas.errors import MemstreamError
    from schemas.forgetting import TenantRetentionSet
    from services.audit import tenant_rows
    from services.cli import _existing, _settings, _table
    from services.keys_cli import _who
    from services.runtime import build_pipeline
    from streams.audit import AuditTrail, append_record

    settings = _settings(args)
    if args.tenants_command == "list":
        _existing(settings)
    pipeline = build_pipeline(settings, views=())
    await pipeline.start_log()
    try:
        if args.tenants_command == "set":
            try:
                record = TenantRetentionSet(tenant_id=args.tenant, retain_days=args.retain_days, by=_who())
            except ValueError as exc:
                raise MemstreamError(f"invalid retention: {str(exc).splitlines()[-1].strip()} (tenant ids are lowercase "
                                     f"[a-z0-9_-]; days 0..{MAX_RETAIN_DAYS})") from None
            offset = await append_record(pipeline.log, settings.log.topic, record)
            out = {"tenant_id": args.tenant, "retain_days": args.retain_days, "control_offset": offset,
                   "sweep_seconds": settings.retention.sweep_seconds}
            if args.json:
                print(json.dumps(out, indent=2))
            elif args.retain_days:
                print(f"tenant {args.tenant}: turns that happened more than {args.retain_days} days ago are forgotten automatically "
                      f"(checked every {settings.retention.sweep_seconds:g}s where the eraser runs); control offset {offset}")
            else:
                print(f"tenant {args.tenant}: retention cleared (memory is kept until forgotten); control offset {offset}")
            return 0
        trail = AuditTrail(pipeline.log, settings.log.topic)
        await trail.refresh()
        rows = tenant_rows(trail)
    finally:
        await pipeline.close()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    table = []
    for r in rows:
        s = r["last_sweep"]
        sweep = "-" if s is None else f"{s['requested_at'][:19].replace('T', ' ')} ({'complete' if s['complete'] else 'in progress'})"
        table.append([r["tenant_id"], r["retain_days"] if r["retain_days"] else "forever", (r["set_by"] or "-"), sweep])
    print(_table(table, ["tenant", "retain days", "set by", "last sweep (UTC)"]) if table else "no tenants")
    return 0
