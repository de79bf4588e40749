"""Answer calibration: typed candidates resolved against session dates, deterministic checks."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from services.query.answers import calibrate, extract_candidates, gold_in_candidates, resolve_relative
from services.query.profile import absolute_interval, answer_type, build_profile, relative_interval

pytestmark = pytest.mark.unit

MAY8 = datetime(2023, 5, 8, 13, 56, tzinfo=timezone.utc)


@pytest.mark.parametrize("phrase,expected", [
    ("yesterday", "7 May 2023"), ("last week", "the week before 8 May 2023"), ("last Friday", "the Friday before 8 May 2023"),
    ("last year", "2022"), ("3 years ago", "2020"), ("last month", "April 2023"), ("next month", "June 2023"),
    ("two weekends ago", "two weekends before 8 May 2023"),
])
def test_relative_expressions_resolve_against_the_session_date(phrase, expected):
    assert resolve_relative(phrase, MAY8.date())[0] == expected


def test_candidates_are_typed_and_come_from_the_evidence():
    turns = [("t1", "I went to a LGBTQ support group yesterday and it was so powerful.", MAY8),
             ("t2", "We moved from Sweden 4 years ago, in June 2019.", MAY8)]
    dates = extract_candidates(turns, "date")
    assert [c.text for c in dates][:1] == ["7 May 2023"] and "June 2019" in [c.text for c in dates]
    assert all(c.kind == "date" for c in dates)
    assert "4" in [c.text for c in extract_candidates(turns, "number")]
    assert "Sweden" in [c.text for c in extract_candidates(turns, "place")]
    assert gold_in_candidates("7 May 2023", dates) and not gold_in_candidates("9 May 2023", dates)


def test_calibration_keeps_supported_answers_and_replaces_only_by_a_unique_candidate():
    ev = "[8 May 2023] Caroline: I went to a LGBTQ support group yesterday."
    cands = extract_candidates([("t1", "I went to a LGBTQ support group yesterday.", MAY8)], "date")
    assert calibrate("7 May 2023", "date", cands, ev)[0] == "7 May 2023"
    answer, info = calibrate("She went yesterday", "date", cands, ev)
    assert answer == "7 May 2023" and info["action"] == "replaced"
    two = cands + extract_candidates([("t2", "and again last year", MAY8)], "date")
    assert calibrate("I don't know", "date", two, ev)[0] == "I don't know"  # no unique candidate: keep a0
    assert calibrate("The answer is: pottery, dancing and chess", "list", [], "she loves pottery and chess")[0] == "pottery, chess"


@pytest.mark.parametrize("q,t", [
    ("When did Caroline go to the support group?", "date"), ("How long has she had her friends?", "duration"),
    ("How many children does Melanie have?", "number"), ("Where did Caroline move from?", "place"),
    ("Who did Jon meet?", "person"), ("Did Gina open a store?", "yesno"), ("What activities does Melanie do?", "list"),
    ("What is Caroline's identity?", "description"), ("Which city did they visit?", "place"),
])
def test_answer_type_from_question_form(q, t):
    assert answer_type(q) == t


def test_temporal_cues_absolute_and_relative_to_as_of():
    assert absolute_interval("What happened in May 2023?")[0].isoformat() == "2023-05-01"
    lo, hi = relative_interval("What did I do last week?", MAY8)
    assert (lo.isoformat(), hi.isoformat()) == ("2023-05-01", "2023-05-07")
    p = build_profile("What did Caroline tell Melanie about Sweden last week?", ["Caroline", "Melanie"], [("Sweden", "GPE", 38, 44)], MAY8)
    assert p.subject_speakers == ["Caroline", "Melanie"] and p.entities == ["sweden", "caroline", "melanie"]
    assert p.other_entities == ["sweden"] and p.relative and p.interval[0].isoformat() == "2023-05-01"
