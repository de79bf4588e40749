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
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    WithJsonSchema,
    model_validator,
)

from schemas import safejson
from schemas.errors import InvalidEvent
from schemas.rules import (
    FROM_LOG,
    HAS_CONTENT,
    ID_PATTERN,
    NAME_PATTERN,
    TENANT_PATTERN,
    YEAR_MAX,
    YEAR_MIN,
    Id,
    Integral,
    SafeInt,
    Time,
    bounded_utc,
    check_speaker,
    has_content,
)

# Limits are part of the contract (they are in the JSON Schema too). They keep one record well
# under Kafka's default 1 MB message size and keep encoder/NER cost per turn bounded.
MAX_TEXT_CHARS = 32_000
MAX_ATTACHMENTS = 16
MAX_ATTACHMENT_CHARS = 16_000
MAX_METADATA_KEYS = 64
MAX_ENCODED_BYTES = 512 * 1024

TenantId = Annotated[str, Field(pattern=TENANT_PATTERN, description="Tenant the record belongs to.")]
# Conversation, session, agent and event ids (schemas/rules.py states the rule).
Identifier = Id

# When a turn can have happened: the year as written in 1900-2199 (schemas/rules.py).
OCCURRED_MIN = datetime(YEAR_MIN, 1, 1, tzinfo=timezone.utc)
OCCURRED_MAX = datetime(YEAR_MAX + 1, 1, 1, tzinfo=timezone.utc)


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", str_strip_whitespace=False)


Text = Annotated[str, Field(pattern="^[^\\x00]*$")]  # no NUL: C strings downstream (and Lucene) end there


class Attachment(_Frozen):
    """Part of a turn that is not the utterance itself: an image caption, a tool's output…

    Attachment text is indexed as part of the turn's text (answers often depend on it).
    """

    kind: Literal["image_caption", "tool_output", "file", "link", "other"]
    text: Text = Field(default="", max_length=MAX_ATTACHMENT_CHARS)
    uri: str | None = Field(default=None, max_length=2048)
    mime_type: str | None = Field(default=None, max_length=255)


def _type_is_required(schema: dict[str, Any]) -> None:
    """`type` has a default for Python callers, but it is what selects the event class when a
    record is decoded (an event without one is refused), so the JSON Schema files and the OpenAPI
    document must say that producers send it."""
    required = schema.setdefault("required", [])
    if "type" not in required:
        required.insert(0, "type")


def _turn_schema(schema: dict[str, Any]) -> None:
    """The turn's cross-field rule in the schema too: text, or an attachment with text."""
    _type_is_required(schema)
    with_text = {"type": "object", "properties": {"text": {"type": "string", "pattern": HAS_CONTENT}}, "required": ["text"]}
    # inside allOf, so that code generators read it as a further constraint, not as alternatives to the properties
    schema["allOf"] = [{"anyOf": [
        {"properties": {"text": {"type": "string", "pattern": HAS_CONTENT}}},
        {"properties": {"attachments": {"type": "array", "contains": with_text}}, "required": ["attachments"]},
    ]}]


class _EventBase(_Frozen):
    model_config = ConfigDict(json_schema_extra=_type_is_required)

    event_id: Identifier = Field(description="Producer-chosen id, unique within the conversation (a UUID is best). "
                                             "Duplicates are harmless: views keep the first.")
    tenant_id: TenantId


MetadataKey = Annotated[str, Field(min_length=1, max_length=64)]
MetadataValue = Union[Annotated[str, Field(max_length=1024)], SafeInt, float, bool, None]
Speaker = Annotated[str, AfterValidator(check_speaker), Field(min_length=1, max_length=200),
                    WithJsonSchema({"type": "string", "minLength": 1, "maxLength": 200,
                                    "allOf": [{"pattern": NAME_PATTERN}, {"pattern": HAS_CONTENT}]})]


