"""POST /v1/forget (writer, own tenant; a whole tenant needs an admin key)."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import AwareDatetime, BaseModel, Field

from schemas.errors import Forbidden, InvalidRequest
from schemas.events import ID_PATTERN, TENANT_PATTERN
from services.auth import tenant_for
from services.forget import forget_request, scope_of
from services.http_guard import error_body
from services.routes.deps import Writer, state
from services.routes.ingest import authorizer

router = APIRouter()


class ForgetBody(BaseModel):
    tenant_id: str | None = Field(None, pattern=TENANT_PATTERN, description="Default: the key's tenant.")
    conversation_id: str | None = Field(None, pattern=ID_PATTERN)
    session_id: str | None = Field(None, pattern=ID_PATTERN, description="With conversation_id.")
    event_id: str | None = Field(None, pattern=ID_PATTERN, description="A turn: with conversation_id.")
    agent_id: str | None = Field(None, pattern=ID_PATTERN, description="Everything this agent said in the tenant.")
    occurred_before: AwareDatetime | None = Field(None, description="Only turns that happened before this time.")
    reason: str | None = Field(None, max_length=1000)


class ForgetResult(BaseModel):
    forget_id: str
    tenant_id: str
    scope: dict[str, Any]
    positions: dict[int, int] = Field(description="POST /v1/wait on these returns once the forget is complete.")
    status: Literal["requested"]


@router.post("/v1/forget", summary="Forget a tenant, conversation, session, turn or agent (writer; a whole tenant: admin)",
             status_code=202, response_model=ForgetResult,
             responses={202: {"description": "Requested: POST /v1/wait on `positions` returns once it is complete"}})
async def post_forget(body: ForgetBody, request: Request, principal: Writer):
    st = state(request)
    tenant = tenant_for(principal, body.tenant_id)
    try:
        scope = scope_of(conversation_id=body.conversation_id, session_id=body.session_id, event_id=body.event_id,
                         agent_id=body.agent_id, occurred_before=body.occurred_before)
    except ValueError as exc:
        raise InvalidRequest(str(exc).splitlines()[0]) from None
    event = forget_request(tenant, scope, reason=body.reason, requested_by=f"key:{principal.key_id}")
    why = authorizer(principal)(event)
    if why is not None:
        raise Forbidden(why)
    [result] = await st.publisher.publish_items([event.model_dump(mode="json")], authorizer(principal))
    if result.status != "accepted":
        return JSONResponse(error_body("unavailable", "the forget request could not be appended; retry", [result.as_dict()]),
                            status_code=503, headers={"Retry-After": "1"})
    end = await st.pipeline.log.end_offsets(st.settings.log.topic)
    # A broadcast request (tenant, agent) is one record per partition: wait for them all.
    positions = {p: off for p, off in end.items()} if scope.broadcast else {result.partition: result.offset + 1}
    return JSONResponse({"forget_id": event.event_id, "tenant_id": tenant, "scope": scope.model_dump(mode="json", exclude_none=True),
                         "positions": positions, "status": "requested"}, status_code=202)
