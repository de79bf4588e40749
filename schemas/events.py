"""Events: the immutable records agents publish. The log of these is the system of record.

Every event is a frozen pydantic model with `type` and `schema_version`. Producers in other
languages use the JSON Schema files exported from these models (`memstream schemas export`).
Old versions are upcast on decode (`UPCASTERS`), so projections only ever see the newest
shape and can `match` on the classes.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from typing import Annotated, Any, Callable, Literal, Union

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from schemas import safejson
from schemas.errors import InvalidEvent

# Limits are part of the contract (they are in the JSON Schema too). They keep one record well
# under Kafka's default 1 MB message size and keep encoder/NER cost per turn bounded.
MAX_TEXT_CHARS = 32_000
MAX_ATTACHMENTS = 16
MAX_ATTACHMENT_CHARS = 16_000
MAX_METADATA_KEYS = 64
MAX_ENCODED_BYTES = 512 * 1024

# Tenants end up in index/collection names on the servers: keep them lowercase and simple.
TENANT_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,62}$"
# Conversation, session, agent and event ids: printable, no surrounding whitespace.
ID_PATTERN = r"^[^\s\x00-\x1f\x7f](?:[^\x00-\x1f\x7f]{0,198}[^\s\x00-\x1f\x7f])?$"

TenantId = Annotated[str, Field(pattern=TENANT_PATTERN, description="Tenant the record belongs to.")]
Identifier = Annotated[str, Field(pattern=ID_PATTERN, min_length=1, max_length=200)]
MetadataValue = Union[str, int, float, bool, None]

_NUL = re.compile("\x00")

# When a turn can have happened: anything outside is a producer's bug (year 1, year 9999), and
# dates near the ends of Python's datetime range overflow as soon as anyone adds a week to them.
OCCURRED_MIN = datetime(1900, 1, 1, tzinfo=timezone.utc)
OCCURRED_MAX = datetime(2200, 1, 1, tzinfo=timezone.utc)


def bounded_utc(v: datetime) -> datetime:
    """An aware datetime in UTC inside [OCCURRED_MIN, OCCURRED_MAX), or ValueError saying so."""
    try:
        utc = v.astimezone(timezone.utc)
    except (OverflowError, ValueError):
        utc = None
    if utc is None or not OCCURRED_MIN <= utc < OCCURRED_MAX:
        raise ValueError(f"must lie between {OCCURRED_MIN.date()} and {OCCURRED_MAX.date()} (UTC)")
    return utc


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", str_strip_whitespace=False)


class Attachment(_Frozen):
    """Part of a turn that is not the utterance itself: an image caption, a tool's output…

    Attachment text is indexed as part of the turn's text (answers often depend on it).
    """

    kind: Literal["image_caption", "tool_output", "file", "link", "other"]
    text: str = Field(default="", max_length=MAX_ATTACHMENT_CHARS)
    uri: str | None = Field(default=None, max_length=2048)
    mime_type: str | None = Field(default=None, max_length=255)

    @field_validator("text")
    @classmethod
    def _no_nul(cls, v: str) -> str:
        if _NUL.search(v):
            raise ValueError("must not contain NUL characters")
        return v


def _type_is_required(schema: dict[str, Any]) -> None:
    """`type` has a default for Python callers, but it is what selects the event class when a
    record is decoded (an event without one is refused), so the JSON Schema files and the OpenAPI
    document must say that producers send it."""
    required = schema.setdefault("required", [])
    if "type" not in required:
        required.insert(0, "type")


class _EventBase(_Frozen):
    model_config = ConfigDict(json_schema_extra=_type_is_required)

    event_id: Identifier = Field(description="Producer-chosen id, unique within the conversation (a UUID is best). Duplicates are harmless: views keep the first.")
    tenant_id: TenantId


class TurnRecorded(_EventBase):
    """One turn of an agent conversation: an utterance, an action or a tool observation."""

    type: Literal["TurnRecorded"] = "TurnRecorded"
    schema_version: Literal[1] = 1
    agent_id: Identifier = Field(description="Agent that published the turn.")
    conversation_id: Identifier
    session_id: Identifier
    turn_index: int = Field(ge=0, le=10**9, description="Producer's index of the turn inside its session.")
    speaker: str = Field(min_length=1, max_length=200)
    role: Literal["user", "assistant", "agent", "tool", "system"] = "user"
    text: str = Field(max_length=MAX_TEXT_CHARS)
    attachments: tuple[Attachment, ...] = Field(default=(), max_length=MAX_ATTACHMENTS)
    occurred_at: AwareDatetime = Field(description="When the turn happened (not when it was ingested). Must carry a UTC offset, "
                                                   "and lie in [1900-01-01, 2200-01-01) UTC.")
    metadata: dict[str, MetadataValue] = Field(default_factory=dict)
    source_ref: str | None = Field(default=None, max_length=200, description="The producer's own reference for the turn (e.g. LoCoMo's dia_id).")
    supersedes: Identifier | None = Field(default=None, description="The event id of a turn of the same conversation that this turn corrects: "
                                                                    "searches return this turn instead, and the turn's history keeps both.")

    @field_validator("text", "speaker")
    @classmethod
    def _no_nul(cls, v: str) -> str:
        if _NUL.search(v):
            raise ValueError("must not contain NUL characters")
        return v

    @field_validator("speaker")
    @classmethod
    def _speaker_not_blank(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must not be blank")
        return v

    @field_validator("occurred_at")
    @classmethod
    def _utc(cls, v: datetime) -> datetime:
        return bounded_utc(v)

    @field_validator("metadata")
    @classmethod
    def _bounded_metadata(cls, v: dict[str, Any]) -> dict[str, Any]:
        if len(v) > MAX_METADATA_KEYS:
            raise ValueError(f"at most {MAX_METADATA_KEYS} keys")
        for key, value in v.items():
            if not key or len(key) > 64:
                raise ValueError("keys must be 1-64 characters")
            if isinstance(value, str) and len(value) > 1024:
                raise ValueError(f"value of {key!r} is longer than 1024 characters")
        return v

    @model_validator(mode="after")
    def _has_content(self) -> "TurnRecorded":
        if not self.text.strip() and not any(a.text.strip() for a in self.attachments):
            raise ValueError("a turn needs text or an attachment with text")
        return self

    @property
    def full_text(self) -> str:
        """The utterance with its attachments, as indexed and shown as evidence."""
        return turn_text(self.text, self.attachments)


class ForgetScope(_Frozen):
    """What to forget. Wider scopes need fewer ids: a tenant scope needs none.

    `agent` is everything one agent said in the tenant, across its conversations.
    `occurred_before` narrows any level to the turns that happened before that time (retention
    is `level=tenant` with it). Turn, agent and `occurred_before` scopes are *partial*: the
    sessions they touch survive, recomputed from the turns left."""

    level: Literal["tenant", "conversation", "session", "turn", "agent"]
    conversation_id: Identifier | None = None
    session_id: Identifier | None = None
    event_id: Identifier | None = Field(default=None, description="For level=turn: the TurnRecorded event to forget.")
    agent_id: Identifier | None = Field(default=None, description="For level=agent: the agent whose turns to forget.")
    occurred_before: AwareDatetime | None = Field(default=None, description="Only turns that happened before this time (retention).")

    @model_validator(mode="after")
    def _ids_match_level(self) -> "ForgetScope":
        need = {
            "tenant": (),
            "conversation": ("conversation_id",),
            "session": ("conversation_id", "session_id"),
            "turn": ("conversation_id", "event_id"),
            "agent": ("agent_id",),
        }[self.level]
        missing = [name for name in need if getattr(self, name) is None]
        if missing:
            raise ValueError(f"level={self.level} requires {', '.join(missing)}")
        return self

    @field_validator("occurred_before")
    @classmethod
    def _utc(cls, v: datetime | None) -> datetime | None:
        return None if v is None else bounded_utc(v)

    @property
    def partial(self) -> bool:
        """Whether whole sessions survive (recomputed) rather than vanish."""
        return self.level in ("turn", "agent") or self.occurred_before is not None

    @property
    def broadcast(self) -> bool:
        """Whether the scope spans conversations, so every partition must see the request."""
        return self.level in ("tenant", "agent")

    def covers(self, tenant_id: str, conversation_id: str, session_id: str, event_id: str, agent_id: str, occurred_at: datetime,
               request_tenant: str) -> bool:
        """Whether a turn with these ids lies inside the scope (the reference rule every store's
        query must agree with; tests/contracts check it)."""
        if tenant_id != request_tenant:
            return False
        if self.occurred_before is not None and not occurred_at < self.occurred_before:
            return False
        if self.level in ("conversation", "session", "turn") and conversation_id != self.conversation_id:
            return False
        if self.level == "session" and session_id != self.session_id:
            return False
        if self.level == "turn" and event_id != self.event_id:
            return False
        if self.level == "agent" and agent_id != self.agent_id:
            return False
        return True


class ForgetRequested(_EventBase):
    """Deletion is an event too: views drop everything inside the scope when they see it."""

    type: Literal["ForgetRequested"] = "ForgetRequested"
    schema_version: Literal[1] = 1
    scope: ForgetScope
    requested_at: AwareDatetime
    reason: str | None = Field(default=None, max_length=1000)
    requested_by: str | None = Field(default=None, max_length=200, description="Who asked: the API key id, or cli:<user>@<host> (the audit trail).")

    @field_validator("requested_at")
    @classmethod
    def _utc(cls, v: datetime) -> datetime:
        return bounded_utc(v)


Event = Annotated[Union[TurnRecorded, ForgetRequested], Field(discriminator="type")]
EVENT_TYPES: dict[str, type[BaseModel]] = {"TurnRecorded": TurnRecorded, "ForgetRequested": ForgetRequested}
_EVENT_ADAPTER: TypeAdapter = TypeAdapter(Event)

# (type, schema_version) -> function turning that version's dict into the next version's dict.
Upcaster = Callable[[dict[str, Any]], dict[str, Any]]
UPCASTERS: dict[tuple[str, int], Upcaster] = {}


def turn_text(text: str, attachments: tuple[Attachment, ...] | list[Attachment]) -> str:
    parts = [text.strip()] if text.strip() else []
    for a in attachments:
        if a.text.strip():
            label = "image" if a.kind == "image_caption" else a.kind.replace("_", " ")
            parts.append(f"[{label}: {a.text.strip()}]")
    return " ".join(parts)


def partition_key(tenant_id: str, conversation_id: str) -> str:
    """Records of one conversation share a partition, which gives them a total order."""
    return f"{tenant_id}/{conversation_id}"


def _upcaster(raw: dict[str, Any]) -> Upcaster | None:
    try:
        return UPCASTERS.get((raw.get("type"), raw.get("schema_version")))
    except TypeError:  # an unhashable type or schema_version (a list, an object): no upcaster; validation says what is wrong
        return None


def upcast(raw: dict[str, Any]) -> dict[str, Any]:
    seen = 0
    while (upcaster := _upcaster(raw)) is not None:
        raw = upcaster(dict(raw))
        seen += 1
        if seen > 32:
            raise InvalidEvent("upcaster loop: schema_version does not advance")
    return raw


def validate_event(raw: Any) -> TurnRecorded | ForgetRequested:
    """Validate a decoded JSON value as an event (after upcasting)."""
    if not isinstance(raw, dict):
        raise InvalidEvent("an event must be a JSON object", [{"loc": [], "msg": "expected an object", "type": "type_error"}])
    kind = raw.get("type")
    if not isinstance(kind, str) or kind not in EVENT_TYPES:  # a list or an object is no type (and unhashable)
        shown = repr(kind)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        raise InvalidEvent(
            f"unknown event type {shown}; accepted: {', '.join(EVENT_TYPES)}",
            [{"loc": ["type"], "msg": f"must be one of {list(EVENT_TYPES)}", "type": "literal_error"}],
        )
    try:
        return _EVENT_ADAPTER.validate_python(upcast(raw))
    except ValidationError as exc:
        errors = field_errors(exc)
        raise InvalidEvent(_summary(errors), errors) from None


def decode_event(value: bytes) -> TurnRecorded | ForgetRequested:
    """Bytes from the log -> event. Raises InvalidEvent with a reason for the dead-letter topic."""
    if len(value) > MAX_ENCODED_BYTES:
        raise InvalidEvent(f"record is {len(value)} bytes; the limit is {MAX_ENCODED_BYTES}")
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidEvent(f"record is not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
    try:
        raw = safejson.loads(text)  # the API's JSON rules: a record from a foreign producer gets no more leeway
    except json.JSONDecodeError as exc:
        raise InvalidEvent(f"record is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except safejson.UnsafeJSON as exc:
        raise InvalidEvent(f"record is not JSON memstream accepts: {exc}") from None
    return validate_event(raw)


def encode_event(event: TurnRecorded | ForgetRequested) -> bytes:
    data = event.model_dump_json(exclude_defaults=False).encode("utf-8")
    if len(data) > MAX_ENCODED_BYTES:
        raise InvalidEvent(f"event {event.event_id!r} encodes to {len(data)} bytes; the limit is {MAX_ENCODED_BYTES}")
    return data


def field_errors(exc: ValidationError) -> list[dict[str, Any]]:
    """pydantic errors -> the JSON shape the API returns (loc, msg, type), without echoing input."""
    out = []
    for err in exc.errors(include_url=False, include_input=False, include_context=False):
        loc = [part for part in err["loc"] if part not in EVENT_TYPES]  # drop the union tag
        out.append({"loc": loc, "msg": err["msg"], "type": err["type"]})
    return out


def _summary(errors: list[dict[str, Any]]) -> str:
    parts = [f"{'.'.join(str(p) for p in e['loc']) or '(event)'}: {e['msg']}" for e in errors[:5]]
    more = f" (+{len(errors) - 5} more)" if len(errors) > 5 else ""
    return "; ".join(parts) + more
