"""The API key ring: the state of every key, folded from the key records on the control topic
(schemas/security.py), in the order the log gives them.

Freshness bound: before it authenticates a request, a ring whose last look at the log is older
than `refresh_seconds` (0.1 s by default) reads the control topic's end offset and applies what
is new. So a key change appended at time t is enforced by every process for every request that
arrives after t + refresh_seconds, whatever the process; `wait_enforced` (behind POST /v1/wait)
returns only after this process applied the record *and* that bound passed, which makes "after
the wait returns, every running process refuses the revoked key" true without the processes
talking to each other.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone

from schemas.control import control_topic
from schemas.ports.event_log import EventLog, NewRecord
from schemas.security import (
    KeyCreated,
    KeyRecord,
    KeyRevoked,
    KeyRotated,
    Principal,
    SessionEnded,
    decode_key_record,
    decode_session_record,
    encode_key_record,
    parse_token,
    secret_matches,
)


@dataclass
class KeyState:
    created: KeyCreated
    digests: list[tuple[str, datetime | None]]  # (sha256, valid until — None: no end)
    revoked_at: datetime | None = None
    rotated_at: datetime | None = None
    offsets: list[int] = field(default_factory=list)  # control-topic offsets of its records

    @property
    def key_id(self) -> str:
        return self.created.key_id

    def active(self, now: datetime) -> bool:
        return self.revoked_at is None and any(until is None or until > now for _, until in self.digests)

    def info(self, now: datetime) -> dict:
        c = self.created
        return {"key_id": c.key_id, "tenant_id": c.tenant_id, "role": c.role, "name": c.name, "created_at": c.at.isoformat(),
                "created_by": c.by, "rotated_at": self.rotated_at.isoformat() if self.rotated_at else None,
                "revoked_at": self.revoked_at.isoformat() if self.revoked_at else None,
                "previous_secret_valid_until": next((u.isoformat() for _, u in self.digests if u is not None and u > now), None),
                "active": self.active(now)}


class KeyRing:
    def __init__(self, log_: EventLog, topic: str, *, refresh_seconds: float = 0.1):
        self.log = log_
        self.topic = control_topic(topic)
        self.refresh_seconds = refresh_seconds
        self.keys: dict[str, KeyState] = {}
        self.ended_sessions: dict[str, datetime] = {}  # dashboard session id -> when it would have expired
        self.applied = 0  # next control-topic offset to apply
        self._checked = float("-inf")  # monotonic time of the last look at the log's end
        self._lock = asyncio.Lock()

    async def ensure_topic(self) -> None:
        await self.log.ensure_topic(self.topic, 1)

    # -- reading ------------------------------------------------------------------------------
    async def refresh(self, *, force: bool = False, max_age: float | None = None) -> None:
        """Apply what is new on the control topic if the last look is older than `max_age`
        (default: the refresh bound; `force`: look now)."""
        max_age = 0.0 if force else (self.refresh_seconds if max_age is None else max_age)
        if time.monotonic() - self._checked < max_age:
            return
        async with self._lock:
            if time.monotonic() - self._checked < max_age and not force:
                return
            started = time.monotonic()
            end = (await self.log.end_offsets(self.topic)).get(0, 0)
            while self.applied < end:
                records = await self.log.read(self.topic, 0, self.applied, max_records=1000)
                if not records:
                    break
                for rec in records:
                    record = decode_key_record(rec.value)
                    if record is not None:
                        self._apply(record, rec.offset)
                    elif (ended := decode_session_record(rec.value)) is not None:
                        self._end_session(ended)
                    self.applied = rec.offset + 1
            self._checked = started  # the look began before the records were read: the bound holds from there

    def _apply(self, record: KeyRecord, offset: int) -> None:
        state = self.keys.get(record.key_id)
        if isinstance(record, KeyCreated):
            if state is None:  # a re-used id (never made by memstream) keeps the first key
                self.keys[record.key_id] = KeyState(record, [(record.secret_sha256, None)], offsets=[offset])
            return
        if state is None:
            return
        state.offsets.append(offset)
        if isinstance(record, KeyRevoked):
            state.revoked_at = state.revoked_at or record.at
        elif isinstance(record, KeyRotated):
            # The previous current secret is valid until the grace period ends; older ones are gone.
            state.digests = [(record.secret_sha256, None)] + [(d, record.previous_valid_until) for d, until in state.digests if until is None]
            state.rotated_at = record.at

    def _end_session(self, record: SessionEnded) -> None:
        now = datetime.now(timezone.utc)
        if record.expires_at > now:
            self.ended_sessions[record.session_id] = record.expires_at
        for session_id in [s for s, until in self.ended_sessions.items() if until <= now]:
            del self.ended_sessions[session_id]  # an expired cookie is refused anyway: keep the set bounded

    def session_ended(self, session_id: str) -> bool:
        return session_id in self.ended_sessions

    async def end_session(self, session_id: str, expires_at: datetime) -> int:
        """Append a sign-out; returns its control-topic offset."""
        record = SessionEnded(session_id=session_id, expires_at=expires_at)
        [appended] = await self.log.append(self.topic, [NewRecord(key="session", value=record.model_dump_json().encode(), partition=0)])
        await self.refresh(force=True)
        return appended.offset

    async def authenticate(self, token: str | None) -> Principal | None:
        """The caller of a bearer token, or None (malformed, unknown, revoked, expired). A
        well-formed key this ring does not know may have been made a moment ago (by another
        process): the ring looks at the log once more before refusing it, at most every 10 ms."""
        await self.refresh()
        parsed = parse_token(token or "")
        key_id, secret = parsed if parsed else ("", "")
        if parsed and key_id not in self.keys:
            await self.refresh(max_age=0.01)
        state = self.keys.get(key_id)
        now = datetime.now(timezone.utc)
        digests = [d for d, until in state.digests if until is None or until > now] if state and state.revoked_at is None else []
        if not secret_matches(secret, digests) or state is None:
            return None
        c = state.created
        return Principal(key_id=c.key_id, role=c.role, tenant_id=c.tenant_id, name=c.name)

    def listing(self, tenant_id: str | None = None) -> list[dict]:
        now = datetime.now(timezone.utc)
        return [s.info(now) for s in sorted(self.keys.values(), key=lambda s: (s.created.at, s.key_id))
                if tenant_id is None or s.created.tenant_id == tenant_id]

    def has_active_key(self) -> bool:
        now = datetime.now(timezone.utc)
        return any(s.active(now) for s in self.keys.values())

    # -- writing ------------------------------------------------------------------------------
    async def append(self, record: KeyRecord) -> int:
        """Append a key record; returns its control-topic offset (what `wait_enforced` takes)."""
        [appended] = await self.log.append(self.topic, [NewRecord(key=record.key_id, value=encode_key_record(record), partition=0)])
        await self.refresh(force=True)
        return appended.offset

    async def wait_enforced(self, offset: int, timeout: float) -> bool:
        """True once the record at `offset` is applied here and every process must have seen it."""
        deadline = time.monotonic() + timeout
        while self.applied <= offset:
            if time.monotonic() >= deadline:
                return False
            await self.refresh(force=True)
            if self.applied <= offset:
                await asyncio.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
        await asyncio.sleep(self.refresh_seconds)  # other processes look at the log at least this often
        return True
