"""The JSON Schema files producers use must match the models."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from schemas.export import DIRECTORY, check
from tests.conftest import turn

pytestmark = pytest.mark.unit


def test_committed_json_schemas_are_up_to_date():
    assert check() == [], "run `memstream schemas export` and commit the result"


def test_json_schema_accepts_real_events_and_rejects_bad_ones():
    schema = json.loads((DIRECTORY / "Event.json").read_text())
    jsonschema.validate(json.loads(turn(1).model_dump_json()), schema)
    sample = Path(__file__).resolve().parents[2] / "services/sample/conversation.jsonl"
    for line in sample.read_text().splitlines():
        jsonschema.validate(json.loads(line), schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**json.loads(turn(1).model_dump_json()), "turn_index": -1}, schema)
