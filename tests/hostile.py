"""Hostile records and values, as hypothesis strategies: what the decoder fuzz tests
(tests/unit/test_decoder_fuzz.py) feed the decoders, and what the consumer fuzz tests
(tests/e2e/test_consumer_fuzz.py, tests/integration/test_kafka_consumer_fuzz.py) write straight
to the log: random bytes, invalid UTF-8, NUL bytes, deep JSON, integer literals thousands of
digits long, NaN/Infinity/1e400, lone surrogates, huge strings, wrong and future schema
versions, unknown and ill-typed types — and valid events to mix in."""

from __future__ import annotations

import json
import math
from datetime import datetime, timedelta, timezone

from hypothesis import strategies as st

from schemas.events import MAX_ENCODED_BYTES, ForgetRequested, ForgetScope, TurnRecorded, encode_event

# -- valid events ---------------------------------------------------------------------------------
_ID_CHARS = st.characters(min_codepoint=0x21, max_codepoint=0x2FF, exclude_categories=["Zs", "Cc"], exclude_characters="/")
ids = st.text(_ID_CHARS, min_size=1, max_size=24)
tenants = st.from_regex(r"[a-z0-9][a-z0-9_-]{0,8}", fullmatch=True)
offsets = st.integers(-23 * 60, 23 * 60).map(lambda m: timezone(timedelta(minutes=m)))
moments = st.builds(lambda d, tz: d.replace(tzinfo=tz), st.datetimes(datetime(1900, 1, 2), datetime(2199, 12, 30)), offsets)
texts = st.text(st.characters(exclude_characters="\x00", exclude_categories=["Cs"]), max_size=60).filter(lambda t: t.strip())
# Speakers: no control or bidirectional-control characters (schemas/rules.py)
names = st.text(st.characters(exclude_categories=["Cs", "Cc", "Cf"]), max_size=60).filter(lambda t: t.strip())
metadata = st.dictionaries(st.text(min_size=1, max_size=16), st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=40)),
    max_size=4)

turns = st.builds(
    TurnRecorded, event_id=ids, tenant_id=tenants, agent_id=ids, conversation_id=ids, session_id=ids,
    turn_index=st.integers(0, 10**9), speaker=names.map(lambda t: t[:200]), role=st.sampled_from(["user", "assistant", "agent", "tool", "system"]),
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
