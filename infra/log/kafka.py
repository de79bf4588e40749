"""Event log on Apache Kafka (aiokafka): the distributed twin of infra/log/sqlite.py.

How the port (schemas/ports/event_log.py) maps onto Kafka:

- `ensure_topic` creates topics with retention.ms=-1 (the source of record is kept forever) and
  message.timestamp.type=LogAppendTime, so a record's timestamp is the broker's append time.
- `append` sends each record to an explicit partition, `default_partition(key, n)` (or
  `NewRecord.partition`), through one idempotent producer with acks="all": placement is the
  embedded log's, a retried send is neither duplicated nor reordered, and an append returns
  only once every in-sync replica has the records.
- `read` uses one consumer per (topic, partition), assigned manually and positioned with seek:
  no group membership, no rebalances. The partition stays paused between reads, so an idle
  reader sends no fetches and a seek never queues behind a long-polling fetch.
- `commit` / `committed` keep group positions in Kafka's own __consumer_offsets (an OffsetCommit
  from a consumer that assigns the partitions itself; an OffsetFetch through the admin client),
  where Kafka's tools see them too.
- Topic lookups ask for the metadata of all topics: naming one topic in a metadata request lets
  a broker with auto.create.topics.enable (Kafka's default) create it, and an unknown topic must
  be a LogError, never a new one-partition topic.

Errors: unknown topic -> LogError naming it; broker unreachable or timing out -> TransientError;
any other broker refusal -> LogError.

URL: kafka://[USER@]host:port[,host:port][?replication_factor=N&sasl_mechanism=M] (N defaults to 1,
a single broker), kafka+ssl:// for TLS; credentials and TLS: infra/log/kafka_security.py.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator, Mapping, Sequence

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import (
    AuthenticationFailedError,
    AuthenticationMethodNotSupported,
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
    OffsetOutOfRangeError,
    SaslAuthenticationFailed,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
    for_code,
)
from aiokafka.structs import OffsetAndMetadata

from infra.log.kafka_security import KafkaSecurity
from schemas.errors import LogError, MemstreamError, TransientError
from schemas.ports.event_log import AppendFailed, Appended, LogRecord, NewRecord, place

log = logging.getLogger(__name__)

TOPIC_CONFIG = {"retention.ms": "-1", "message.timestamp.type": "LogAppendTime"}


@dataclass
class _Reader:
    consumer: AIOKafkaConsumer
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    position: int | None = None  # where the consumer stands; sequential reads skip the seek and keep its buffer


class KafkaEventLog:
    backend = "kafka"

    def __init__(self, bootstrap: str, *, replication_factor: int = 1, request_timeout: float = 30.0,
                 client_id: str = "memstream", security: KafkaSecurity | None = None):
        self.bootstrap = bootstrap
        self.replication_factor = replication_factor
        self.request_timeout = request_timeout
        self.security = security or KafkaSecurity()
        self._common = {"bootstrap_servers": bootstrap, "client_id": client_id,
                        "request_timeout_ms": int(request_timeout * 1000), **self.security.client_kwargs()}
        self._admin: AIOKafkaAdminClient | None = None
        self._producer: AIOKafkaProducer | None = None
        self._offsets: AIOKafkaConsumer | None = None  # end offsets only: no group, no assignment
        self._readers: dict[TopicPartition, _Reader] = {}
        self._committers: dict[tuple[str, str], AIOKafkaConsumer] = {}
        self._partitions: dict[str, int] = {}
        self._opening = asyncio.Lock()  # one client per key even when tasks ask at once

    # -- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        try:
            with self._errors("connecting"):
                try:
                    self._admin = AIOKafkaAdminClient(**self._common)
                    await self._admin.start()
                except KafkaConnectionError:
                    await self._diagnose()  # aiokafka reports a refused login as "unable to bootstrap"
                    raise
                self._producer = AIOKafkaProducer(acks="all", enable_idempotence=True, **self._common)
                await self._producer.start()
                self._offsets = await self._consumer()
        except BaseException:
            await self.close()
            raise

    async def _diagnose(self) -> None:
        """With SASL on, one direct connection tells a refused login (raised as such: a wrong
        password does not fix itself with retries) from a broker that is away."""
        if not self.security.sasl:
            return
        from aiokafka.conn import create_conn

        host, _, port = self.bootstrap.split(",")[0].rpartition(":")
        try:
            conn = await create_conn(host, int(port), request_timeout_ms=int(self.request_timeout * 1000), **self.security.client_kwargs())
        except (AuthenticationFailedError, SaslAuthenticationFailed, AuthenticationMethodNotSupported):
            raise
        except Exception:  # noqa: BLE001 - not a login problem: the original error stands
            return
        conn.close()

    async def close(self) -> None:
        clients = [r.consumer for r in self._readers.values()] + list(self._committers.values())
        clients += [c for c in (self._offsets, self._producer) if c is not None]
        for client in clients:
            try:
                await client.stop()
            except Exception as exc:  # noqa: BLE001 - closing must release every other client too
                log.warning("closing a Kafka client failed: %r", exc)
        if self._admin is not None:
            try:
                await self._admin.close()
            except Exception as exc:  # noqa: BLE001
                log.warning("closing the Kafka admin client failed: %r", exc)
        self._readers, self._committers = {}, {}
        self._admin = self._producer = self._offsets = None

    def _ready(self) -> tuple[AIOKafkaAdminClient, AIOKafkaProducer, AIOKafkaConsumer]:
        if self._admin is None or self._producer is None or self._offsets is None:
            raise LogError("the event log is not started; call start() first")
        return self._admin, self._producer, self._offsets

    async def _consumer(self, **options) -> AIOKafkaConsumer:
        # auto_offset_reset="none": a position out of range must surface, not jump to offset 0.
        # fetch_max_wait_ms: the broker holds a fetch on an idle partition this long, and a
        # fetch after a seek queues behind it; 100 ms keeps that wait short.
        consumer = AIOKafkaConsumer(enable_auto_commit=False, auto_offset_reset="none", fetch_max_wait_ms=100,
                                    **options, **self._common)
        try:
            await consumer.start()
        except BaseException:
            await consumer.stop()  # release the connections a failed start opened
            raise
        return consumer

    @contextmanager
    def _errors(self, doing: str) -> Iterator[None]:
        """Translate driver errors: transient ones mean "retry with back-off"."""
        try:
            yield
        except MemstreamError:
            raise
        except UnknownTopicOrPartitionError as exc:
            raise LogError(f"unknown topic or partition while {doing}: {exc}") from exc
        except (AuthenticationFailedError, SaslAuthenticationFailed, AuthenticationMethodNotSupported) as exc:
            who = f"as {self.security.username!r} " if self.security.username else ""
            raise LogError(f"Kafka at {self.bootstrap} refused to authenticate memstream {who}({type(exc).__name__}, "
                           f"{self.security.protocol} {self.security.mechanism if self.security.sasl else ''}) while {doing}: check the "
                           "user in MEMSTREAM_LOG_URL and MEMSTREAM_LOG_KAFKA_PASSWORD") from None
        except (KafkaError, OSError) as exc:  # OSError includes TimeoutError
            if isinstance(exc, KafkaError) and not (exc.retriable or isinstance(exc, KafkaTimeoutError)):
                raise LogError(f"Kafka at {self.bootstrap} refused {doing}: {exc}") from exc
            raise TransientError(f"Kafka at {self.bootstrap} is unavailable ({doing}): {exc!r}; "
                                 "retry once the broker is reachable (check MEMSTREAM_LOG_URL)") from exc

    # -- topics --------------------------------------------------------------------------
    async def ensure_topic(self, topic: str, partitions: int, *, retention_seconds: float | None = None) -> int:
        if partitions < 1:
            raise LogError("a topic needs at least one partition")
        admin = self._ready()[0]
        config = dict(TOPIC_CONFIG)
        if self.replication_factor >= 3:
            # With acks=all an append is acknowledged once this many replicas have it: one broker
            # may be lost without losing an acknowledged event, and appends stop (retriable) when
            # fewer are in sync rather than go on with one copy.
            config["min.insync.replicas"] = str(self.replication_factor - 1)
        if retention_seconds is not None:
            # Records older than this are deleted; a segment is deleted whole, so segments roll at
            # the same age (the bound is then twice this, plus the broker's retention check interval).
            ms = str(max(1, int(retention_seconds * 1000)))
            config.update({"retention.ms": ms, "segment.ms": ms})
        with self._errors(f"creating topic {topic!r}"):
            new = NewTopic(topic, partitions, self.replication_factor, topic_configs=config)
            _, code, message = (await admin.create_topics([new])).topic_errors[0][:3]
            if code and for_code(code) is not TopicAlreadyExistsError:
                raise for_code(code)(f"{topic}: {message}")
        if not code:
            self._partitions[topic] = partitions
            return partitions
        # It existed (perhaps created a moment ago by another process, and the metadata this
        # broker serves may lag behind the controller for a few milliseconds).
        for _ in range(50):
            if (n := await self._describe(topic)) is not None:
                self._partitions[topic] = n
                return n
            await asyncio.sleep(0.1)
        raise LogError(f"topic {topic!r} exists but the broker reports no partitions for it")

    async def partitions(self, topic: str) -> int:
        if topic not in self._partitions:
            n = await self._describe(topic)
            if n is None:
                raise LogError(f"unknown topic {topic!r}: create it first (memstream creates its topics on start)")
            self._partitions[topic] = n
        return self._partitions[topic]

    async def _describe(self, topic: str) -> int | None:
        # All topics, never this one by name: see the module docstring (auto-creation).
        admin = self._ready()[0]
        with self._errors(f"describing topic {topic!r}"):
            topics = await admin.describe_topics(None)
        return next((len(t["partitions"]) for t in topics if t["topic"] == topic and t["partitions"]), None)

    async def _partition(self, topic: str, partition: int) -> TopicPartition:
        n = await self.partitions(topic)
        if not 0 <= partition < n:
            raise LogError(f"topic {topic!r} has partitions 0..{n - 1}, not {partition}")
        return TopicPartition(topic, partition)

    # -- append --------------------------------------------------------------------------
    async def append(self, topic: str, records: Sequence[NewRecord]) -> list[Appended]:
        if not records:
            return []
        placed = place(topic, records, await self.partitions(topic))
        producer = self._ready()[1]
        # LogAppendTime topics: the broker's append time (ms). Topics created elsewhere with
        # CreateTime report the producer's clock instead.
        futures: list = []
        failure: BaseException | None = None
        try:
            with self._errors(f"appending to {topic!r}"):
                # send() only enqueues (the producer batches per partition); each future resolves
                # when the broker has acknowledged its record (or given up on it).
                for p, r in placed:
                    futures.append(await producer.send(topic, r.value, key=r.key.encode("utf-8"), partition=p, headers=list(r.headers) or None))
        except MemstreamError as exc:
            failure = exc
        done = list(await asyncio.gather(*futures, return_exceptions=True))  # the fate of every record enqueued
        if failure is None:
            failed = next((d for d in done if isinstance(d, BaseException)), None)
            if failed is not None:
                try:
                    with self._errors(f"appending to {topic!r}"):
                        raise failed
                except MemstreamError as exc:
                    failure = exc
        if failure is not None:
            # Records acknowledged before the failure are in the log; say which (a retry may
            # duplicate them, which the port allows: views deduplicate by event id).
            acked = [None if isinstance(d, BaseException) else Appended(topic, d.partition, d.offset, d.timestamp / 1000) for d in done]
            raise AppendFailed(acked + [None] * (len(placed) - len(acked)), failure) from failure
        return [Appended(topic, m.partition, m.offset, m.timestamp / 1000) for m in done]

    async def erase_before(self, topic: str, partition: int, offset: int) -> None:
        """Kafka's DeleteRecords: the partition's log start moves to `offset`; the segments wholly
        below it are deleted by the broker soon after (a segment still open waits for its roll)."""
        from aiokafka.admin import RecordsToDelete

        admin = self._ready()[0]
        with self._errors(f"deleting records of {topic!r} below offset {offset}"):
            await admin.delete_records({TopicPartition(topic, partition): RecordsToDelete(before_offset=offset)}, timeout_ms=30_000)

    # -- read ----------------------------------------------------------------------------
    async def read(self, topic: str, partition: int, offset: int, *, max_records: int = 500, max_wait: float = 0.0) -> list[LogRecord]:
        tp = await self._partition(topic, partition)
        reader = await self._reader(tp)
        offset = max(offset, 0)
        async with reader.lock:
            consumer = reader.consumer
            with self._errors(f"reading {topic!r} partition {partition}"):
                if reader.position != offset:
                    consumer.seek(tp, offset)
                reader.position = None  # unknown until this read succeeds
                consumer.resume(tp)
                try:
                    got = await self._fetch(consumer, tp, offset, max_records, max_wait)
                finally:
                    consumer.pause(tp)
                reader.position = got[-1].offset + 1 if got else offset
        return got

    async def _reader(self, tp: TopicPartition) -> _Reader:
        async with self._opening:
            if tp not in self._readers:
                with self._errors(f"reading {tp.topic!r}"):
                    consumer = await self._consumer()
                consumer.assign([tp])
                consumer.seek(tp, 0)  # a valid position, so the paused consumer never resets one itself
                consumer.pause(tp)
                self._readers[tp] = _Reader(consumer)
        return self._readers[tp]

    async def _fetch(self, consumer: AIOKafkaConsumer, tp: TopicPartition, offset: int, max_records: int,
                     max_wait: float) -> list[LogRecord]:
        loop = asyncio.get_running_loop()
        deadline, known_to_exist = loop.time() + max_wait, False
        while True:
            timeout_ms = max(0, int((deadline - loop.time()) * 1000))
            try:
                batch = (await consumer.getmany(tp, timeout_ms=timeout_ms, max_records=max_records)).get(tp)
            except OffsetOutOfRangeError:
                # Past the end: nothing to return. Before the start (a topic not created by
                # memstream, with retention): continue from the oldest record still there.
                start = (await consumer.beginning_offsets([tp]))[tp]
                if offset >= start:
                    return []
                consumer.seek(tp, offset := start)
                continue
            if batch:
                return [_record(m) for m in batch]
            if loop.time() < deadline:
                continue
            if known_to_exist:
                raise TransientError(f"Kafka at {self.bootstrap} did not deliver {tp.topic!r} partition "
                                     f"{tp.partition} from offset {offset} within {self.request_timeout:.0f}s")
            # Fetches run in the background, so "nothing yet" may only mean the fetch is in
            # flight: if records exist at `offset`, wait for them even when max_wait is over.
            high = consumer.highwater(tp)
            if (high is None or high <= offset) and offset >= (await consumer.end_offsets([tp]))[tp]:
                return []
            known_to_exist, deadline = True, loop.time() + self.request_timeout

    async def end_offsets(self, topic: str) -> dict[int, int]:
        tps = [TopicPartition(topic, p) for p in range(await self.partitions(topic))]
        consumer = self._ready()[2]
        with self._errors(f"reading end offsets of {topic!r}"):
            ends = await consumer.end_offsets(tps)
        return {tp.partition: ends[tp] for tp in tps}

    # -- consumer groups -----------------------------------------------------------------
    async def commit(self, group: str, topic: str, offsets: Mapping[int, int]) -> None:
        n = await self.partitions(topic)
        committer = await self._committer(group, topic, n)
        with self._errors(f"committing {group!r} on {topic!r}"):
            await committer.commit({TopicPartition(topic, p): OffsetAndMetadata(o, "") for p, o in offsets.items()})

    async def _committer(self, group: str, topic: str, n: int) -> AIOKafkaConsumer:
        key = (group, topic)
        async with self._opening:
            if key not in self._committers:
                with self._errors(f"connecting a committer for group {group!r}"):
                    consumer = await self._consumer(group_id=group)
                # aiokafka commits only for assigned partitions; assigning (rather than subscribing)
                # never joins the group, and paused at a valid position it never fetches.
                tps = [TopicPartition(topic, p) for p in range(n)]
                consumer.assign(tps)
                for tp in tps:
                    consumer.seek(tp, 0)
                consumer.pause(*tps)
                self._committers[key] = consumer
        return self._committers[key]

    async def committed(self, group: str, topic: str) -> dict[int, int]:
        admin = self._ready()[0]
        with self._errors(f"reading the positions of group {group!r}"):
            offsets = await admin.list_consumer_group_offsets(group)
        return {tp.partition: om.offset for tp, om in offsets.items() if tp.topic == topic and om.offset >= 0}


def _record(m) -> LogRecord:
    # Foreign producers may send non-UTF-8 keys or null values/headers; the port has str keys
    # and bytes values, so decode leniently instead of failing the whole batch.
    key = m.key.decode("utf-8", errors="replace") if m.key is not None else None
    headers = tuple((k, v if v is not None else b"") for k, v in m.headers)
    return LogRecord(m.topic, m.partition, m.offset, key, m.value if m.value is not None else b"", m.timestamp / 1000, headers)
