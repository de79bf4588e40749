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


def test_the_schemas_require_the_type_that_selects_the_event_class():
    """Found by fuzzing the API from its OpenAPI document: `type` has a default in the models, so
    the schemas called it optional, yet an event without it is refused (it picks the class)."""
    from schemas.errors import InvalidEvent
    from schemas.events import validate_event

    untyped = {k: v for k, v in json.loads(turn(1).model_dump_json()).items() if k != "type"}
    with pytest.raises(InvalidEvent):
        validate_event(untyped)
    for name in ("Event.json", "TurnRecorded.v1.json"):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(untyped, json.loads((DIRECTORY / name).read_text()))
    forget = {"event_id": "f", "tenant_id": "t1", "requested_at": "2025-01-01T00:00:00Z", "scope": {"level": "tenant"}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(forget, json.loads((DIRECTORY / "ForgetRequested.v1.json").read_text()))
    jsonschema.validate({**forget, "type": "ForgetRequested"}, json.loads((DIRECTORY / "ForgetRequested.v1.json").read_text()))
