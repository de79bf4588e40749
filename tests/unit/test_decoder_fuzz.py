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
import math
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from schemas.control import ProjectionControl, decode_control, encode_control
from schemas.errors import InvalidEvent
from schemas.events import (
    MAX_ENCODED_BYTES,
    ForgetRequested,
    ForgetScope,
    TurnRecorded,
    decode_event,
    encode_event,
    validate_event,
)
from schemas.security import KeyCreated, KeyRevoked, KeyRotated, decode_key_record, digest, encode_key_record
from services.http_guard import MAX_DEPTH, UnsafeJSON, loads, parse_body

pytestmark = pytest.mark.unit

FUZZ = settings(derandomize=True, database=None, deadline=None, max_examples=600,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example])
ROUND_TRIP = settings(FUZZ, max_examples=300)
MAX_REASON = 2_000  # a reason says what is wrong in a bounded text, plus at most what it quotes of the input (field names)

# -- valid events ---------------------------------------------------------------------------------
_ID_CHARS = st.characters(min_codepoint=0x21, max_codepoint=0x2FF, exclude_categories=["Zs", "Cc"])
ids = st.text(_ID_CHARS, min_size=1, max_size=24)
tenants = st.from_regex(r"[a-z0-9][a-z0-9_-]{0,8}", fullmatch=True)
offsets = st.integers(-23 * 60, 23 * 60).map(lambda m: timezone(timedelta(minutes=m)))
moments = st.builds(lambda d, tz: d.replace(tzinfo=tz), st.datetimes(datetime(1900, 1, 2), datetime(2199, 12, 30)), offsets)
texts = st.text(st.characters(exclude_characters="\x00", exclude_categories=["Cs"]), max_size=60).filter(lambda t: t.strip())
metadata = st.dictionaries(st.text(min_size=1, max_size=16), st.one_of(
    st.none(), st.booleans(), st.integers(-(10**30), 10**30), st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=40)),
    max_size=4)

turns = st.builds(
    TurnRecorded, event_id=ids, tenant_id=tenants, agent_id=ids, conversation_id=ids, session_id=ids,
    turn_index=st.integers(0, 10**9), speaker=texts.map(lambda t: t[:200]), role=st.sampled_from(["user", "assistant", "agent", "tool", "system"]),
    text=texts, occurred_at=moments, metadata=metadata, source_ref=st.none() | ids,
)
forgets = st.builds(
    ForgetRequested, event_id=ids, tenant_id=tenants, requested_at=moments, reason=st.none() | st.text(max_size=40),
    scope=st.one_of(st.builds(ForgetScope, level=st.just("tenant")), st.builds(ForgetScope, level=st.just("conversation"), conversation_id=ids),
                    st.builds(ForgetScope, level=st.just("session"), conversation_id=ids, session_id=ids),
                    st.builds(ForgetScope, level=st.just("turn"), conversation_id=ids, event_id=ids)),
)
events = st.one_of(turns, forgets)
event_dicts = events.map(lambda e: json.loads(e.model_dump_json()))

# -- hostile values -------------------------------------------------------------------------------
LONE_SURROGATES = ("\ud800", "\udbff", "\udc00", "\udfff")
nasty_strings = st.one_of(
    st.text(max_size=30),
    st.tuples(st.text(max_size=10), st.sampled_from(LONE_SURROGATES), st.text(max_size=10)).map("".join),
    st.sampled_from(["", " ", "\x00", "a\x00b", "\u202e", "\ufeff", "\n", "NaN", "TurnRecorded\x00"]),
    st.sampled_from([40_000, 600_000]).map(lambda n: "x" * n),
)
nasty_numbers = st.one_of(
    st.integers(), st.integers(40, 4000).map(lambda d: 10**d), st.just(-(10**300)),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([math.nan, math.inf, -math.inf, -0.0, 1e308, 5e-324]),
)
scalars = st.one_of(st.none(), st.booleans(), nasty_numbers, nasty_strings)
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(nasty_strings, inner, max_size=3),
                           max_leaves=12)
VERSIONS = [0, 2, 3, 99, -1, 2**63, "1", "2", 1.0, 1.5, None, True, [], {}, [1]]
TYPES = ["turnrecorded", "TurnRecorded ", "", None, 1, 1.5, True, [], {}, ["TurnRecorded"], {"TurnRecorded": 1}, "KeyCreated",
         "ProjectionPaused", "TurnRecorded\x00", "\ud800"]


@st.composite
def mutated_events(draw):
    """A valid event with one to three things wrong: a field replaced by something hostile, a field
    dropped, an unknown field, a wrong or future schema_version, an unknown or ill-typed type."""
    event = draw(event_dicts)
    for _ in range(draw(st.integers(1, 3))):
        how = draw(st.sampled_from(["replace", "replace", "drop", "extra", "version", "type"]))
        if how == "replace":
            event[draw(st.sampled_from(sorted(event)))] = draw(json_values)
        elif how == "drop":
            event.pop(draw(st.sampled_from(sorted(event))), None)
        elif how == "extra":
            event[draw(nasty_strings)] = draw(json_values)
        elif how == "version":
            event["schema_version"] = draw(st.sampled_from(VERSIONS))
        else:
            event["type"] = draw(st.sampled_from(TYPES))
    return event


def dumps(value) -> bytes:
    """JSON as a careless producer writes it: NaN/Infinity as literals, lone surrogates escaped."""
    return json.dumps(value, allow_nan=True).encode()


def deep(depth: int, kind: str) -> bytes:
    if kind == "list":
        return b"[" * depth + b"]" * depth
    if kind == "object":
        return b'{"a":' * depth + b"1" + b"}" * depth
    return b'{"type": "TurnRecorded", "metadata": ' + b'{"k": ' * depth + b"1" + b"}" * depth + b"}"


records = st.one_of(
    st.binary(max_size=200),
    events.map(encode_event),                                                   # valid, to exercise the success path
    mutated_events().map(dumps),
    st.builds(lambda raw, at, junk: raw[:at] + junk + raw[at:], events.map(encode_event), st.integers(0, 200),
              st.sampled_from([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\x00", b"\xf4\x90\x80\x80", b"\x80"])),   # invalid UTF-8, NUL
    st.builds(deep, st.sampled_from([1, 2, 63, 64, 65, 200, 990, 1100, 5000, 100_000]), st.sampled_from(["list", "object", "metadata"])),
    st.builds(lambda d, neg: b'{"type": "TurnRecorded", "turn_index": ' + (b"-" if neg else b"") + b"9" * d + b"}",
              st.sampled_from([39, 40, 41, 500, 4300, 4301, 6000]), st.booleans()),
    st.sampled_from([b"", b"null", b"[]", b"{}", b"NaN", b"Infinity", b'{"type": "TurnRecorded", "metadata": {"k": 1e400}}', b"-1e999", b'"TurnRecorded"', b"\x00" * 10, b" " * (MAX_ENCODED_BYTES + 1),
                     b'{"type": "TurnRecorded"}' + b" " * MAX_ENCODED_BYTES, b"\xef\xbb\xbf{}"]),
)


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
