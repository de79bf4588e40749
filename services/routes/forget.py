"""POST /v1/forget (writer, own tenant; a whole tenant needs an admin key)."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from schemas.errors import Forbidden, InvalidRequest, LogUnavailable
from schemas.rules import TENANT_PATTERN, Id, Time
from services.auth import tenant_for
from services.forget import forget_request, scope_of
from services.routes.deps import Writer, state
from services.routes.ingest import authorizer

router = APIRouter()


def _forget_schema(schema: dict[str, Any]) -> None:
    """The ids that go together, stated where a client reads them (scope_of enforces the same)."""
    schema["dependentRequired"] = {"session_id": ["conversation_id"], "event_id": ["conversation_id"]}
    schema["dependentSchemas"] = {"agent_id": {"not": {"anyOf": [{"required": [name]} for name in
                                                                 ("conversation_id", "session_id", "event_id")]}}}


class ForgetBody(BaseModel):
    """What to forget: the narrowest level the ids name (a turn, a session, a conversation, an
    agent), else the whole tenant. Absent ids are left out (not null)."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra=_forget_schema)
    tenant_id: str = Field(None, pattern=TENANT_PATTERN, description="Default: the key's tenant.")
    conversation_id: Id = Field(None, description="A conversation; with session_id a session, with event_id a turn.")
    session_id: Id = Field(None, description="A session: needs conversation_id.")
    event_id: Id = Field(None, description="A turn: needs conversation_id.")
    agent_id: Id = Field(None, description="Everything this agent said in the tenant: alone (no other id).")
    occurred_before: Time = Field(None, description="Only turns that happened before this time.")
    reason: str = Field(None, max_length=1000, description="Why (kept in the audit trail).")


def _check_ids(body: ForgetBody) -> None:
    """The rules _forget_schema states, with the field each names (422, like any field error)."""
    problems = [{"loc": ["body", "conversation_id"], "msg": f"required with {name}", "type": "missing"}
                for name in ("session_id", "event_id") if getattr(body, name) is not None and body.conversation_id is None]
    if body.agent_id is not None:
        problems += [{"loc": ["body", name], "msg": "not allowed with agent_id (an agent scope spans every conversation)",
                      "type": "extra_forbidden"} for name in ("conversation_id", "session_id", "event_id")
                     if getattr(body, name) is not None]
    if problems:
        raise InvalidRequest("; ".join(f"{p['loc'][-1]}: {p['msg']}" for p in problems), problems)


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
    _check_ids(body)
    scope = scope_of(conversation_id=body.conversation_id, session_id=body.session_id, event_id=body.event_id,
                     agent_id=body.agent_id, occurred_before=body.occurred_before)
    event = forget_request(tenant, scope, reason=body.reason, requested_by=f"key:{principal.key_id}")
    why = authorizer(principal)(event)
    if why is not None:
        raise Forbidden(why)
    [result] = await st.publisher.publish_items([event.model_dump(mode="json")], authorizer(principal))
    if result.status != "accepted":
        raise LogUnavailable("the forget request could not be appended; retry", [result.as_dict()])
    end = await st.pipeline.log.end_offsets(st.settings.log.topic)
    # A broadcast request (tenant, agent) is one record per partition: wait for them all.
    positions = {p: off for p, off in end.items()} if scope.broadcast else {result.partition: result.offset + 1}
    return JSONResponse({"forget_id": event.event_id, "tenant_id": tenant, "scope": scope.model_dump(mode="json", exclude_none=True),
                         "positions": positions, "status": "requested"}, status_code=202)
