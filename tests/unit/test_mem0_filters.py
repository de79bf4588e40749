"""The Mem0 surface's filter grammar (mem0ai 2.2.1's, applied by the client to what is stored)
and its refusals, without a server: each case is a filter and the memories it must keep."""

from __future__ import annotations

import pytest

from memstream_client.compat.mem0 import NotSupported, ValidationError
from memstream_client.compat.mem0.filters import parse
from memstream_client.compat.mem0.plans import identity, record, turns_of
from memstream_client.errors import MemstreamError
from memstream_client.models import StoredTurn

pytestmark = pytest.mark.unit

MEMORIES = {
    "work": {"user_id": "alice", "category": "work", "priority": 8, "status": "open", "title": "Weekly Meeting notes",
             "created_at": "2025-03-02T10:00:00+00:00", "rating": 4.5, "archived": False},
    "trip": {"user_id": "alice", "agent_id": "travel", "category": "travel", "priority": 3, "status": "completed",
             "created_at": "2025-01-15T08:00:00+00:00", "archived": True},
    "food": {"user_id": "alice", "category": "food", "priority": 5, "title": "ramen places",
             "created_at": "2024-12-31T23:00:00+00:00"},
    "bob": {"user_id": "bob", "run_id": "r1", "category": "work", "priority": "9", "status": "open"},
}


def kept(filters: dict, platform: bool = False) -> set[str]:
    test = parse(filters, platform=platform, require_id=False).test
    return {name for name, fields in MEMORIES.items() if test(fields)}


@pytest.mark.parametrize("filters, names", [
    ({"user_id": "alice"}, {"work", "trip", "food"}),
    ({"user_id": "alice", "category": "work"}, {"work"}),
    ({"category": {"in": ["food", "travel"]}}, {"trip", "food"}),
    ({"category": ["food", "travel"]}, {"trip", "food"}),  # a list is `in`, as mem0's default store reads it
    ({"status": {"nin": ["completed"]}}, {"work", "food", "bob"}),  # nin, like ne, holds without the field
    ({"status": {"ne": "open"}}, {"trip", "food"}),
    ({"status": {"eq": "open"}}, {"work", "bob"}),
    ({"priority": {"gte": 5}}, {"work", "food"}),  # bob's "9" is a string: not a number
    ({"priority": {"gt": 3, "lte": 8}}, {"work", "food"}),  # several operators all apply
    ({"rating": {"lt": 5}}, {"work"}),
    ({"created_at": {"gte": "2025-01-01"}}, {"work", "trip"}),  # a date alone is its midnight, UTC
    ({"created_at": {"lt": "2025-01-01T00:30:00+01:00"}}, {"food"}),
    ({"title": {"contains": "Meeting"}}, {"work"}),
    ({"title": {"contains": "meeting"}}, set()),
    ({"title": {"icontains": "MEETING"}}, {"work"}),
    ({"title": "*"}, {"work", "food"}),
    ({"archived": {"ne": True}}, {"work", "food", "bob"}),
    ({"archived": False}, {"work"}),
    ({"priority": 1}, set()),
    ({"AND": [{"category": "work"}, {"priority": {"gte": 7}}, {"status": {"ne": "completed"}}]}, {"work"}),
    ({"OR": [{"category": "food"}, {"agent_id": "travel"}]}, {"trip", "food"}),
    ({"NOT": [{"category": "work"}, {"status": "completed"}]}, {"food"}),
    ({"user_id": "alice", "AND": [{"OR": [{"category": "work"}, {"category": "food"}]}, {"priority": {"gte": 5}},
                                  {"NOT": [{"status": "archived"}]}]}, {"work", "food"}),
    ({"AND": []}, set(MEMORIES)),
])
def test_the_grammar_keeps_what_mem0_documents(filters, names):
    assert kept(filters) == names


def test_equality_never_takes_a_bool_for_a_number():
    test = parse({"flag": 1}, require_id=False).test
    assert test({"flag": 1}) and test({"flag": 1.0}) and not test({"flag": True})
    assert parse({"flag": True}, require_id=False).test({"flag": True}) and not parse(
        {"flag": True}, require_id=False).test({"flag": 1})


@pytest.mark.parametrize("filters, named", [
    ({"user_id": "u", "invalid_operator": {"unknown": "value"}}, "Unsupported metadata filter operator: unknown"),
    ({"user_id": "u", "priority": {}}, "Unsupported metadata filter operator"),
    ({"user_id": "u", "OR": []}, "OR takes a non-empty list"),
    ({"user_id": "u", "NOT": {"category": "x"}}, "NOT takes a non-empty list"),  # a dict only on the platform
    ({"user_id": "u", "AND": {"category": "x"}}, "AND takes a list"),
    ({"user_id": "u", "AND": ["category"]}, "a filter is a dict"),
    ({"user_id": "u", "category": {"in": "food"}}, "in takes a list"),
    ({"user_id": "u", "title": {"contains": 3}}, "contains takes a string"),
    ({"user_id": "u", "priority": {"gte": "high"}}, "gte takes a number or an ISO 8601 date/time"),
    ({"category": "work"}, "filters must contain at least one of: user_id, agent_id, run_id"),
    ({"user_id": "al ice"}, "Invalid user_id: cannot contain whitespace"),
    ({"user_id": "  "}, "Invalid user_id: cannot be empty"),
    (["user_id"], "filters must be a dict"),
])
def test_a_filter_outside_the_grammar_is_a_validation_error_naming_what_is_wrong(filters, named):
    with pytest.raises(ValidationError, match=named) as refused:
        parse(filters)
    assert isinstance(refused.value, ValueError) and isinstance(refused.value, MemstreamError)


