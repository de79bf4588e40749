"""Event validation: clear, field-level errors for bad input; upcasting of old versions."""

from __future__ import annotations

import json

import pytest

from schemas import events as ev
from schemas.errors import InvalidEvent
from tests.conftest import turn

pytestmark = pytest.mark.unit


def good(**over):
    base = json.loads(turn(1).model_dump_json())
    base.update(over)
    return base


def errors_of(raw) -> list[tuple[str, str]]:
    with pytest.raises(InvalidEvent) as info:
        ev.validate_event(raw)
    return [(".".join(map(str, e["loc"])), e["msg"]) for e in info.value.errors]


def test_round_trip_through_bytes():
    t = turn(3, attachments=[ev.Attachment(kind="image_caption", text="a dog on a beach")])
    back = ev.decode_event(ev.encode_event(t))
    assert back == t and back.full_text == "turn 3 about topic 0 [image: a dog on a beach]"


@pytest.mark.parametrize("field", ["event_id", "tenant_id", "conversation_id", "session_id", "speaker", "occurred_at", "turn_index"])
def test_missing_fields_are_named(field):
    raw = good()
    del raw[field]
    assert (field, "Field required") in errors_of(raw)


def test_wrong_types_are_named():
    errs = dict(errors_of(good(turn_index="three", attachments="none", metadata=[1])))
    assert "turn_index" in errs and "attachments" in errs and "metadata" in errs


def test_oversize_text_is_rejected_with_the_limit():
    errs = errors_of(good(text="x" * (ev.MAX_TEXT_CHARS + 1)))
    assert errs[0][0] == "text" and str(ev.MAX_TEXT_CHARS) in errs[0][1]


def test_time_must_carry_an_offset_and_is_normalised_to_utc():
    assert "occurred_at" in dict(errors_of(good(occurred_at="2025-01-01T10:00:00")))
    t = ev.validate_event(good(occurred_at="2025-01-01T12:00:00+02:00"))
    assert t.occurred_at.isoformat() == "2025-01-01T10:00:00+00:00"


@pytest.mark.parametrize("bad", ["Upper", "has space", "", "a" * 64])
def test_tenant_ids_are_slugs(bad):
    assert "tenant_id" in dict(errors_of(good(tenant_id=bad)))


def test_nul_characters_blank_text_and_extra_fields_are_rejected():
    assert "text" in dict(errors_of(good(text="a\x00b")))
    assert any("needs text" in m for _, m in errors_of(good(text="   ")))
    assert "surprise" in dict(errors_of(good(surprise=1)))


def test_attachment_alone_is_enough_text():
    t = ev.validate_event(good(text="", attachments=[{"kind": "tool_output", "text": "42 rows"}]))
    assert t.full_text == "[tool output: 42 rows]"


def test_unknown_type_says_what_is_accepted():
    with pytest.raises(InvalidEvent, match="TurnRecorded, ForgetRequested"):
        ev.validate_event(good(type="TurnDeleted"))


def test_forget_scope_needs_ids_for_its_level():
    base = {"type": "ForgetRequested", "event_id": "f1", "tenant_id": "t1", "requested_at": "2025-01-01T00:00:00Z"}
    assert ev.validate_event({**base, "scope": {"level": "tenant"}}).scope.level == "tenant"
    with pytest.raises(InvalidEvent, match="requires conversation_id, session_id"):
        ev.validate_event({**base, "scope": {"level": "session"}})
    with pytest.raises(InvalidEvent, match="event_id"):
        ev.validate_event({**base, "scope": {"level": "turn", "conversation_id": "c"}})


def test_decode_errors_explain_the_bytes():
    with pytest.raises(InvalidEvent, match="not valid UTF-8"):
        ev.decode_event(b'{"text": "\xff\xfe"}')
    with pytest.raises(InvalidEvent, match="not valid JSON"):
        ev.decode_event(b'{"type": "TurnRecorded",')
    with pytest.raises(InvalidEvent, match="JSON object"):
        ev.decode_event(b"[1, 2]")
    with pytest.raises(InvalidEvent, match="limit"):
        ev.decode_event(b" " * (ev.MAX_ENCODED_BYTES + 1))


def test_old_versions_are_upcast(monkeypatch):
    old = good(schema_version=0)
    old["content"] = old.pop("text")
    with pytest.raises(InvalidEvent):
        ev.validate_event(old)

    def v0_to_v1(raw):
        raw["text"] = raw.pop("content")
        raw["schema_version"] = 1
        return raw

    monkeypatch.setitem(ev.UPCASTERS, ("TurnRecorded", 0), v0_to_v1)
    assert ev.validate_event(old).text == "turn 1 about topic 1"
