"""The write path end to end: events -> embedded log -> four projections -> views, with the real
models. Replay, ordering, duplicates, forgetting and provenance are checked on view contents
(canonical dumps), not counts."""

from __future__ import annotations

import json
import random

import pytest

from streams.sealing import Opener
from schemas.ports.views import Boundary
from schemas.units import entity_id
from tests.e2e.helpers import assert_same_views, dumps, make_pipeline, publish, sample_items, strip_positions

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]


async def test_every_unit_points_back_to_its_raw_event(tmp_path, models):
    p, _ = make_pipeline(tmp_path, models)
    await p.start()
    try:
        results = await publish(p, sample_items())
        assert all(r.status == "accepted" for r in results)
        await p.process_until_caught_up()
        b = Boundary("demo", ("lisbon-trip",))
        units = p.store("hierarchy")
        turns, windows, episodes = (units.list_units(b, k) for k in ("turn", "window", "episode"))
        assert len(turns) == 15 and windows and episodes
        for u in turns + windows + episodes:
            for event_id, pos in zip(u.provenance.event_ids, u.provenance.log_positions):
                record = (await p.log.read(p.config.topic, pos.partition, pos.offset, max_records=1))[0]
                assert b"vegetarian" not in record.value  # the log holds the turn sealed
                event = Opener(p.keystore).open([record])[0].event
                assert event.event_id == event_id
                if u.kind == "turn":
                    assert u.text == event.full_text  # source text, never rewritten
        # Every view holds the conversation and answers for it.
        assert p.store("lexical").search("turn", "vegetarian", b, 3)[0].unit_id == next(t.unit_id for t in turns if "vegetarian" in t.text)
        vec = models[0].encode(["vegetarian"])[0]
        assert p.store("dense").search("turn", vec, b, 1)[0].unit_id in {t.unit_id for t in turns}
        graph = p.store("graph")
        maya = graph.align_entities(b, [entity_id("demo", "maya")], models[0].encode(["Maya"]), 1)[0][0]
        assert maya.score == 1.0 and maya.label in ("PERSON", "SPEAKER")  # the exact entity, found by the id of its name
        ppr = graph.personalized_pagerank(b, {maya.entity_id: 1.0}, 0.6)
        top = max(ppr, key=ppr.get)
        assert "Maya" in units.get_units("demo", [top])[top].text
        for s in await p.status():
            assert s.lag_events == 0 and s.lag_seconds == 0.0
    finally:
        await p.close()


async def test_replay_rebuilds_views_identical_to_incremental_ones(tmp_path, models):
    items = sample_items()
    p, _ = make_pipeline(tmp_path, models, runner={"batch_size": 3})
    await p.start()
    try:
        # Incremental: small batches, processed as they arrive, one turn arriving late.
        late = items.pop(4)
        for chunk in (items[:5], items[5:11], [late], items[11:]):
            await publish(p, chunk)
            await p.process_until_caught_up()
        incremental = dumps(p)
        generations = {}
        for view in ("hierarchy", "graph", "lexical", "dense"):
            generations[view] = await p.replay(view)
        assert all(g == 2 for g in generations.values())
        assert {v: p._live[v].generation for v in generations} == generations
        rebuilt = dumps(p)
    finally:
        await p.close()
    assert_same_views(incremental, rebuilt)


async def test_arrival_order_and_duplicates_do_not_change_the_views(tmp_path, models):
    items = sample_items()
    ordered, _ = make_pipeline(tmp_path / "ordered", models)
    shuffled, _ = make_pipeline(tmp_path / "shuffled", models, runner={"batch_size": 2})
    await ordered.start()
    await shuffled.start()
    try:
        await publish(ordered, items)
        await ordered.process_until_caught_up()
        mixed = random.Random(7).sample(items, len(items))
        for i in range(0, len(mixed), 4):
            await publish(shuffled, mixed[i:i + 4] + mixed[:2])  # with duplicates of the first two
            await shuffled.process_until_caught_up()
        await publish(shuffled, items)  # the whole conversation again
        await shuffled.process_until_caught_up()
        assert_same_views(strip_positions(dumps(ordered)), strip_positions(dumps(shuffled)))
    finally:
        await ordered.close()
        await shuffled.close()


