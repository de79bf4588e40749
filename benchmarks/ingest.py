"""Ingest benchmark, kept for the commands quoted in older result figures; the product's verb is
`memstream bench ingest` (services/bench/ingest.py), which this runs with the same options.

    .venv/bin/python benchmarks/ingest.py [--locomo PATH] [--append-events N] [--batch-size N] [--out FILE]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["bench", "ingest", *sys.argv[1:]]))
