"""Event log port: an append-only, partitioned, durable log with consumer groups (Kafka's model).

Behaviour every adapter guarantees (tests/contracts/test_event_log_contract.py):

- **Partitioning.** A record's partition is `default_partition(key, n)` (Kafka's murmur2
  partitioner), so all records of one key — one conversation — share a partition and a total
  order. Offsets are per partition, start at 0 and grow monotonically; an offset is never reused.
- **Durability.** `append` returns only after the records are durable (embedded: SQLite WAL
  commit with fsync; Kafka: acks=all). Records are immutable and retained forever on the
  source-of-record topic.
- **Partial appends.** When an append fails, it raises `AppendFailed` saying which records are
  in the log anyway (`appended[i]` is their position, None for the others) and why, so callers
  can report exactly what was committed. SQLite appends are one transaction (all or nothing);
  a Kafka batch may be split by the failure.
- **Append time.** Every record carries `append_time`, the log's own clock at append (Kafka:
  the broker's LogAppendTime). Lag in seconds and freshness are measured from it, never from
  the event's `occurred_at`.
- **Duplicates.** The log does not refuse a duplicate event id (Kafka cannot). Views
  deduplicate by event id.
- **Reading.** `read(topic, partition, offset)` returns records with offset >= `offset` in order;
  it may wait up to `max_wait` seconds for new records and returns [] on timeout.
- **Consumer groups.** `commit(group, topic, {partition: next_offset})` stores the position a
  group will resume from; groups are independent of each other. Committing never moves data.
- **Concurrency.** Several processes may append to and read from one log at once.
- **Errors.** Unknown topic -> LogError naming the topic; a backend that is down ->
  TransientError (retry with back-off).
- **Erasure.** `erase_before(topic, partition, offset)` removes a partition's records below an
  offset for good (the intake topic's plain records, once relayed sealed). Offsets are never
  reused. Embedded: deleted at once with secure_delete; Kafka: DeleteRecords, the broker deletes
  the segments wholly below the new log start (an open segment waits for its roll).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Protocol, Sequence, runtime_checkable

from aiokafka.partitioner import murmur2

from schemas.errors import LogError

Headers = tuple[tuple[str, bytes], ...]


@dataclass(frozen=True)
class NewRecord:
    key: str
    value: bytes
    headers: Headers = ()
    partition: int | None = None  # None: default_partition(key); set only to broadcast to every partition


@dataclass(frozen=True)
class Appended:
    topic: str
    partition: int
    offset: int
    append_time: float  # seconds since the epoch, the log's clock


@dataclass(frozen=True)
class LogRecord:
    topic: str
    partition: int
    offset: int
    key: str | None
    value: bytes
    append_time: float
    headers: Headers = field(default=())

    def header(self, name: str) -> bytes | None:
        for k, v in self.headers:
            if k == name:
                return v
        return None


class AppendFailed(LogError):
    """An append that failed after some of its records may have reached the log."""

    def __init__(self, appended: list["Appended | None"], cause: BaseException):
        super().__init__(str(cause))
        self.appended = appended
        self.cause = cause
        self.code, self.http_status = getattr(cause, "code", self.code), getattr(cause, "http_status", self.http_status)

    @property
    def transient(self) -> bool:
        from schemas.errors import TransientError

        return isinstance(self.cause, TransientError)


def default_partition(key: str, partitions: int) -> int:
    """Kafka's default partitioner (murmur2, positive, modulo), so both logs place keys alike."""
    return (murmur2(key.encode("utf-8")) & 0x7FFFFFFF) % partitions


def place(topic: str, records: Sequence[NewRecord], partitions: int) -> list[tuple[int, NewRecord]]:
    """(partition, record) for each record — its explicit partition or its key's — checked
    against the topic's partition count; shared by every adapter's `append`."""
    placed = [(r.partition if r.partition is not None else default_partition(r.key, partitions), r) for r in records]
    bad = [p for p, _ in placed if not 0 <= p < partitions]
    if bad:
        raise LogError(f"topic {topic!r} has partitions 0..{partitions - 1}, not {bad[0]}")
    return placed


@runtime_checkable
class EventLog(Protocol):
    backend: str  # "sqlite", "kafka": reported by status and search responses

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def ensure_topic(self, topic: str, partitions: int, *, retention_seconds: float | None = None) -> int:
        """Create the topic if missing (retention: forever, or `retention_seconds`). Returns its
        partition count, which may differ from `partitions` when the topic already existed."""
        ...

    async def erase_before(self, topic: str, partition: int, offset: int) -> None: ...

    async def partitions(self, topic: str) -> int: ...

    async def append(self, topic: str, records: Sequence[NewRecord]) -> list[Appended]:
        """Append durably; results are in the order of `records`."""
        ...

    async def read(
        self, topic: str, partition: int, offset: int, *, max_records: int = 500, max_wait: float = 0.0
    ) -> list[LogRecord]: ...

    async def end_offsets(self, topic: str) -> dict[int, int]:
        """Per partition, the offset the next appended record will get."""
        ...

    async def commit(self, group: str, topic: str, offsets: Mapping[int, int]) -> None: ...

    async def committed(self, group: str, topic: str) -> dict[int, int]:
        """Positions committed by `group`; partitions it never committed are absent."""
        ...
