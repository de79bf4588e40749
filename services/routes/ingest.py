"""Publishing events and waiting for them: POST /v1/events (writer), POST /v1/wait (reader)."""

from __future__ import annotations

import time
from collections import Counter
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from schemas.errors import (
    BadRequest,
    Forbidden,
    Forgotten,
    InvalidEvent,
    InvalidRequest,
    LogUnavailable,
    NotFound,
    TransientError,
)
from schemas.events import ForgetRequested, validate_event
from schemas.rules import MAX_SAFE_INT, Integral
from schemas.security import Principal
from services.backpressure import Backpressure
from streams.ingest import ItemResult
from services.routes.deps import Reader, Writer, state
from services.routes.models import WaitResult
from services.routes.responses import errors

router = APIRouter()

def events_body(max_batch: int) -> dict[str, Any]:
    """The request body of POST /v1/events: one event, a list, or {"events": [...]} as JSON, or
    JSON Lines (the list, one event per line). `EventIn` is the event schema with `tenant_id`
    optional (the key's tenant when left out); services/api.py adds it to the document."""
    batch = {"type": "array", "items": {"$ref": "#/components/schemas/EventIn"}, "minItems": 1, "maxItems": max_batch}
    return {
        "required": True,
        "content": {
            "application/json": {"schema": {"oneOf": [
                {"$ref": "#/components/schemas/EventIn"},
                batch,
                {"type": "object", "properties": {"events": batch}, "required": ["events"], "additionalProperties": False},
            ]}},
            "application/x-ndjson": {"schema": {**batch, "description": "JSON Lines: the events, one per line."}},
        },
    }


def _items(body: Any, max_batch: int) -> list[Any]:
    if isinstance(body, dict) and "events" in body:
        extra = sorted(set(body) - {"events"})
        if extra:
            raise InvalidRequest(f"unknown field(s) beside 'events': {', '.join(map(repr, extra))}",
                                 [{"loc": ["body", name], "msg": "Extra inputs are not permitted", "type": "extra_forbidden"}
                                  for name in extra])
        items = body["events"]
        if not isinstance(items, list):
            raise BadRequest("'events' must be a list of events")
    elif isinstance(body, list):
        items = body
    elif isinstance(body, dict):
        items = [body]
    else:
        raise BadRequest("send an event object, a list of events, or {\"events\": [...]}")
    if not items:
        raise BadRequest("no events in the request")
    if len(items) > max_batch:  # the document's maxItems: a request that does not match it (413 is for bytes)
        raise InvalidRequest(f"{len(items)} events in one request; the limit is {max_batch} (MEMSTREAM_API_MAX_BATCH)")
    return items


def _with_tenant(raw: Any, principal: Principal) -> Any:
    """`tenant_id` may be omitted: it defaults to the key's tenant."""
    if isinstance(raw, dict) and "tenant_id" not in raw and principal.tenant_id is not None:
        return {**raw, "tenant_id": principal.tenant_id}
    return raw


def _valid(raw: dict[str, Any]) -> bool:
    try:
        validate_event(raw)
    except InvalidEvent:
        return False
    return True


async def _publish(publisher, items: list[Any], principal: Principal) -> list[ItemResult]:
    """publish_items, except that a valid item naming no tenant under an admin key (which belongs to
    no tenant) is refused as forbidden, like every other request of an admin key naming none."""
    unnamed = {i for i, raw in enumerate(items)
               if principal.tenant_id is None and isinstance(raw, dict) and "tenant_id" not in raw and _valid({**raw, "tenant_id": "t"})}
    todo = [(i, raw) for i, raw in enumerate(items) if i not in unnamed]
    out: list[ItemResult | None] = [None] * len(items)
    for (i, _), result in zip(todo, await publisher.publish_items([raw for _, raw in todo], authorizer(principal))):
        result.index = i
        out[i] = result
    for i in unnamed:
        event_id = items[i].get("event_id")
        out[i] = ItemResult(i, "rejected", event_id if isinstance(event_id, str) else None, code=403, errors=[
            {"loc": ["tenant_id"], "msg": "an admin key belongs to no tenant: name the tenant (tenant_id)", "type": "forbidden"}])
    return [r for r in out if r is not None]


