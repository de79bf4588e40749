"""JSON Schema files for producers written in other languages, generated from the models.

`memstream schemas export` rewrites schemas/jsonschema/*.json; a test fails when they are stale.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import TypeAdapter

from schemas.events import Event, ForgetRequested, TurnRecorded
from schemas.units import TraceUnit

DIRECTORY = Path(__file__).parent / "jsonschema"


def documents() -> dict[str, dict]:
    docs = {
        "TurnRecorded.v1.json": TurnRecorded.model_json_schema(),
        "ForgetRequested.v1.json": ForgetRequested.model_json_schema(),
        "Event.json": TypeAdapter(Event).json_schema(),
        "TraceUnit.json": TraceUnit.model_json_schema(),
    }
    for name, doc in docs.items():
        doc["$schema"] = "https://json-schema.org/draft/2020-12/schema"
        doc["$id"] = f"memstream/{name}"
    return docs


def _render(doc: dict) -> str:
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def export(directory: Path = DIRECTORY) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    out = []
    for name, doc in documents().items():
        path = directory / name
        path.write_text(_render(doc), encoding="utf-8")
        out.append(path)
    return out


def check(directory: Path = DIRECTORY) -> list[str]:
    """Names of files that are missing or differ from what the models generate."""
    stale = []
    for name, doc in documents().items():
        path = directory / name
        if not path.exists() or path.read_text(encoding="utf-8") != _render(doc):
            stale.append(name)
    return stale
