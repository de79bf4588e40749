"""Reading turns back (reader): GET /v1/turns, GET /v1/turns/{event_id}, GET /v1/turns/{event_id}/history
(services/turns.py)."""

from __future__ import annotations

from fastapi import APIRouter, Path, Query, Request

from schemas.ports.views import Boundary
from schemas.rules import ID_MAX, ID_PATTERN, TENANT_PATTERN
from services.auth import tenant_for
from services.paging import TURNS
from services.routes.deps import Reader, state
from services.routes.models import StoredTurn, TurnHistory, TurnPage
from services.routes.responses import errors
from services.turns import MAX_PAGE, TurnReader

router = APIRouter()
Tenant = Query(None, pattern=TENANT_PATTERN, description="Default: the key's tenant.")
EventId = Path(pattern=ID_PATTERN, max_length=ID_MAX)


def _id(description: str | None = None):
    return Query(None, pattern=ID_PATTERN, max_length=ID_MAX, description=description)


def _reader(request: Request) -> TurnReader:
    st = state(request)
    return TurnReader(st.pipeline.log, st.settings.log.topic, st.pipeline.keystore, st.views.store("hierarchy"))


@router.get("/v1/turns", summary="A boundary's turns in time order, a page at a time (reader)", response_model=TurnPage,
            responses=errors(400))
async def list_turns(request: Request, principal: Reader, tenant_id: str | None = Tenant,
                     conversation_id: str | None = _id(), session_id: str | None = _id(), agent_id: str | None = _id(),
                     include_superseded: bool = Query(False, description="Also turns a correction supersedes."),
                     cursor: str | None = Query(None, pattern=TURNS.pattern, description="`next_cursor` of the previous page."),
                     limit: int = Query(100, ge=1, le=MAX_PAGE)):
    tenant = tenant_for(principal, tenant_id)
    boundary = Boundary(tenant, (conversation_id,) if conversation_id else None, (session_id,) if session_id else None,
                        (agent_id,) if agent_id else None)
    return await _reader(request).page(boundary, cursor, limit, include_superseded)


@router.get("/v1/turns/{event_id}", summary="One turn as it was published, with the corrections that supersede it (reader)",
            response_model=StoredTurn, responses=errors(404, 409, _409="The event id names a turn in several conversations: "
                                                                         "name one (conversation_id)"))
async def get_turn(request: Request, principal: Reader, event_id: str = EventId, tenant_id: str | None = Tenant,
                   conversation_id: str | None = _id("Needed when the event id is used in several.")):
    return await _reader(request).one(tenant_for(principal, tenant_id), event_id, conversation_id)


@router.get("/v1/turns/{event_id}/history", summary="A turn and every correction of it, oldest first (reader)",
            response_model=TurnHistory, responses=errors(404, 409, _409="The event id names a turn in several conversations: "
                                                                          "name one (conversation_id)"))
async def get_turn_history(request: Request, principal: Reader, event_id: str = EventId, tenant_id: str | None = Tenant,
                           conversation_id: str | None = _id()):
    return await _reader(request).history(tenant_for(principal, tenant_id), event_id, conversation_id)