def test_the_ids_bound_the_search_and_the_rest_narrows_it():
    plain = parse({"user_id": " alice ", "run_id": 7})
    assert plain.ids == {"user_id": "alice", "run_id": "7"} and not plain.narrows
    assert plain.test({"user_id": "alice", "run_id": "7"}) and not plain.test({"user_id": "alice"})
    narrowed = parse({"user_id": "alice", "category": "work"})
    assert narrowed.ids == {"user_id": "alice"} and narrowed.narrows
    wide = parse({"user_id": "*", "agent_id": {"in": ["a", "b"]}})
    assert wide.ids == {} and wide.narrows and wide.test({"user_id": "x", "agent_id": "b"})


def test_the_platform_forms():
    flt = parse({"AND": [{"user_id": "alice"}, {"created_at": {"gte": "2025-01-01T00:00:00Z"}}]}, platform=True,
                require_id=False)
    assert flt.ids == {"user_id": "alice"} and flt.narrows
    only_ids = parse({"AND": [{"user_id": "alice"}, {"run_id": "r1"}]}, platform=True, require_id=False)
    assert only_ids.ids == {"user_id": "alice", "run_id": "r1"} and not only_ids.narrows
    assert kept({"NOT": {"category": "work"}}, platform=True) == {"trip", "food"}
    platform_record = {"metadata": {"topic": "colours"}, "keywords": "My favourite colour is green", "memory_ids": "m1"}
    assert parse({"metadata": {"topic": "colours"}}, platform=True, require_id=False).test(platform_record)
    assert parse({"keywords": {"icontains": "GREEN"}}, platform=True, require_id=False).test(platform_record)
    assert parse({"memory_ids": ["m0", "m1"]}, platform=True, require_id=False).test(platform_record)
    for field in ("categories", "app_id", "timestamp"):
        with pytest.raises(ValidationError, match=f"the filter field '{field}' is not supported"):
            parse({"AND": [{field: {"in": ["x"]}}]}, platform=True, require_id=False)


# -- what a filter sees: the stored ids, as given ----------------------------------------------------
def _stored(turn, **over) -> StoredTurn:
    return StoredTurn.model_validate({**turn.event(), "tenant_id": "acme", "partition": 0, "offset": 1, **over})


def test_a_memory_reads_back_the_ids_it_was_added_with_and_no_invented_agent():
    [said] = turns_of("I like green.", {"user_id": "bob"}, {"topic": "colours", "user_id": "mallory"}, None)
    assert said.agent_id == "mem0"  # memstream needs an agent; Mem0 results will not show this one
    assert said.metadata == {"topic": "colours", "user_id": "bob"}  # the identity comes from the arguments only
    ids, meta = identity(_stored(said))
    assert ids == {"user_id": "bob"} and meta == {"topic": "colours"}
    [named] = turns_of([{"role": "assistant", "content": "Noted.", "name": "Ada"}],
                       {"agent_id": "helper", "run_id": "s1"}, {"tags": ["a", "b"]}, 1700000000)
    assert named.conversation_id == "run-s1" and named.session_id == "s1" and named.agent_id == "helper"
    assert named.metadata["tags"] == '["a", "b"]' and named.occurred_at.year == 2023
    assert identity(_stored(named))[0] == {"agent_id": "helper", "run_id": "s1", "actor_id": "Ada"}
    native = _stored(said, metadata={"channel": "chat"}, conversation_id="trip", agent_id="sensor-7", session_id="d2")
    assert identity(native) == ({"user_id": "trip", "agent_id": "sensor-7", "run_id": "d2"}, {"channel": "chat"})


def test_a_filter_on_metadata_sees_the_stored_metadata_and_ids_of_a_memory():
    memory = {"id": "m1", "memory": "I like green.", "hash": "h", "metadata": {"topic": "colours"}, "user_id": "bob",
              "role": "user", "created_at": "2025-01-01T00:00:00+00:00", "updated_at": "2025-01-02T00:00:00+00:00"}
    fields = record(memory, platform=False)
    assert fields == {"topic": "colours", "user_id": "bob", "role": "user", "data": "I like green.", "hash": "h",
                      "created_at": "2025-01-01T00:00:00+00:00", "updated_at": "2025-01-02T00:00:00+00:00"}
    assert parse({"user_id": "bob", "topic": "colours", "updated_at": {"gt": "2025-01-01"}}).test(fields)


def test_features_memstream_lacks_are_refused_by_name():
    from memstream_client.compat.mem0.plans import refuse

    with pytest.raises(NotSupported, match="expiration_date is not supported"):
        refuse(expiration_date="2030-01-01")
    refuse(expiration_date=None, categories=None)  # not given: nothing to refuse