async def test_forgetting_a_turn_removes_it_everywhere_and_repairs_the_session(tmp_path, models):
    items = sample_items()
    p, _ = make_pipeline(tmp_path / "forget", models)
    q, _ = make_pipeline(tmp_path / "never", models)
    await p.start()
    await q.start()
    try:
        victim = items[9]  # "Maya just told me she is vegetarian now…"
        await publish(p, items)
        await publish(p, [{"type": "ForgetRequested", "event_id": "forget-1", "tenant_id": "demo", "requested_at": "2026-05-01T00:00:00Z",
                           "scope": {"level": "turn", "conversation_id": "lisbon-trip", "event_id": victim["event_id"]}}])
        await p.process_until_caught_up()
        await publish(q, [i for i in items if i is not victim])
        await q.process_until_caught_up()
        forgotten = strip_positions(dumps(p))
        assert "vegetarian now" not in str(forgotten)
        # Same views as if the turn had never been published.
        assert_same_views(forgotten, strip_positions(dumps(q)))
        await publish(p, [{"type": "ForgetRequested", "event_id": "forget-2", "tenant_id": "demo", "requested_at": "2026-05-01T00:00:00Z",
                           "scope": {"level": "tenant"}}])
        await p.process_until_caught_up()
        b = Boundary("demo")
        assert p.store("hierarchy").list_units(b, "turn") == []
        assert p.store("lexical").search("turn", "Lisbon", b, 5) == []
        assert p.store("dense").search("turn", models[0].encode(["Lisbon"])[0], b, 5) == []
        assert p.store("graph").align_entities(b, [entity_id("demo", "maya")], models[0].encode(["Maya"]), 1) == [[]]
    finally:
        await p.close()
        await q.close()


async def test_consumer_redeliveries_and_gaps_neither_duplicate_nor_lose_view_writes(tmp_path, models):
    """What a faust agent sees around a rebalance: batches delivered again after the view already
    applied them (the group's commit lagged the view's positions), and batches that start past
    the view's position (the group's commit ran ahead of a fresh generation). The runner's
    `process` must leave the views exactly as a plain run does."""
    items = sample_items()
    straight, _ = make_pipeline(tmp_path / "straight", models)
    shuffled, _ = make_pipeline(tmp_path / "delivered", models)
    for p in (straight, shuffled):
        await p.start()
    try:
        for p in (straight, shuffled):
            await publish(p, items)
        await straight.process_until_caught_up()
        records = []
        for partition, end in (await shuffled.log.end_offsets(shuffled.config.topic)).items():
            records += await shuffled.log.read(shuffled.config.topic, partition, 0, max_records=end or 1)
        n = len(records)
        assert n == len(items)
        deliveries = [records[: n // 3], records[: n // 2],  # the first third delivered twice
                      records[2 * n // 3:],                  # a gap: the middle third is skipped by the consumer
                      records[n // 3: 2 * n // 3],           # ... and delivered late, after the view moved past it
                      records]                               # everything again
        for view in ("hierarchy", "lexical", "dense", "graph"):
            runner = shuffled._live[view].runner
            applied = [(await runner.process(batch)).records for batch in deliveries]
            assert sum(applied) == n, (view, applied)  # every record applied exactly once
        assert_same_views(strip_positions(dumps(straight)), strip_positions(dumps(shuffled)))
    finally:
        for p in (straight, shuffled):
            await p.close()


async def test_a_runner_rereads_positions_another_group_member_advanced(tmp_path, models):
    """Two consumers of a group write one (server-backed) view: after a rebalance a runner must
    not trust its cached positions, nor write positions of partitions it did not process."""
    from tests.conftest import turn

    p, _ = make_pipeline(tmp_path, models, log={"partitions": 2})
    await p.start()
    try:
        evs = [turn(i, conv=conv) for conv in ("c0", "c3") for i in range(4)]
        await publish(p, [json.loads(e.model_dump_json()) for e in evs])
        records = {}
        for part, end in (await p.log.end_offsets(p.config.topic)).items():
            records[part] = await p.log.read(p.config.topic, part, 0, max_records=end or 1)
        assert all(len(r) == 4 for r in records.values()), "the two conversations must land in different partitions"
        runner = p._live["lexical"].runner
        store = runner.store
        first, second = sorted(records)
        assert (await runner.process(records[first][:2])).records == 2
        # Another member of the group owned `second` meanwhile and applied all of it.
        other, _ = make_pipeline(tmp_path / "other", models, log={"partitions": 2})
        change_runner = other.projection("lexical", store)
        steps, _ = change_runner.handle(records[second])
        for s in steps:
            store.apply(s.change, s.positions)
        # Redelivered to this runner after the rebalance: already applied, so dropped.
        assert (await runner.process(records[second])).records == 0
        assert (await runner.process(records[first])).records == 2
        assert store.positions() == {first: 4, second: 4}
    finally:
        await p.close()
