"""The synthetic fleet (services/bench/fleet.py): deterministic, resumable at any index, valid
events, and made of the measured tenants' own names and words."""

from __future__ import annotations

import re
from datetime import datetime, timezone

import pytest

from schemas.events import TurnRecorded
from services.bench.fleet import FleetShape, SyntheticFleet, Vocabulary

T0 = datetime(2023, 5, 7, 13, 0, tzinfo=timezone.utc)


def _turn(i: int, speaker: str, text: str) -> TurnRecorded:
    return TurnRecorded(event_id=f"m:{i}", tenant_id="measured", agent_id=speaker, conversation_id="c1", session_id="s1",
                        turn_index=i, speaker=speaker, text=text, occurred_at=T0)


MEASURED = [
    _turn(0, "Caroline", "Hey Melanie! I went to the support group in Boston yesterday, it was powerful."),
    _turn(1, "Melanie", "That sounds great, Caroline. My kids and I painted a lake sunrise last weekend."),
    _turn(2, "Caroline", "I am reading a book by Rothfuss and thinking about adoption agencies."),
    _turn(3, "Melanie", "We camped near the mountains with Oliver and roasted marshmallows."),
]


@pytest.fixture(scope="module")
def vocab() -> Vocabulary:
    return Vocabulary.from_turns(MEASURED)


def test_vocabulary_comes_from_the_measured_turns(vocab):
    assert vocab.speakers == ("Caroline", "Melanie")
    assert {"Boston", "Rothfuss", "Oliver", "Caroline"} <= set(vocab.names)
    assert "Hey" not in vocab.names and "That" not in vocab.names  # sentence openers are not names
    assert {"support", "group", "adoption", "marshmallows"} <= set(vocab.words) and all(w.islower() for w in vocab.words)
    assert sorted(vocab.lengths) == list(vocab.lengths) and len(vocab.lengths) == len(MEASURED)
    with pytest.raises(ValueError):
        Vocabulary.from_turns([])


def test_same_seed_same_fleet_and_resumable_at_any_index(vocab):
    shape = FleetShape(seed=11, tenants=3, turns_per_conversation=25, turns_per_session=6)
    a, b = SyntheticFleet(vocab, shape), SyntheticFleet(vocab, shape)
    whole = list(a.turns(0, 120))
    assert whole == list(b.turns(0, 120))
    assert whole[57:90] == list(b.turns(57, 90))  # a load that stopped at 57 resumes with the same events
    other = list(SyntheticFleet(vocab, FleetShape(seed=12, tenants=3, turns_per_conversation=25, turns_per_session=6)).turns(0, 120))
    assert [t.text for t in other] != [t.text for t in whole]
    assert len({t.event_id for t in whole}) == len(whole)


def test_shape_tenants_conversations_sessions(vocab):
    shape = FleetShape(seed=3, tenants=4, agents_per_tenant=3, turns_per_conversation=30, turns_per_session=10)
    turns = list(SyntheticFleet(vocab, shape).turns(0, 8 * 30))
    assert {t.tenant_id for t in turns} == {f"fleet-{k:05d}" for k in range(4)}
    by_conv: dict[str, list[TurnRecorded]] = {}
    for t in turns:
        by_conv.setdefault(t.conversation_id, []).append(t)
    assert len(by_conv) == 8
    for conv in by_conv.values():
        assert len({t.tenant_id for t in conv}) == 1 and len({t.agent_id for t in conv}) == 2
        assert len({t.speaker for t in conv}) == 2 and {t.speaker for t in conv} <= set(vocab.speakers)
        assert [t.session_id for t in conv[::10]] == ["session_1", "session_2", "session_3"]
        assert all(x.occurred_at <= y.occurred_at for x, y in zip(conv, conv[1:]))  # sessions move forward in time
    # agents belong to their tenant: an agent id never appears under two tenants
    owners: dict[str, set[str]] = {}
    for t in turns:
        owners.setdefault(t.agent_id, set()).add(t.tenant_id)
    assert all(len(v) == 1 for v in owners.values())


def test_turns_are_like_the_measured_ones(vocab):
    turns = list(SyntheticFleet(vocab, FleetShape(seed=5, turns_per_conversation=200)).turns(0, 2000))
    counts = [len(re.findall(r"[A-Za-z]+", t.text)) for t in turns]
    measured_mean = sum(vocab.lengths) / len(vocab.lengths)
    assert abs(sum(counts) / len(counts) - measured_mean) < 0.35 * measured_mean
    text = " ".join(t.text for t in turns)
    assert sum(text.count(n) for n in ("Boston", "Rothfuss", "Oliver")) > 50  # recurring measured entities
    assert re.search(r"on \d{1,2} [A-Z][a-z]+ 20\d\d", text)  # dates inside turns


def test_a_fleet_needs_two_agents_per_tenant(vocab):
    with pytest.raises(ValueError, match="2 agents"):
        SyntheticFleet(vocab, FleetShape(agents_per_tenant=1))
