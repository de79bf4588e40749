"""The client's Kafka `Producer` (memstream_client.producer) against the real broker: it writes
plain events to `<topic>.intake` with memstream's keys and partitioner; memstream's intake relay
seals each onto the event topic (same partition as memstream's own producer would choose); a batch sent twice is the same events, which the views keep once."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from infra.settings import Settings
from schemas.events import partition_key
from schemas.ports.event_log import default_partition
from streams.intake import IntakeRelay
from streams.sealing import Opener
from tests.integration import servers

pytestmark = pytest.mark.integration


def test_the_producer_publishes_through_the_intake_topic(kafka_bootstrap, tmp_path):
    from memstream_client import Turn
    from memstream_client.producer import Producer
    from services.runtime import build_pipeline

    topic = f"prod{uuid.uuid4().hex[:8]}.events"
    settings = Settings.load(data_dir=tmp_path, log=servers.kafka_log(kafka_bootstrap, topic=topic, partitions=3, intake_retention_seconds=60))
    turns = [Turn(conversation_id=f"c{i % 4}", speaker="Ada", text=f"produced turn {i}", turn_index=i) for i in range(12)]

    async def run():
        pipeline = build_pipeline(settings, views=())
        await pipeline.start_log()
        try:
            async with Producer(kafka_bootstrap, topic, tenant_id="acme", **servers.kafka_security().client_kwargs()) as producer:
                placed = await producer.publish(turns)
                again = await producer.publish(turns)  # a retried batch: the same event ids
            assert {p for p, _ in placed} == {default_partition(partition_key("acme", t.conversation_id), 3) for t in turns}
            assert len(again) == len(turns)
            relay = IntakeRelay(pipeline.log, topic, settings.dlq_topic, pipeline.publisher())
            while await relay.step():
                pass
            end = await pipeline.log.end_offsets(topic)
            records = [r for p, off in end.items() for r in await pipeline.log.read(topic, p, 0, max_records=off + 1)]
            opened = Opener(pipeline.keystore).open(records)
            events = [o.event for o in opened]
            assert all(o.sealed for o in opened) and not any(b"produced turn" in r.value for r in records)
            assert sorted((e.event_id, e.text) for e in events) == sorted([(t.event_id, t.text) for t in turns] * 2)
            for r, e in zip(records, events):
                assert r.partition == default_partition(partition_key("acme", e.conversation_id), 3)
            intake_end = await pipeline.log.end_offsets(f"{topic}.intake")
            assert sum(intake_end.values()) == 2 * len(turns)
            assert await pipeline.log.committed(relay.group, relay.topic) == {p: o for p, o in intake_end.items() if o}  # all relayed
        finally:
            await pipeline.close()

    asyncio.run(run())
