"""The audit trail as the CLI (`memstream audit`, services/audit_cli.py) and the admin endpoint
(GET /v1/admin/audit, services/routes/audit.py) show it: entries folded from the control topic
by streams/audit.py, pages behind an opaque cursor, and a one-line text form."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from schemas.errors import InvalidRequest
from services import paging


def encode_cursor(after: int) -> str:
    return paging.AUDIT.render((after,))


def decode_cursor(cursor: str) -> int:
    """The control-topic offset a page ends at; InvalidCursor (400) for anything else."""
    return paging.AUDIT.parse(cursor)[0]


def parse_time(value: str) -> datetime:
    """An ISO 8601 time (`Z` accepted); without an offset it is UTC."""
    try:
        t = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        raise InvalidRequest(f"not an ISO 8601 time: {value!r} (e.g. 2026-01-31T00:00:00Z)") from None
    return t.replace(tzinfo=timezone.utc) if t.tzinfo is None else t


def describe(entry: dict) -> str:
    """What the entry says, in a few words (ids, counts — the entry holds no memory text)."""
    kind = entry["kind"]
    if kind == "key":
        return f"key {entry['key_id']} ({entry['role']})" + (f" name={entry['name']}" if entry.get("name") else "")
    if kind == "retention":
        return f"retain {entry['retain_days']} days" if entry["retain_days"] else "retention cleared (keep forever)"
    if kind == "projection":
        return f"projection {entry['projection']}"
    if kind == "export":
        what = f"conversation {entry['conversation_id']}" if entry.get("conversation_id") else "every conversation"
        return f"{what}: {entry['turns']} turns" + ("" if entry["complete"] else " (stopped before the end)")
    scope = entry["scope"]
    ids = " ".join(f"{k}={v}" for k, v in scope.items() if k != "level")
    state = (f"complete after {entry['seconds']:g}s" if entry["complete"]
             else f"{entry['partitions_complete']}/{entry['partitions']} partitions complete")
    return f"{entry['forget_id']} {scope['level']}{(' ' + ids) if ids else ''}: {state}, {entry['keys_destroyed']} keys destroyed"


def tenant_rows(trail, now=None) -> list[dict]:
    """Per tenant: its retention setting and the last retention sweep that completed (the shape
    `tenants list --json` prints and the ops snapshot shows)."""
    now = now or datetime.now(timezone.utc)
    out = []
    for tenant in sorted(set(trail.tenants()) | set(trail.retention)):
        setting = trail.retention.get(tenant)
        sweep = trail.last_sweep.get(tenant)
        out.append({
            "tenant_id": tenant, "retain_days": setting.retain_days if setting else None,
            "set_at": setting.at.isoformat() if setting else None, "set_by": setting.by if setting else None,
            "cutoff": (now - timedelta(days=setting.retain_days)).isoformat() if setting else None,
            "last_sweep": None if sweep is None else {
                "forget_id": sweep["forget_id"], "requested_at": sweep["requested_at"], "occurred_before": sweep["scope"].get("occurred_before"),
                "complete": sweep["complete"], "completed_at": sweep["completed_at"], "keys_destroyed": sweep["keys_destroyed"]},
        })
    return out