class TurnRecorded(_EventBase):
    """One turn of an agent conversation: an utterance, an action or a tool observation."""

    model_config = ConfigDict(json_schema_extra=_turn_schema)

    type: Literal["TurnRecorded"] = "TurnRecorded"
    schema_version: Literal[1] = 1
    agent_id: Identifier = Field(description="Agent that published the turn.")
    conversation_id: Identifier
    session_id: Identifier
    turn_index: Annotated[int, Integral] = Field(ge=0, le=10**9, description="Producer's index of the turn inside its session.")
    speaker: Speaker = Field(description="Who spoke: not blank, no control or bidirectional-control characters.")
    role: Literal["user", "assistant", "agent", "tool", "system"] = "user"
    text: Text = Field(max_length=MAX_TEXT_CHARS, description="What was said. A turn needs text or an attachment with text.")
    attachments: tuple[Attachment, ...] = Field(default=(), max_length=MAX_ATTACHMENTS)
    occurred_at: Time = Field(description="When the turn happened (not when it was ingested): RFC 3339 with a UTC offset, "
                                          f"written with a year in {YEAR_MIN}-{YEAR_MAX}.")
    metadata: dict[MetadataKey, MetadataValue] = Field(default_factory=dict, max_length=MAX_METADATA_KEYS)
    source_ref: str | None = Field(default=None, max_length=200,
                                   description="The producer's own reference for the turn (e.g. LoCoMo's dia_id).")
    supersedes: Identifier | None = Field(default=None, description="The event id of a turn of the same conversation that this "
                                                                    "turn corrects: searches return this turn instead, and the "
                                                                    "turn's history keeps both.")

    @model_validator(mode="after")
    def _has_content(self) -> "TurnRecorded":
        if not has_content(self.text) and not any(has_content(a.text) for a in self.attachments):
            raise ValueError("a turn needs text or an attachment with text")
        return self

    @property
    def full_text(self) -> str:
        """The utterance with its attachments, as indexed and shown as evidence."""
        return turn_text(self.text, self.attachments)


# The ids each level needs, present and not null (the model's rule, and the schema's oneOf).
SCOPE_NEEDS: dict[str, tuple[str, ...]] = {
    "tenant": (),
    "conversation": ("conversation_id",),
    "session": ("conversation_id", "session_id"),
    "turn": ("conversation_id", "event_id"),
    "agent": ("agent_id",),
}


def _scope_schema(schema: dict[str, Any]) -> None:
    schema["oneOf"] = [
        {"properties": {"level": {"const": level}, **{name: {"type": "string"} for name in needs}},
         "required": ["level", *needs]}
        for level, needs in SCOPE_NEEDS.items()
    ]


class ForgetScope(_Frozen):
    """What to forget. Wider scopes need fewer ids: a tenant scope needs none.

    `agent` is everything one agent said in the tenant, across its conversations.
    `occurred_before` narrows any level to the turns that happened before that time (retention
    is `level=tenant` with it). Turn, agent and `occurred_before` scopes are *partial*: the
    sessions they touch survive, recomputed from the turns left."""

    model_config = ConfigDict(json_schema_extra=_scope_schema)

    level: Literal["tenant", "conversation", "session", "turn", "agent"]
    conversation_id: Identifier | None = Field(default=None, description="For levels conversation, session and turn.")
    session_id: Identifier | None = Field(default=None, description="For level=session.")
    event_id: Identifier | None = Field(default=None, description="For level=turn: the TurnRecorded event to forget.")
    agent_id: Identifier | None = Field(default=None, description="For level=agent: the agent whose turns to forget.")
    occurred_before: Time | None = Field(default=None, description="Only turns that happened before this time (retention).")

    @model_validator(mode="after")
    def _ids_match_level(self) -> "ForgetScope":
        missing = [name for name in SCOPE_NEEDS[self.level] if getattr(self, name) is None]
        if missing:
            raise ValueError(f"level={self.level} requires {', '.join(missing)}")
        return self

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
    requested_at: Time
    reason: str | None = Field(default=None, max_length=1000)
    requested_by: str | None = Field(default=None, max_length=200,
                                     description="Who asked: the API key id, or cli:<user>@<host> (the audit trail).")


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


def validate_event(raw: Any, *, edge: bool = True) -> TurnRecorded | ForgetRequested:
    """Validate a decoded JSON value as an event (after upcasting). At the edge (`edge=True`:
    a request, an intake record) JSON types are taken strictly (`turn_index: true` or `"5"`,
    `schema_version: "1"` and numeric times are refused) and schemas/rules.py's edge rules
    apply; records read back from a log keep the rules they were accepted under."""
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
        if edge:
            return _EVENT_ADAPTER.validate_json(json.dumps(upcast(raw)), strict=True)
        return _EVENT_ADAPTER.validate_python(upcast(raw), context=FROM_LOG)
    except ValidationError as exc:
        errors = field_errors(exc)
        raise InvalidEvent(_summary(errors), errors) from None


def decode_event(value: bytes, *, edge: bool = False) -> TurnRecorded | ForgetRequested:
    """Bytes from the log -> event. Raises InvalidEvent with a reason for the dead-letter topic.
    `edge=True` for records that enter here (the intake topic), which meet the edge's rules."""
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
    return validate_event(raw, edge=edge)


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
