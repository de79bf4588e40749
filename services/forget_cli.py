"""`memstream forget`: forget a tenant, conversation, session, turn or agent, for operators with
local access to the log (the same request POST /v1/forget and a ForgetRequested event make).

    memstream forget --tenant T [--conversation C [--session S | --turn EVENT_ID]] [--agent A]
                     [--before TIME] [--reason R] [--wait SECONDS] [--json]

It appends the request and prints its positions; with --wait it returns once the forget is
complete — every view and the eraser past it, whoever runs them (this process does not).
"""

from __future__ import annotations

import argparse
import json
from datetime import datetime


def register(sub) -> None:
    s = sub.add_parser("forget", help="forget a tenant, conversation, session, turn or agent (log, views and keys)")
    s.add_argument("--tenant", required=True)
    s.add_argument("--conversation")
    s.add_argument("--session", help="with --conversation")
    s.add_argument("--turn", metavar="EVENT_ID", help="one turn: with --conversation")
    s.add_argument("--agent", help="everything this agent said in the tenant")
    s.add_argument("--before", help="only turns that happened before this ISO time (e.g. 2025-01-01T00:00:00Z)")
    s.add_argument("--reason", help="kept with the request on the log (the audit trail, `memstream audit`, keeps who, scope and times, never free text)")
    s.add_argument("--wait", type=float, default=0.0, metavar="SECONDS", help="return once the forget is complete (0: do not wait)")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_forget)


async def cmd_forget(args: argparse.Namespace) -> int:
    from schemas.errors import MemstreamError
    from services.cli import _existing, _settings
    from services.forget import forget_request, scope_of
    from services.keys_cli import _who
    from services.runtime import build_pipeline
    from services.views import LiveViews
    from services.waiting import PositionWatch

    settings = _existing(_settings(args))
    before = datetime.fromisoformat(args.before.replace("Z", "+00:00")) if args.before else None
    if args.session and not args.conversation or args.turn and not args.conversation:
        raise MemstreamError("--session and --turn need --conversation")
    try:
        scope = scope_of(conversation_id=args.conversation, session_id=args.session, event_id=args.turn, agent_id=args.agent,
                         occurred_before=before)
        event = forget_request(args.tenant, scope, reason=args.reason, requested_by=_who())
    except ValueError as exc:
        raise MemstreamError(f"invalid forget: {str(exc).splitlines()[0]}") from None
    pipeline = build_pipeline(settings, views=())
    await pipeline.start_log()
    try:
        [result] = await pipeline.publisher().publish_items([event.model_dump(mode="json")])
        if result.status != "accepted":
            raise MemstreamError(f"the forget request was not appended: {result.errors}")
        end = await pipeline.log.end_offsets(settings.log.topic)
        positions = dict(end) if scope.broadcast else {result.partition: result.offset + 1}
        done = None
        if args.wait > 0:
            views = LiveViews(pipeline.backends)
            try:
                done = await PositionWatch(views, pipeline.keystore, interval=0.1).wait(positions, args.wait)
            finally:
                views.close()
    finally:
        await pipeline.close()
    out = {"forget_id": event.event_id, "tenant_id": args.tenant, "scope": scope.model_dump(mode="json", exclude_none=True),
           "positions": positions, "complete": done}
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        what = scope.level + "".join(f" {k}={v}" for k, v in out["scope"].items() if k != "level")
        state = {None: "requested (the views and the eraser complete it as they reach it)", True: "complete",
                 False: f"not complete after {args.wait:g}s (is anything running the projections? memstream status)"}[done]
        print(f"forget {event.event_id}: {what} in tenant {args.tenant}: {state}; positions {positions}")
    return 0 if done is not False else 1
