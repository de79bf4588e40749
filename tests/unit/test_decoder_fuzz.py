"""Every decoder of records and bodies against hostile input (hypothesis): random bytes, invalid
UTF-8, NUL bytes, deep JSON, integer literals thousands of digits long, NaN/Infinity, lone
surrogates, huge strings, wrong and future schema versions, unknown and ill-typed `type`s.

- `decode_event` (what every projection runs on every record) and `validate_event` (what the
  API runs on every item) return an event or raise InvalidEvent with a bounded reason and field
  errors that encode as strict JSON — never another exception, which the runner would dead-letter
  as a projection failure and `memstream dlq replay` would die on. An event they accept re-encodes
  to JSON the HTTP edge accepts and decodes back to itself: what the log accepts, the API would
  have accepted, and nothing changes on the way.
- `parse_body` (the HTTP edge) returns a value or raises UnsafeJSON; a value it returns encodes as
  strict UTF-8 JSON and is nested at most MAX_DEPTH deep.
- `decode_key_record` and `decode_control` (the control topic, read by every process) return a
  record or None — never raise: one foreign record there must not wedge authentication or the
  projections of every process.

Fixed seeds (derandomize) and no example database, so every run tries the same inputs.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from schemas.control import ProjectionControl, decode_control, encode_control
from schemas.errors import InvalidEvent
from schemas.events import decode_event, encode_event, validate_event
from schemas.security import KeyCreated, KeyRevoked, KeyRotated, decode_key_record, digest, encode_key_record
from services.http_guard import MAX_DEPTH, UnsafeJSON, loads, parse_body
from tests.hostile import dumps, event_dicts, events, json_values, moments, mutated_events, records, tenants

pytestmark = pytest.mark.unit

FUZZ = settings(derandomize=True, database=None, deadline=None, max_examples=600,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example])
ROUND_TRIP = settings(FUZZ, max_examples=300)
MAX_REASON = 2_000  # a reason says what is wrong in a bounded text, plus at most what it quotes of the input (field names)

def assert_explained(exc: InvalidEvent, given_size: int) -> None:
    assert 0 < len(str(exc)) <= MAX_REASON + given_size, str(exc)[:300]
    json.dumps(exc.errors, allow_nan=False).encode("utf-8")  # goes into dead letters and HTTP bodies as strict JSON
    for e in exc.errors:
        assert set(e) == {"loc", "msg", "type"} and len(e["msg"]) <= MAX_REASON


def assert_faithful(event) -> None:
    """Re-encoded, an accepted event is JSON the HTTP edge accepts, and decodes to itself."""
    data = encode_event(event)
    loads(data.decode("utf-8"))
    assert decode_event(data) == event


@FUZZ
@given(value=records)
def test_decode_event_accepts_or_explains_any_bytes(value):
    try:
        event = decode_event(value)
    except InvalidEvent as exc:
        assert_explained(exc, len(value))
    else:
        assert_faithful(event)


@FUZZ
@given(raw=st.one_of(mutated_events(), json_values, event_dicts, st.lists(event_dicts, max_size=2)))
def test_validate_event_accepts_or_explains_any_value(raw):
    try:
        event = validate_event(raw)
    except InvalidEvent as exc:
        assert_explained(exc, len(json.dumps(raw)))
    else:
        assert_faithful(event)


@ROUND_TRIP
@given(event=events)
def test_valid_events_round_trip(event):
    assert decode_event(encode_event(event)) == event
    assert validate_event(json.loads(event.model_dump_json())) == event


def _depth(value) -> int:
    stack, deepest = [(value, 1)], 0
    while stack:
        v, d = stack.pop()
        if isinstance(v, (list, dict)):
            deepest = max(deepest, d)
            stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


@FUZZ
@given(raw=records, ndjson=st.booleans(), lines=st.lists(records, max_size=3))
def test_parse_body_returns_safe_json_or_says_why(raw, ndjson, lines):
    body = b"\n".join([raw, *lines]) if ndjson else raw
    try:
        value = parse_body(body, ndjson)
    except UnsafeJSON as exc:
        assert str(exc)
        return
    json.dumps(value, allow_nan=False, ensure_ascii=False).encode("utf-8")
    assert all(_depth(item) <= MAX_DEPTH for item in (value if ndjson else [value]))


key_records = st.one_of(
    st.builds(KeyCreated, key_id=st.from_regex(r"[0-9a-f]{16}", fullmatch=True), role=st.just("writer"), tenant_id=tenants,
              secret_sha256=st.text("abc123", max_size=8).map(digest)),
    st.builds(KeyRevoked, key_id=st.from_regex(r"[0-9a-f]{16}", fullmatch=True)),
    st.builds(KeyRotated, key_id=st.from_regex(r"[0-9a-f]{16}", fullmatch=True), secret_sha256=st.text("abc123", max_size=8).map(digest),
              previous_valid_until=moments),
)
controls = st.builds(ProjectionControl, type=st.sampled_from(["ProjectionPaused", "ProjectionResumed"]),
                     projection=st.sampled_from(["hierarchy", "graph", "lexical", "dense"]), reason=st.text(max_size=30))


def _mutate_record(record: dict, field: str, value) -> bytes:
    return dumps({**record, field: value})


control_topic_records = st.one_of(
    records,
    st.builds(_mutate_record, key_records.map(lambda r: json.loads(encode_key_record(r))), st.sampled_from(
        ["type", "key_id", "role", "tenant_id", "schema_version", "at", "secret_sha256", "previous_valid_until"]), json_values),
    st.builds(_mutate_record, controls.map(lambda r: json.loads(encode_control(r))), st.sampled_from(
        ["type", "projection", "reason", "schema_version", "requested_at"]), json_values),
)


@FUZZ
@given(value=control_topic_records)
def test_control_topic_decoders_never_raise(value):
    key = decode_key_record(value)
    control = decode_control(value)
    assert key is None or isinstance(key, (KeyCreated, KeyRevoked, KeyRotated))
    assert control is None or isinstance(control, ProjectionControl)
    assert key is None or control is None  # one record is never both


@ROUND_TRIP
@given(key=key_records, control=controls)
def test_control_topic_records_round_trip(key, control):
    assert decode_key_record(encode_key_record(key)) == key and decode_control(encode_key_record(key)) is None
    assert decode_control(encode_control(control)) == control and decode_key_record(encode_control(control)) is None


# -- what the fuzzing found, pinned ---------------------------------------------------------------
DEEP = b"[" * 100_000 + b"]" * 100_000


@pytest.mark.parametrize("value, reason", [
    (b'{"type": []}', "unknown event type []"),                                  # was TypeError: unhashable type
    (b'{"type": {"TurnRecorded": 1}}', "unknown event type"),                     # was TypeError
    (b'{"type": "TurnRecorded", "schema_version": [1]}', "schema_version"),       # was TypeError (upcaster lookup)
    (DEEP, "nested more than 64"),                                                # was RecursionError
    (b'{"type": "TurnRecorded", "turn_index": ' + b"9" * 4301 + b"}", "digits"),   # was ValueError (int conversion limit)
    (b'{"type": "TurnRecorded", "metadata": {"k": NaN}}', "finite"),              # was accepted; re-encoded as null
    (b'{"type": "TurnRecorded", "metadata": {"k": 1e400}}', "finite"),            # was accepted as inf
    (b'{"type": "TurnRecorded", "event_id": "\\ud800"}', "surrogate"),            # was accepted; failed later in a store
    (json.dumps({"type": "x" * 100_000}).encode(), "unknown event type 'xxx"),    # was a 100 kB reason
])
def test_records_the_fuzzing_found_are_invalid_events_with_a_reason(value, reason):
    with pytest.raises(InvalidEvent, match=reason.replace("[", r"\[").replace("]", r"\]")) as exc:
        decode_event(value)
    assert len(str(exc.value)) < MAX_REASON


@pytest.mark.parametrize("value", [DEEP, b'{"type": "ProjectionPaused", "projection": "graph", "reason": ' + b"[" * 5000 + b"]" * 5000 + b"}",
                                   b'{"type": "KeyRevoked", "key_id": ' + b"1" * 5000 + b"}"])
def test_control_topic_records_the_fuzzing_found_are_ignored(value):
    assert decode_key_record(value) is None and decode_control(value) is None  # deep ones: was RecursionError, in every process


def test_number_literals_that_overflow_are_refused_at_the_edge():
    with pytest.raises(UnsafeJSON, match="finite"):  # was accepted as inf (and re-encoded as null on the log)
        parse_body(b'[{"metadata": {"k": 1e400}}]', ndjson=False)
