"""`memstream keys create|list|revoke|rotate`: API keys, for operators with local access to the
data directory or the servers (the records go straight to the control topic, so no running
server, and no key, is needed to make the first admin key).

    memstream keys create --role admin [--name N] [--json] [--if-none] [--out FILE]
    memstream keys create --tenant T --role reader|writer [--name N] [--json]
    memstream keys list [--tenant T] [--json]
    memstream keys revoke KEY_ID
    memstream keys rotate KEY_ID [--grace-hours H]

A new key is printed once (to stdout) and stored nowhere; only its SHA-256 is kept.
"""

from __future__ import annotations

import argparse
import getpass
import json
import socket
from datetime import timedelta

from schemas.security import ROLES


def register(sub) -> None:
    s = sub.add_parser("keys", help="API keys: create, list, revoke, rotate")
    ks = s.add_subparsers(dest="keys_command", required=True)
    c = ks.add_parser("create", help="make a key and print it once")
    c.add_argument("--role", required=True, choices=ROLES)
    c.add_argument("--tenant", help="the tenant of a reader or writer key (admin keys have none)")
    c.add_argument("--name", default="", help="a label, e.g. the agent or team that uses the key")
    c.add_argument("--json", action="store_true", help="print an object with key, key_id, tenant_id, role, …")
    c.add_argument("--if-none", action="store_true", help="only if no active key of this role (and tenant) exists yet: for bootstrapping")
    c.add_argument("--out", help="write the key to this file (mode 0600) instead of stdout")
    c = ks.add_parser("list", help="every key, without secrets")
    c.add_argument("--tenant")
    c.add_argument("--json", action="store_true")
    c = ks.add_parser("revoke", help="revoke a key (every process refuses it once the change is seen: POST /v1/wait on its control_offset)")
    c.add_argument("key_id")
    c.add_argument("--json", action="store_true")
    c = ks.add_parser("rotate", help="new secret for a key; the old one keeps working for a grace period")
    c.add_argument("key_id")
    c.add_argument("--grace-hours", type=float, default=24.0, help="how long the previous secret stays valid (default 24)")
    c.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_keys)


def _who() -> str:
    try:
        return f"cli:{getpass.getuser()}@{socket.gethostname()}"
    except Exception:  # noqa: BLE001 - a label only
        return "cli"


async def cmd_keys(args: argparse.Namespace) -> int:
    from services import keys
    from services.cli import _existing, _settings, _table
    from services.runtime import build_pipeline
    from streams.keys import KeyRing

    settings = _settings(args)
    if args.keys_command != "create":
        _existing(settings)
    pipeline = build_pipeline(settings, views=())
    await pipeline.start_log()
    ring = KeyRing(pipeline.log, settings.log.topic)
    try:
        await ring.ensure_topic()
        await ring.refresh(force=True)
        if args.keys_command == "list":
            listing = ring.listing(args.tenant)
            if args.json:
                print(json.dumps(listing, indent=2))
            else:
                rows = [[k["key_id"], k["role"], k["tenant_id"] or "-", k["name"], k["created_at"][:19],
                         "active" if k["active"] else ("revoked" if k["revoked_at"] else "expired")] for k in listing]
                print(_table(rows, ["key_id", "role", "tenant", "name", "created", "state"]) if rows else "no keys")
            return 0
        if args.keys_command == "create":
            if args.if_none and any(k["active"] and k["role"] == args.role and k["tenant_id"] == args.tenant for k in ring.listing()):
                print(f"an active {args.role} key exists already; none created (--if-none)")
                return 0
            change = await keys.create(ring, args.role, args.tenant, args.name, by=_who())
        elif args.keys_command == "revoke":
            change = await keys.revoke(ring, args.key_id, by=_who())
        else:
            change = await keys.rotate(ring, args.key_id, timedelta(hours=args.grace_hours), by=_who())
    finally:
        await pipeline.close()
    if args.json and not getattr(args, "out", None):
        print(json.dumps(change.as_dict(), indent=2))
        return 0
    info = change.info
    if change.key is not None and getattr(args, "out", None):
        import os

        fd = os.open(args.out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(change.key + "\n")
        print(f"wrote the new key {info['key_id']} to {args.out} (mode 0600)")
        return 0
    if change.key is not None:
        print(change.key)
        what = "new secret for" if args.keys_command == "rotate" else "created"
        scope = f"tenant {info['tenant_id']}" if info["tenant_id"] else "every tenant"
        import sys

        print(f"{what} key {info['key_id']} ({info['role']}, {scope}); it is shown only this once: store it now", file=sys.stderr)
        if args.keys_command == "rotate":
            print(f"the previous secret stays valid until {info['previous_secret_valid_until']}", file=sys.stderr)
    else:
        print(f"revoked key {info['key_id']} (control offset {change.control_offset}; POST /v1/wait "
              f"{{\"control_offset\": {change.control_offset}}} returns once every process refuses it)")
    return 0
