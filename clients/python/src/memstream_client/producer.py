"""`Producer`: publish turns straight to Kafka, for fleets that already run it (the `kafka` extra:
aiokafka). It writes plain events to `<topic>.intake`, the topic memstream opens to producers
that hold no data keys: the intake relay validates each event, seals it with its own data key
onto the event topic and erases it from the intake topic (whose short retention bounds the rest).
Records are keyed `tenant/conversation` and placed by murmur2, Kafka's default partitioner (as
memstream's own producer places them), so a conversation stays in one partition and in order.

Event ids are idempotency keys here too: a send retried by the producer, or a batch sent again,
is one turn in every view."""

from __future__ import annotations

import json
from typing import Any

from memstream_client._http import as_events


class Producer:
    def __init__(self, bootstrap_servers: str, topic: str = "memstream.events", *, tenant_id: str,
                 **kafka_options: Any):
        """`topic` is memstream's event topic (MEMSTREAM_LOG_TOPIC); the producer writes to its
        `.intake` twin. `tenant_id` is put on every event that names none. `kafka_options` go to
        aiokafka's AIOKafkaProducer (security_protocol, sasl_mechanism, sasl_plain_username, …)."""
        try:
            from aiokafka import AIOKafkaProducer
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise ImportError("Producer needs aiokafka: pip install 'memstream-client[kafka]'") from exc
        self.topic = f"{topic}.intake"
        self.tenant_id = tenant_id
        self._producer = AIOKafkaProducer(bootstrap_servers=bootstrap_servers, acks="all", enable_idempotence=True,
                                          **kafka_options)

    async def start(self) -> None:
        await self._producer.start()

    async def stop(self) -> None:
        await self._producer.stop()

    async def __aenter__(self) -> "Producer":
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    async def publish(self, turns: Any) -> list[tuple[int, int]]:
        """Send turns or events; returns (partition, offset) of each on the intake topic once
        the broker has them (acks=all)."""
        futures = []
        for event in as_events(turns):
            event.setdefault("tenant_id", self.tenant_id)
            key = f"{event['tenant_id']}/{event.get('conversation_id', '')}".encode()
            value = json.dumps(event, ensure_ascii=False).encode()
            futures.append(await self._producer.send(self.topic, value, key=key))
        out = []
        for f in futures:
            meta = await f
            out.append((meta.partition, meta.offset))
        return out
