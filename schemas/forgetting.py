"""Control records of forgetting: the audit trail's own records and per-tenant retention.

They live on the control topic (`<topic>.control`, one partition, unlimited retention), next to
the key records and pause/resume, for the same reasons: every process reads them, they are
totally ordered, and they outlive the memory they are about — a forget destroys turns, never
these records. None of them holds text of anyone's memory: ids, scopes, key ids, times, counts.

- `ForgetCompleted`: the eraser finished one forget request on one partition (a tenant or agent
  forget is one request per partition, so it completes once per partition). It repeats who asked,
  for what scope and when, so the trail needs nothing from the event topic. The request's free
  text `reason` is not copied: it stays with the request on the log.
- `TenantRetentionSet`: turns of the tenant older than `retain_days` are forgotten automatically
  (streams/retention.py); 0 clears the setting. The newest record per tenant wins.
- `MemoryExported`: someone exported a tenant's memory (the data subject's right of access), and
  how many turns went out.

Readers of the control topic ignore records that are not theirs, so these decoders return None
for key records, pause/resume and anything foreign.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Annotated, Literal, Union

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from schemas import safejson
from schemas.events import ID_PATTERN, TENANT_PATTERN, ForgetScope

MAX_RETAIN_DAYS = 36_500  # a century: the cutoff must stay inside the range a turn's time may have


def _now() -> datetime:
    return datetime.now(timezone.utc)


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = 1
    tenant_id: str = Field(pattern=TENANT_PATTERN)


class ForgetCompleted(_Record):
    type: Literal["ForgetCompleted"] = "ForgetCompleted"
    forget_id: str = Field(pattern=ID_PATTERN, description="The ForgetRequested event's id.")
    scope: ForgetScope
    requested_by: str | None = Field(None, max_length=200)
    requested_at: AwareDatetime
    partition: int = Field(ge=0, description="The partition this completion is for.")
    offset: int = Field(ge=0, description="The request's offset in that partition.")
    partitions: int = Field(ge=1, description="How many partitions the request went to (all of them for a tenant or agent scope).")
    keys_destroyed: int = Field(ge=0, description="Data keys destroyed by this completion (0 when a retried completion found them gone).")
    records_erased: int = Field(ge=0, description="Plain records physically erased from the log.")
    completed_at: AwareDatetime = Field(default_factory=_now)
    eraser_seconds: float = Field(0.0, ge=0, description="Time the eraser spent on it (scan, destroy, erase).")


class TenantRetentionSet(_Record):
    type: Literal["TenantRetentionSet"] = "TenantRetentionSet"
    retain_days: int = Field(ge=0, le=MAX_RETAIN_DAYS, description="Forget turns that happened more than this many days ago; 0: keep forever.")
    at: AwareDatetime = Field(default_factory=_now)
    by: str = Field("", max_length=200, description="Who set it: an admin key id, or cli:<user>@<host>.")


class MemoryExported(_Record):
    type: Literal["MemoryExported"] = "MemoryExported"
    conversation_id: str | None = Field(None, pattern=ID_PATTERN)
    turns: int = Field(ge=0)
    complete: bool = Field(True, description="False when the export stopped before the end (the reader went away, the log failed).")
    at: AwareDatetime = Field(default_factory=_now)
    by: str = Field("", max_length=200)


ForgettingRecord = Union[ForgetCompleted, TenantRetentionSet, MemoryExported]
FORGETTING_RECORD_TYPES = ("ForgetCompleted", "TenantRetentionSet", "MemoryExported")
_ADAPTER: TypeAdapter = TypeAdapter(Annotated[ForgettingRecord, Field(discriminator="type")])


def encode_forgetting_record(record: ForgettingRecord) -> bytes:
    return record.model_dump_json().encode("utf-8")


def decode_forgetting_record(value: bytes) -> ForgettingRecord | None:
    """None for anything that is not one of these records (a foreign write must not wedge readers)."""
    try:
        raw = safejson.loads(value.decode("utf-8"))
    except ValueError:  # invalid UTF-8 or JSON, or JSON over the limits
        return None
    if not isinstance(raw, dict) or not isinstance(raw.get("type"), str) or raw["type"] not in FORGETTING_RECORD_TYPES:
        return None
    try:
        return _ADAPTER.validate_python(raw)
    except ValidationError:
        return None
