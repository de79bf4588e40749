"""Publishing events and waiting for them: POST /v1/events (writer), POST /v1/wait (reader)."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from schemas.errors import BadRequest, InvalidEvent, InvalidRequest, PayloadTooLarge, TransientError
from schemas.events import ForgetRequested
from schemas.security import Principal
from services.backpressure import Backpressure
from services.http_guard import error_body
from services.routes.deps import Reader, Writer, state

router = APIRouter()

EVENTS_BODY = {
    "required": True,
    "content": {
        "application/json": {"schema": {"oneOf": [
            {"$ref": "#/components/schemas/Event"},
            {"type": "array", "items": {"$ref": "#/components/schemas/Event"}},
            {"type": "object", "properties": {"events": {"type": "array", "items": {"$ref": "#/components/schemas/Event"}}},
             "required": ["events"]},
        ]}},
        "application/x-ndjson": {"schema": {"type": "string", "description": "One event per line (JSON Lines)."}},
    },
}


def _items(body: Any, max_batch: int) -> list[Any]:
    if isinstance(body, dict) and "events" in body:
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
    if len(items) > max_batch:
        raise PayloadTooLarge(f"{len(items)} events in one request; the limit is {max_batch}")
    return items


def _with_tenant(raw: Any, principal: Principal) -> Any:
    """`tenant_id` may be omitted: it defaults to the key's tenant."""
    if isinstance(raw, dict) and "tenant_id" not in raw and principal.tenant_id is not None:
        return {**raw, "tenant_id": principal.tenant_id}
    return raw


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


class WaitResult(BaseModel):
    caught_up: bool


@router.post("/v1/events", summary="Publish one event or a batch (writer)", response_model=EventsResult,
             openapi_extra={"requestBody": EVENTS_BODY, "responses": {
                 "207": {"description": "Some items accepted, some rejected (each item says why, with its own code)"},
                 "413": {"description": "Body or batch too large"},
                 "429": {"description": "Over the key's rate limit (`rate_limited`), or the views are too far behind "
                                        "(`backlog_full`, see MEMSTREAM_API_MAX_BACKLOG); nothing was appended (Retry-After)"}}})
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
    results = await st.publisher.publish_items(items, authorizer(principal))
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
        return JSONResponse(error_body("unavailable", "the event log is unavailable; nothing was appended; retry", out["items"]),
                            status_code=503, headers={"Retry-After": "1"})
    if codes == {409}:
        return JSONResponse(error_body("forgotten", "every event of the request was forgotten before (a forgotten event id is refused "
                                                    "forever; new memory needs new event ids); nothing was appended", out["items"]), status_code=409)
    if codes == {403}:
        return JSONResponse(error_body("forbidden", f"none of the {len(results)} event(s) may be published with this key; "
                                                    "nothing was appended", out["items"]), status_code=403)
    return JSONResponse(error_body(InvalidEvent.code, f"none of the {len(results)} event(s) was accepted; nothing was appended",
                                   out["items"]), status_code=422)


class WaitRequest(BaseModel):
    positions: dict[int, int] = Field(default_factory=dict, description="partition -> offset to wait for (the `positions` of a POST /v1/events answer)")
    control_offset: int | None = Field(None, ge=0, description="A key change's position (memstream keys …): wait until every process enforces it")
    timeout_seconds: float = Field(10.0, ge=0, le=300)


@router.post("/v1/wait", summary="Wait until every view has processed up to the given positions (read-your-writes)",
             response_model=WaitResult, responses={504: {"description": "Not reached within the timeout"}})
async def post_wait(req: WaitRequest, request: Request, principal: Reader):
    st = state(request)
    partitions = await st.pipeline.log.partitions(st.settings.log.topic)
    bad = sorted(p for p in req.positions if not 0 <= p < partitions)
    if bad:
        raise InvalidRequest(f"partition(s) {bad} do not exist: the topic has partitions 0..{partitions - 1}")
    deadline = time.monotonic() + req.timeout_seconds
    if req.control_offset is not None:
        if not await st.keyring.wait_enforced(req.control_offset, req.timeout_seconds):
            return JSONResponse(error_body("timeout", f"the key change at control offset {req.control_offset} was not seen within "
                                                      f"{req.timeout_seconds}s"), status_code=504)
    done = await wait_for_views(st, req.positions, max(0.0, deadline - time.monotonic()))
    if not done:
        paused = await st.pipeline.paused_views()
        note = f" (paused: {', '.join(paused)}; `memstream resume NAME`)" if paused else ""
        return JSONResponse(error_body("timeout", f"views did not reach the positions within {req.timeout_seconds}s{note}"),
                            status_code=504)
    return {"caught_up": True}


async def wait_for_views(st, target: dict[int, int], timeout: float) -> bool:
    """True once every view's live generation and the eraser have processed up to `target`.
    Positions come from the stores, so this works whoever runs the projections: this process,
    `memstream process`, or faust workers on other machines."""
    if st.runner_task is not None and st.projections is None:  # the projections run in this process
        return await st.pipeline.wait_for(target, timeout)
    return await st.position_watch.wait(target, timeout)
