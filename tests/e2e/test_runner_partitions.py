"""A runner told which partitions its group member owns (the Faust worker's catch-up) reads only
those, and re-reads their positions from the store first: another member may have advanced them
while they were assigned elsewhere, and applying that stretch again next to the other member's
writes is how a view gets a stale window (the rebalance test on real Kafka found it)."""

from __future__ import annotations

import pytest

from schemas.ports.event_log import NewRecord, default_partition
from streams.projections.hierarchy import HierarchyProjection
from streams.runner import ProjectionRunner
from tests.conftest import turn
from tests.e2e.helpers import make_pipeline

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]


def _two_conversations(partitions: int) -> tuple[str, str]:
    first = "c0"
    second = next(f"c{i}" for i in range(1, 100) if default_partition(f"t1/c{i}", partitions) != default_partition("t1/c0", partitions))
    return first, second


async def test_a_member_reads_only_its_partitions_and_their_positions_afresh(tmp_path, models):
    p, _ = make_pipeline(tmp_path, models)
    await p.start_log()
    a_store, b_store = p.backends.open_view("hierarchy", 1), p.backends.open_view("hierarchy", 1)

    def member(store) -> ProjectionRunner:
        return ProjectionRunner(log_=p.log, topic=p.config.topic, dlq_topic=p.config.dlq_topic,
                                projection=HierarchyProjection(store, p.config.policy), group="test", batch_size=100)

    a, b = member(a_store), member(b_store)
    try:
        n = len(await p.log.end_offsets(p.config.topic))
        c_a, c_b = _two_conversations(n)
        part_a, part_b = default_partition(f"t1/{c_a}", n), default_partition(f"t1/{c_b}", n)
        await p.log.append(p.config.topic, [NewRecord(f"t1/{c}", turn(i, conv=c).model_dump_json().encode())
                                            for i in range(4) for c in (c_a, c_b)])

        assert (await a.step(partitions={part_a})).records == 4
        assert a_store.positions() == {part_a: 4}  # the other member's partition is left alone

        # b owns both now (a rebalance) and gets further on a's partition
        await p.log.append(p.config.topic, [NewRecord(f"t1/{c_a}", turn(4, conv=c_a).model_dump_json().encode())])
        assert (await b.step(partitions={part_a, part_b})).records == 5

        # a owns its partition again: nothing left to apply there, and nothing of b's stretch applied twice
        assert (await a.step(partitions={part_a})).records == 0
        assert (await a.step(partitions=set())).records == 0
    finally:
        a_store.close()
        b_store.close()
        await p.close()
