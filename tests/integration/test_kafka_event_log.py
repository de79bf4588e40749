"""The Kafka event log against a real broker, beyond the port contract
(tests/contracts/test_event_log_contract.py runs that against Kafka too): the topic settings
the delivery guarantee rests on, records from a foreign producer (kcat, i.e. librdkafka), an
unreachable broker, and the whole write path on Kafka."""

from __future__ import annotations

import shutil
import subprocess
import time
import uuid

import pytest

from schemas.errors import TransientError
from schemas.ports.event_log import NewRecord, default_partition
from tests.integration import servers
from tests.integration.servers import free_ports

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


@pytest.fixture
async def log(kafka_bootstrap):
    from infra.log.kafka import KafkaEventLog

    adapter = KafkaEventLog(kafka_bootstrap, security=servers.kafka_security())
    await adapter.start()
    yield adapter
    await adapter.close()


@pytest.fixture
def topic():
    return f"it-{uuid.uuid4().hex[:10]}"


async def test_topics_keep_records_forever_stamped_with_the_broker_clock(log, kafka_bootstrap, topic):
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    await log.ensure_topic(topic, 2)
    admin = AIOKafkaAdminClient(**servers.kafka_admin_kwargs(kafka_bootstrap))
    await admin.start()
    try:
        described = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
    finally:
        await admin.close()
    configs = {e[0]: e[1] for r in described for res in r.resources for e in res[4]}
    assert configs["retention.ms"] == "-1"
    assert configs["message.timestamp.type"] == "LogAppendTime"
    # append() reports the broker's stamp, the one every reader sees.
    appended = await log.append(topic, [NewRecord("k", b"v", (("h", b"\x00\xff"),))])
    [got] = await log.read(topic, appended[0].partition, 0)
    assert got.append_time == appended[0].append_time and abs(got.append_time - time.time()) < 30
    assert got.headers == (("h", b"\x00\xff"),) and got.key == "k"


async def test_records_from_a_foreign_producer_are_read_back(log, kafka_bootstrap, topic, tmp_path):
    kcat = shutil.which("kcat")
    if kcat is None:
        pytest.skip("INTEGRATION NOT RUN: kcat is not installed (apt-get install -y kcat; scripts/test.sh does it)")
    await log.ensure_topic(topic, 4)
    keys = [f"tenant-{i}/conv-{i}" for i in range(6)]
    lines = "".join(f"{k}:hello {i} from kcat\n" for i, k in enumerate(keys))
    # librdkafka's default partitioner hashes keys with CRC32; murmur2_random is Java's (and
    # memstream's) placement, which foreign producers must use to share partitions with us.
    subprocess.run([kcat, *servers.kcat_config(tmp_path), "-P", "-b", kafka_bootstrap, "-t", topic, "-K:", "-H", "source=kcat",
                    "-X", "partitioner=murmur2_random"], input=lines.encode(), check=True, timeout=60)
    records = []
    for p in range(4):
        records += await log.read(topic, p, 0, max_wait=10.0 if not records else 0.0)
    assert sorted((r.key, r.value) for r in records) == [(k, f"hello {i} from kcat".encode()) for i, k in enumerate(keys)]
    for r in records:
        assert r.partition == default_partition(r.key, 4)
        assert r.header("source") == b"kcat"
        assert abs(r.append_time - time.time()) < 60


async def test_unreachable_broker_is_a_transient_error():
    from infra.log.kafka import KafkaEventLog

    [port] = free_ports(1)  # nothing listens there
    log = KafkaEventLog(f"127.0.0.1:{port}")
    with pytest.raises(TransientError, match=f"127.0.0.1:{port}"):
        await log.start()
    await log.close()


async def test_the_write_path_on_kafka_builds_the_views_the_embedded_log_builds(tmp_path, models, kafka_bootstrap, topic):
    from streams.dlq import list_dead_letters
    from tests.e2e.helpers import assert_same_views, dumps, make_pipeline, publish, sample_items

    items = sample_items()
    junk = NewRecord(key="demo/lisbon-trip", value=b"not an event")
    built = {}
    for name, log_settings in (("sqlite", {}), ("kafka", servers.kafka_log(kafka_bootstrap, topic=topic))):
        p, settings = make_pipeline(tmp_path / name, models, log=log_settings, runner={"batch_size": 4})
        await p.start()
        try:
            await publish(p, items[:8])
            await p.log.append(p.config.topic, [junk])
            await p.process_until_caught_up()
            await publish(p, items[8:])
            await p.process_until_caught_up()
            built[name] = dumps(p)
            end = await p.log.end_offsets(p.config.topic)
            assert all(s.lag_events == 0 for s in await p.status())
            for view in ("hierarchy", "lexical", "dense", "graph"):
                assert await p.log.committed(f"memstream.{view}", p.config.topic) == {q: o for q, o in end.items() if o}
            dead = await list_dead_letters(p.log, p.config.dlq_topic)
            assert [d.value for d in dead] == [b"not an event"]
        finally:
            await p.close()
    # Same placement, same offsets, same views: positions are compared too.
    assert_same_views(built["sqlite"], built["kafka"])