def _memory_by_tenant(items: list[Any]) -> Counter:
    """tenant -> events that add memory (everything but forgets, which are never held back)."""
    out: Counter = Counter()
    for raw in items:
        if isinstance(raw, dict) and raw.get("type") != ForgetRequested.model_fields["type"].default:
            tenant = raw.get("tenant_id")
            out[tenant if isinstance(tenant, str) else "?"] += 1
    return out


def authorizer(principal: Principal):
    """Per item: events of another tenant, and tenant-wide forgets from a non-admin, are refused."""

    def check(event) -> str | None:
        if not principal.may_access(event.tenant_id):
            return f"key {principal.key_id} may not publish to tenant {event.tenant_id!r}"
        if isinstance(event, ForgetRequested) and event.scope.level == "tenant" and not principal.is_admin:
            return "forgetting a whole tenant needs an admin key"
        return None

    return check


class ItemOutcome(BaseModel):
    index: int = Field(description="Position of the item in the request.")
    status: Literal["accepted", "rejected", "failed"]
    code: int = Field(description="The HTTP status this item alone would get: 200, 403, 409, 422, 503.")
    event_id: str | None = None
    partition: int | None = Field(None, description="Where it was appended (accepted items).")
    offset: int | None = None
    errors: list[dict[str, Any]] = Field(default_factory=list, description="Why it was not accepted.")


class EventsResult(BaseModel):
    accepted: int
    rejected: int
    positions: dict[int, int] = Field(description="partition -> offset after the accepted items: what POST /v1/wait takes.")
    items: list[ItemOutcome]


@router.post("/v1/events", summary="Publish one event or a batch (writer)", response_model=EventsResult,
             responses={207: {"model": EventsResult,
                              "description": "Some items accepted, some rejected (each item says why, with its own code)"},
                        **errors(409, _409="Every event of the request was forgotten before (a forgotten event id is refused "
                                           "forever); nothing was appended"),
                        **errors(429, _429="Over the key's rate limit (`rate_limited`), or the views are too far behind "
                                           "(`backlog_full`, see MEMSTREAM_API_MAX_BACKLOG); nothing was appended (Retry-After)")},
             openapi_extra={"requestBody": events_body(10_000)})
async def post_events(request: Request, principal: Writer):
    st = state(request)
    body = request.scope.get("state", {}).get("json")
    if body is None:
        raise BadRequest("no events in the request (send JSON, or JSON Lines as application/x-ndjson)")
    items = [_with_tenant(raw, principal) for raw in _items(body, st.settings.api.max_batch)]
    memory = _memory_by_tenant(items)
    if memory and st.backpressure.max_backlog > 0:
        try:
            sample = await st.monitor.sample(max_age=st.settings.ops.sample_seconds)
        except TransientError:
            sample = None  # the backlog cannot be measured now (e.g. the log is away): the publish says what is wrong
        if sample is not None:
            st.backpressure.admit(Backpressure.backlog(sample), memory)
    results = await _publish(st.publisher, items, principal)
    accepted = [r for r in results if r.status == "accepted"]
    st.backpressure.accepted(_memory_by_tenant([items[r.index] for r in accepted]))
    positions: dict[int, int] = {}
    for r in accepted:
        positions[r.partition] = max(positions.get(r.partition, 0), r.offset + 1)
    out = {"accepted": len(accepted), "rejected": len(results) - len(accepted), "positions": positions,
           "items": [r.as_dict() for r in results]}
    if accepted:
        return JSONResponse(out, status_code=200 if len(accepted) == len(results) else 207)
    codes = {r.code for r in results}
    if codes == {503}:
        raise LogUnavailable("the event log is unavailable; nothing was appended; retry", out["items"])
    if codes == {409}:
        raise Forgotten("every event of the request was forgotten before (a forgotten event id is refused forever; new memory "
                        "needs new event ids); nothing was appended", out["items"])
    if codes == {403}:
        raise Forbidden(f"none of the {len(results)} event(s) may be published with this key; nothing was appended", out["items"])
    raise InvalidEvent(f"none of the {len(results)} event(s) was accepted; nothing was appended", out["items"])


