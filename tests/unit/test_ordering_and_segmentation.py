"""Turn order inside a conversation and the windows/episodes derived from it."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest

from schemas.ordering import order_turns
from schemas.units import HierarchyPolicy
from streams.segmentation import diff_units, episode_ranges, session_units, window_starts
from tests.contracts.builders import row

pytestmark = pytest.mark.unit


def test_order_is_time_then_index_then_agent_then_event_id_never_arrival():
    a = row(1, "a", agent="zed", minutes=5)
    b = row(1, "b", agent="amy", minutes=5)  # same time and index: agent id breaks the tie
    c = row(0, "c", minutes=5)
    d = row(9, "d", minutes=1)  # earlier time beats a smaller index
    for _ in range(20):
        shuffled = random.sample([a, b, c, d], 4)
        assert [t.text for t in order_turns(shuffled)] == ["d", "c", "b", "a"]


@pytest.mark.parametrize("n", range(0, 14))
def test_windows_cover_every_turn_and_start_on_the_stride_lattice(n):
    starts = window_starts(n, 5, 3)
    covered = {i for s in starts for i in range(s, min(s + 5, n))}
    assert covered == set(range(n))
    assert all(s % 3 == 0 for s in starts)
    # The set of windows only grows as turns arrive: ids stay stable.
    assert set(window_starts(n, 5, 3)) <= set(window_starts(n + 1, 5, 3))


def test_open_window_keeps_its_id_while_it_grows():
    policy = HierarchyPolicy(window_sizes=(5,), window_stride=3)
    rows = [row(i, f"text {i}") for i in range(7)]
    before = {u.unit_id: u for u in session_units(rows[:6], policy) if u.kind == "window"}
    after = {u.unit_id: u for u in session_units(rows, policy) if u.kind == "window"}
    grown = [uid for uid in before if len(after[uid].turn_ids) > len(before[uid].turn_ids)]
    assert grown and set(before) <= set(after)


def test_units_do_not_depend_on_arrival_order():
    policy = HierarchyPolicy(window_sizes=(4,), window_stride=2, episode_min_turns=3, episode_block=3)
    rows = [row(i, f"{'cats and dogs' if i < 6 else 'stock markets and bonds'} {i}") for i in range(12)]
    reference = session_units(rows, policy)
    for seed in range(5):
        assert session_units(random.Random(seed).sample(rows, len(rows)), policy) == reference


def test_episodes_split_on_time_gaps_and_topic_shifts():
    policy = HierarchyPolicy(window_sizes=(3,), window_stride=3, episode_block=3, episode_min_turns=3, episode_max_gap=timedelta(minutes=30))
    gap = [row(i, "same topic pottery clay", minutes=i if i < 4 else 200 + i) for i in range(8)]
    assert episode_ranges(order_turns(gap), policy) == [(0, 4), (4, 8)]
    topics = [row(i, "pottery clay kiln glaze" if i < 6 else "football match goal referee") for i in range(12)]
    assert episode_ranges(order_turns(topics), policy) == [(0, 6), (6, 12)]
    short = [row(i, f"anything {i}") for i in range(4)]
    assert episode_ranges(order_turns(short), HierarchyPolicy()) == [(0, 4)]


def test_units_carry_full_provenance():
    rows = [row(i, f"t{i}", partition=2) for i in range(5)]
    window = next(u for u in session_units(rows, HierarchyPolicy(window_sizes=(3,), window_stride=2)) if u.kind == "window")
    p = window.provenance
    assert p.event_ids == ("c1-s1-0", "c1-s1-1", "c1-s1-2")
    assert [(lp.partition, lp.offset) for lp in p.log_positions] == [(2, 0), (2, 1), (2, 2)]
    assert (p.turn_start, p.turn_end, p.session_id, p.tenant_id) == (0, 2, "s1", "t1")
    assert p.occurred_from == rows[0].occurred_at and p.occurred_to == rows[2].occurred_at
    assert window.text == "Ann: t0\nAnn: t1\nAnn: t2"


def test_diff_reports_changed_and_vanished_units():
    policy = HierarchyPolicy(window_sizes=(3,), window_stride=2)
    rows = [row(i, f"t{i}") for i in range(6)]
    full, fewer = session_units(rows, policy), session_units(rows[:3], policy)
    upserts, deletes = diff_units(full, fewer)
    assert {u.unit_id for u in upserts} <= {u.unit_id for u in fewer}
    assert set(deletes) == {u.unit_id for u in full} - {u.unit_id for u in fewer}
    assert diff_units(full, full) == ([], [])
