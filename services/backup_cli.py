"""`memstream backup DIR` and `memstream restore DIR [--forgets-from PATH]...` for the embedded
mode (services/backup.py: what is copied, in which order, and how forgets made after the backup
are re-applied)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def register(sub) -> None:
    s = sub.add_parser("backup", help="a consistent backup of the embedded data directory (also while serving)")
    s.add_argument("dir", type=Path, help="a new or empty directory")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_backup)
    s = sub.add_parser("restore", help="restore a backup into the data directory (stop serve/process first); re-applies later forgets")
    s.add_argument("dir", type=Path)
    s.add_argument("--forgets-from", type=Path, action="append", default=[], metavar="PATH",
                   help="a newer data directory, backup or keys.sqlite whose forgets to re-apply (the replaced directory's always are)")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_restore)


def cmd_backup(args: argparse.Namespace) -> int:
    from services.backup import backup
    from services.cli import _settings

    settings = _settings(args)
    manifest = backup(settings, args.dir)
    if args.json:
        print(json.dumps(manifest, indent=2))
    else:
        views = ", ".join(f"{v} gen {m['generation']}" for v, m in sorted(manifest["views"].items())) or "no views yet"
        events = sum(manifest["log_end_offsets"].get(settings.log.topic, {}).values())
        print(f"backed up {events} log records and {views} into {args.dir} in {manifest['seconds']:.2f}s "
              "(it holds memory and live data keys: keep it as safe as the data)")
    return 0


async def cmd_restore(args: argparse.Namespace) -> int:
    from services.backup import restore
    from services.cli import _settings

    result = await restore(_settings(args), args.dir, forgets_from=args.forgets_from)
    if args.json:
        print(json.dumps({"replaced": str(result.replaced) if result.replaced else None, "forgets_reapplied": result.forgets_reapplied,
                          "lexical_rebuilt": result.lexical_rebuilt, "notes": result.notes, "backup": result.manifest}, indent=2))
        return 0
    print(f"restored the backup of {result.manifest['created_at']}; {result.forgets_reapplied} forgotten turns made since are "
          "forgotten again (their keys destroyed; the views forget them as they catch up: memstream process/serve)")
    if result.replaced:
        print(f"the directory it replaced is kept at {result.replaced}: delete it once you are satisfied")
    for note in result.notes:
        print(note)
    return 0
