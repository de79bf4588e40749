"""How every benchmark ends: the report on stdout and, with --out, in a JSON file."""

from __future__ import annotations

import json
from pathlib import Path


def write_report(report: dict, out: Path | None, *, echo: bool = True) -> None:
    text = json.dumps(report, indent=2, default=str)
    if echo:
        print(text)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
