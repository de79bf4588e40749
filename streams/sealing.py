"""Sealing events on their way into the log, and opening them on their way out.

`Sealer.records(event, partitions)` turns an event into the log records memstream appends: a
TurnRecorded is sealed with its data key (made on first use, schemas/ports/keystore.py) and
carries its ids and time in headers; a ForgetRequested stays readable (ids, scope, reason).
`Opener.open(records)` gives back, per record, the event — or `FORGOTTEN` when the record's key
was destroyed (the record is forgotten memory: projections skip it), or the InvalidEvent that
says why it cannot be read (a dead letter). Keys are fetched once per batch.

Plain (unsealed) turns on the log — written by an older release, or by a foreign producer that
wrote to the event topic instead of the intake topic — are still read, so nothing already
accepted is lost; forgetting them destroys no key, so the eraser removes them from logs that can
erase (the embedded one) and tombstones their ids everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Sequence

from schemas.errors import InvalidEvent
from schemas.events import ForgetRequested, TurnRecorded, decode_event, encode_event, partition_key
from schemas.ports.event_log import Headers, LogRecord, NewRecord
from schemas.ports.keystore import DataKey, KeyStore, key_id
from schemas.sealing import envelope, new_secret, seal

FORGOTTEN = object()  # the record's key was destroyed: forgotten memory


class Forgotten(InvalidEvent):
    """A forgotten event id, published again: refused forever (the caller's item error)."""

    code = "forgotten"
    http_status = 409


def turn_headers(event: TurnRecorded, sealed_with: str | None) -> Headers:
    out = [("type", b"TurnRecorded"), ("schema_version", str(event.schema_version).encode()), ("tenant", event.tenant_id.encode()),
           ("conversation", event.conversation_id.encode()), ("session", event.session_id.encode()), ("agent", event.agent_id.encode()),
           ("event_id", event.event_id.encode()), ("occurred_at", event.occurred_at.isoformat().encode())]
    if sealed_with:
        out.append(("key_id", sealed_with.encode()))
    return tuple(out)


class Sealer:
    def __init__(self, keystore: KeyStore | None):
        self.keystore = keystore  # None: events go plain (tests of the write path without a key store)

    def refused(self, events: Sequence[TurnRecorded | ForgetRequested]) -> dict[int, str]:
        """index -> why, for turns whose event id was forgotten (refused forever)."""
        if self.keystore is None:
            return {}
        kids = {i: key_id(e.tenant_id, e.conversation_id, e.event_id) for i, e in enumerate(events) if isinstance(e, TurnRecorded)}
        gone = self.keystore.destroyed(set(kids.values()))
        return {i: (f"event {events[i].event_id!r} of conversation {events[i].conversation_id!r} was forgotten "
                    f"(forget {gone[k].forget_id}); a forgotten event id is refused forever: publish new memory with a new event id")
                for i, k in kids.items() if k in gone}

    def records(self, events: Sequence[TurnRecorded | ForgetRequested], partitions: int) -> list[list[NewRecord]]:
        """The log records of each event (a broadcast forget has one per partition). Turns whose
        key was destroyed meanwhile raise Forgotten (check `refused` first)."""
        turns = [e for e in events if isinstance(e, TurnRecorded)]
        keys: dict[str, DataKey] = {}
        if self.keystore is not None and turns:
            wanted = [DataKey(key_id(e.tenant_id, e.conversation_id, e.event_id), e.tenant_id, e.conversation_id, e.event_id, new_secret())
                      for e in turns]
            keys = self.keystore.put(wanted)  # durable and visible before the sealed records exist
        out = []
        for e in events:
            if isinstance(e, TurnRecorded):
                value = encode_event(e)
                kid = key_id(e.tenant_id, e.conversation_id, e.event_id)
                if self.keystore is not None:
                    if kid not in keys:
                        raise Forgotten(f"event {e.event_id!r} was forgotten while it was being published")
                    value = seal(value, keys[kid].secret, key_id=kid, tenant_id=e.tenant_id, conversation_id=e.conversation_id,
                                 event_id=e.event_id)
                out.append([NewRecord(partition_key(e.tenant_id, e.conversation_id), value, turn_headers(e, kid if self.keystore else None))])
                continue
            headers = (("type", b"ForgetRequested"), ("schema_version", str(e.schema_version).encode()), ("tenant", e.tenant_id.encode()))
            value = encode_event(e)
            if e.scope.broadcast:
                # A tenant (or an agent of it) spans every partition: the request goes to each, so
                # every partition's consumers see it in order with that partition's turns.
                out.append([NewRecord(f"{e.tenant_id}/*", value, headers, partition=p) for p in range(partitions)])
            else:
                out.append([NewRecord(partition_key(e.tenant_id, e.scope.conversation_id), value, headers)])
        return out


@dataclass
class Opened:
    event: TurnRecorded | ForgetRequested | None
    forgotten: bool = False
    error: InvalidEvent | None = None
    sealed: bool = False


class Opener:
    def __init__(self, keystore: KeyStore | None):
        self.keystore = keystore

    def open(self, records: Sequence[LogRecord]) -> list[Opened]:
        envs: list = []
        for r in records:
            try:
                envs.append(envelope(r.value))
            except InvalidEvent as exc:
                envs.append(exc)
        wanted = {e.key_id for e in envs if e is not None and not isinstance(e, InvalidEvent)}
        keys = self.keystore.get(wanted) if wanted and self.keystore is not None else {}
        gone = self.keystore.destroyed(wanted - set(keys)) if wanted and self.keystore is not None else {}
        out: list[Opened] = []
        for r, env in zip(records, envs):
            if isinstance(env, InvalidEvent):
                out.append(Opened(None, error=env))
                continue
            try:
                if env is None:
                    out.append(Opened(decode_event(r.value)))
                elif env.key_id in keys:
                    if env.key_id != key_id(env.tenant_id, env.conversation_id, env.event_id):
                        raise InvalidEvent(f"sealed record of event {env.event_id!r} names another event's key")
                    out.append(Opened(decode_event(env.open(keys[env.key_id].secret)), sealed=True))
                elif env.key_id in gone:
                    out.append(Opened(None, forgotten=True, sealed=True))
                elif self.keystore is None:
                    raise InvalidEvent("sealed record, but this process has no data key store (MEMSTREAM_KEYS_URL)")
                else:
                    raise InvalidEvent(f"sealed record of event {env.event_id!r} with key {env.key_id}, which this deployment's key store "
                                       "never held (a record from another deployment, or a key store restored without it)")
            except InvalidEvent as exc:
                out.append(Opened(None, error=exc))
        return out


def header_ids(record: LogRecord) -> dict[str, str] | None:
    """The ids and time a turn record carries in its headers (None: not a turn memstream wrote)."""
    if record.header("type") != b"TurnRecorded" or record.header("event_id") is None:
        return None
    h = {k: (record.header(k) or b"").decode("utf-8", "replace") for k in ("tenant", "conversation", "session", "agent", "event_id", "occurred_at")}
    return h


def occurred(value: str) -> datetime | None:
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None
