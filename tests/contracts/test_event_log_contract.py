"""Contract of the EventLog port (schemas/ports/event_log.py), run against every adapter.

The Kafka adapter runs against a real broker (the `kafka_bootstrap` fixture, integration tier);
each test uses its own topic and group names so adapters sharing one broker never see each
other's data."""

from __future__ import annotations

import asyncio
import multiprocessing
import time
import uuid

import pytest

from schemas.errors import LogError
from schemas.ports.event_log import NewRecord, default_partition

pytestmark = [pytest.mark.contract, pytest.mark.anyio]


def _sqlite_log(request, tmp_path):
    from infra.log.sqlite import SqliteEventLog

    return SqliteEventLog(tmp_path / "log.sqlite")


def _kafka_log(request, tmp_path):
    from infra.log.kafka import KafkaEventLog

    from tests.integration.servers import kafka_security

    return KafkaEventLog(request.getfixturevalue("kafka_bootstrap"), security=kafka_security())


ADAPTERS = {"sqlite": _sqlite_log, "kafka": _kafka_log}
NEEDS_SERVER = {"kafka"}


@pytest.fixture(params=[pytest.param(name, marks=pytest.mark.integration) if name in NEEDS_SERVER else name for name in sorted(ADAPTERS)])
async def log(request, tmp_path):
    adapter = ADAPTERS[request.param](request, tmp_path)
    await adapter.start()
    yield adapter
    await adapter.close()


@pytest.fixture
def topic():
    return f"contract-{uuid.uuid4().hex[:10]}"


def rec(key: str, n: int) -> NewRecord:
    return NewRecord(key=key, value=f"{key}:{n}".encode(), headers=(("n", str(n).encode()),))


async def test_keys_map_to_one_partition_with_dense_monotonic_offsets(log, topic):
    assert await log.ensure_topic(topic, 4) == 4
    keys = [k for _ in range(15) for k in ("a/x", "b/y", "c/z")]
    appended = []
    for start in range(0, len(keys), 9):
        appended += await log.append(topic, [rec(k, start + i) for i, k in enumerate(keys[start:start + 9])])
    for key, a in zip(keys, appended):
        assert a.partition == default_partition(key, 4)
    by_partition: dict[int, list[int]] = {}
    for a in appended:
        by_partition.setdefault(a.partition, []).append(a.offset)
    for offsets in by_partition.values():
        assert offsets == list(range(len(offsets)))  # dense, from 0, in append order
    end = await log.end_offsets(topic)
    assert sum(end.values()) == 45 and all(end[p] == len(v) for p, v in by_partition.items())


async def test_read_from_offset_returns_records_in_order_with_append_time(log, topic):
    await log.ensure_topic(topic, 1)
    before = time.time()
    await log.append(topic, [rec("k", i) for i in range(10)])
    got = await log.read(topic, 0, 4, max_records=3)
    assert [r.offset for r in got] == [4, 5, 6]
    assert [r.value for r in got] == [b"k:4", b"k:5", b"k:6"]
    assert got[0].header("n") == b"4" and got[0].key == "k"
    assert all(before - 5 <= r.append_time <= time.time() + 5 for r in got)
    assert [r.offset for r in await log.read(topic, 0, 8, max_records=100)] == [8, 9]
    assert await log.read(topic, 0, 10) == []


async def test_read_waits_for_new_records_then_times_out(log, topic):
    await log.ensure_topic(topic, 1)
    t0 = time.monotonic()
    assert await log.read(topic, 0, 0, max_wait=0.3) == []
    assert time.monotonic() - t0 >= 0.25

    async def later():
        await asyncio.sleep(0.2)
        await log.append(topic, [rec("k", 1)])

    task = asyncio.create_task(later())
    got = await log.read(topic, 0, 0, max_wait=5.0)
    await task
    assert [r.value for r in got] == [b"k:1"]


async def test_duplicates_are_not_refused(log, topic):
    await log.ensure_topic(topic, 2)
    a = await log.append(topic, [rec("k", 1), rec("k", 1)])
    assert a[0].offset != a[1].offset and a[0].partition == a[1].partition


async def test_consumer_groups_are_independent(log, topic):
    await log.ensure_topic(topic, 3)
    assert await log.committed("g1", topic) == {}
    await log.commit("g1", topic, {0: 5, 2: 1})
    await log.commit("g2", topic, {0: 7})
    await log.commit("g1", topic, {0: 6})
    assert await log.committed("g1", topic) == {0: 6, 2: 1}
    assert await log.committed("g2", topic) == {0: 7}


async def test_unknown_topic_is_a_clear_error(log, topic):
    with pytest.raises(LogError, match=topic):
        await log.append(topic, [rec("k", 1)])
    with pytest.raises(LogError, match=topic):
        await log.end_offsets(topic)
    # Asking about a missing topic never creates it (a Kafka broker auto-creates topics named in
    # metadata requests unless told otherwise), so it can still be made with its own partitions.
    assert await log.ensure_topic(topic, 3) == 3


async def test_existing_topic_keeps_its_partition_count(log, topic):
    assert await log.ensure_topic(topic, 3) == 3
    assert await log.ensure_topic(topic, 8) == 3
    assert await log.partitions(topic) == 3


# -- embedded-only properties (Kafka provides them by construction) --------------------------
def _append_from_process(path: str, topic: str, worker: int, n: int) -> None:
    from infra.log.sqlite import SqliteEventLog

    async def go():
        log = SqliteEventLog(path)
        await log.start()
        for i in range(n):
            await log.append(topic, [NewRecord(f"key-{i % 3}", f"{worker}:{i}".encode())])
        await log.close()

    asyncio.run(go())


async def test_sqlite_log_is_durable_and_safe_with_several_processes(tmp_path, topic):
    from infra.log.sqlite import SqliteEventLog

    path = tmp_path / "shared.sqlite"
    log = SqliteEventLog(path)
    await log.start()
    await log.ensure_topic(topic, 2)
    await log.close()
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_append_from_process, args=(str(path), topic, w, 60)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    reopened = SqliteEventLog(path)
    await reopened.start()
    seen = []
    for p, end in (await reopened.end_offsets(topic)).items():
        records = await reopened.read(topic, p, 0, max_records=10_000)
        assert [r.offset for r in records] == list(range(end))
        seen += [r.value for r in records]
    await reopened.close()
    assert sorted(seen) == sorted(f"{w}:{i}".encode() for w in range(4) for i in range(60))
