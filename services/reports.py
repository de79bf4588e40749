"""Writing a run's JSON report (eval, bench): one format for every command that leaves one."""

from __future__ import annotations

import json
from pathlib import Path


def write_json(report: dict, out: Path) -> None:
    """`report` as indented JSON at `out`, creating its folder."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