def default_wait(max_wait: float) -> float:
    """A wait's timeout when the request names none: 10 s, or the server's longest if shorter."""
    return min(10.0, max_wait)


PARTITION_PATTERN = "^(0|[1-9][0-9]{0,5})$"
Offset = Annotated[int, Field(ge=0, le=MAX_SAFE_INT), Integral]


def _positions_schema(schema: dict[str, Any]) -> None:
    """Partition keys by name (propertyNames), not as a pattern other keys may slip past."""
    positions = schema["properties"]["positions"]
    ((pattern, offset),) = positions.pop("patternProperties").items()
    positions.update(propertyNames={"pattern": pattern}, additionalProperties=offset)


class WaitRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra=_positions_schema)
    positions: dict[Annotated[str, Field(pattern=PARTITION_PATTERN)], Offset] = Field(
        default_factory=dict, description="partition -> offset to wait for (the `positions` of a POST /v1/events answer)")
    control_offset: Offset | None = Field(None, description="A key change's position (memstream keys …): wait until every "
                                                            "process enforces it")
    timeout_seconds: float = Field(10.0, ge=0, le=300, description="At most MEMSTREAM_API_MAX_WAIT_SECONDS; default 10 s, or "
                                                                   "that if shorter (the document served states this server's).")


@router.post("/v1/wait", summary="Wait until every view has processed up to the given positions (read-your-writes)",
             response_model=WaitResult, response_model_exclude_none=True,
             responses=errors(404, _404="A partition the topic does not have"))
async def post_wait(req: WaitRequest, request: Request, principal: Reader):
    st = state(request)
    limit = st.settings.api.max_wait_seconds
    if "timeout_seconds" not in req.model_fields_set:
        req = req.model_copy(update={"timeout_seconds": default_wait(limit)})
    if req.timeout_seconds > limit:
        raise InvalidRequest(f"timeout_seconds: at most {limit:g} on this server (MEMSTREAM_API_MAX_WAIT_SECONDS)",
                             [{"loc": ["body", "timeout_seconds"], "msg": f"must be at most {limit:g}", "type": "less_than_equal"}])
    positions = {int(p): offset for p, offset in req.positions.items()}
    partitions = await st.pipeline.log.partitions(st.settings.log.topic)
    bad = sorted(p for p in positions if p >= partitions)
    if bad:
        raise NotFound(f"partition(s) {bad} do not exist: the topic has partitions 0..{partitions - 1}")
    deadline = time.monotonic() + req.timeout_seconds
    if req.control_offset is not None:
        if not await st.keyring.wait_enforced(req.control_offset, req.timeout_seconds):
            return {"caught_up": False, "reason": f"the key change at control offset {req.control_offset} was not seen within "
                                                  f"{req.timeout_seconds:g}s"}
    done = await wait_for_views(st, positions, max(0.0, deadline - time.monotonic()))
    if not done:
        paused = await st.pipeline.paused_views()
        note = f" (paused: {', '.join(paused)}; `memstream resume NAME`)" if paused else ""
        return {"caught_up": False, "reason": f"views did not reach the positions within {req.timeout_seconds:g}s{note}"}
    return {"caught_up": True}


async def wait_for_views(st, target: dict[int, int], timeout: float) -> bool:
    """True once every view's live generation and the eraser have processed up to `target`.
    Positions come from the stores, so this works whoever runs the projections: this process,
    `memstream process`, or faust workers on other machines."""
    if st.runner_task is not None and st.projections is None:  # the projections run in this process
        return await st.pipeline.wait_for(target, timeout)
    return await st.position_watch.wait(target, timeout)
