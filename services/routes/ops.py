"""Operations: status (reader), metrics and the ops snapshot (ops token / admin), dead letters and
pause/resume (admin)."""

from __future__ import annotations

from fastapi import APIRouter, Query, Request
from fastapi import Path as PathParam
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from schemas.control import ProjectionControl
from schemas.errors import NotFound
from schemas.ports.views import VIEW_NAMES, ViewName
from schemas.rules import Name
from services.paging import DEAD_LETTERS, MAX_LIMIT, page
from services.routes.deps import Admin, Ops, OpsBearer, Reader, state
from services.routes.models import DeadLetters, Projection, Snapshot, Status
from services.routes.responses import errors

router = APIRouter()
ProjectionName = PathParam(description=f"One of: {', '.join(VIEW_NAMES)}.")
METRICS = {200: {"content": {"text/plain": {"schema": {"type": "string"}}}, "description": "Prometheus text exposition format"}}


class ControlRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    reason: str = Field("", max_length=2000, description="Why (kept on the control topic with the request)")
    requested_by: Name = Field("", max_length=200, description="Who asked (default: the key)")


@router.get("/v1/status", summary="Each view's lag; admins also see generations, positions and end offsets (reader)",
            response_model=Status, response_model_exclude_none=True)
async def get_status(request: Request, principal: Reader):
    st = state(request)
    statuses = await st.pipeline.status()
    auth = {"mode": "insecure-no-auth" if st.auth.insecure else "api-keys", "key_id": principal.key_id, "role": principal.role,
            "tenant_id": principal.tenant_id}
    if principal.is_admin:
        return {"views": [s.__dict__ for s in statuses], "auth": auth}
    # A tenant's key sees how far behind the views are, not the log's shape (offsets per
    # partition reveal how much every other tenant writes, and when).
    return {"views": [{"view": s.view, "backend": s.backend, "lag_events": s.lag_events, "lag_seconds": s.lag_seconds,
                       "caught_up": s.lag_events == 0, "paused": s.paused} for s in statuses], "auth": auth}


@router.get("/metrics", summary="Prometheus metrics (ops token or admin key, as a bearer)", response_class=Response,
            responses=METRICS)
async def get_metrics(request: Request, principal: OpsBearer):
    from prometheus_client import CONTENT_TYPE_LATEST

    st = state(request)
    await st.monitor.sample(max_age=0.5)
    return Response(st.metrics.render(), media_type=CONTENT_TYPE_LATEST)


@router.get("/v1/ops/snapshot", summary="Per-projection lag, freshness, health, dead letters, query latency, with history (ops)",
            response_model=Snapshot)
async def get_snapshot(request: Request, principal: Ops):
    st = state(request)
    snap = await st.monitor.sample(max_age=0.5)
    return {**snap, "history": st.monitor.history(), "auth_mode": "insecure-no-auth" if st.auth.insecure else "api-keys"}


@router.get("/v1/dead-letters", summary="Records a projection could not process, with the reason (admin)", response_model=DeadLetters,
            responses=errors(400))
async def get_dead_letters(request: Request, principal: Admin,
                           cursor: str | None = Query(None, pattern=DEAD_LETTERS.pattern,
                                                      description="`next_cursor` of the previous page."),
                           limit: int = Query(100, ge=1, le=MAX_LIMIT)):
    from streams.dlq import list_dead_letters

    st = state(request)
    entries, next_cursor = page(await list_dead_letters(st.pipeline.log, st.settings.dlq_topic),
                                lambda e: (e.source_topic, e.partition, e.offset), DEAD_LETTERS, cursor, limit)
    return {"next_cursor": next_cursor, "dead_letters": [
        {"origin": e.origin, "projections": e.projections, "reason": e.reason, "errors": e.errors, "replayed": e.replayed,
         "truncated": e.truncated, "value": e.value.decode("utf-8", "replace")} for e in entries
    ]}


async def _control(request: Request, name: str, paused: bool, req: ControlRequest, principal):
    st = state(request)
    if name not in st.pipeline.views:
        raise NotFound(f"unknown projection {name!r}; known: {', '.join(st.pipeline.views)}")
    await st.pipeline.control.request(ProjectionControl(
        type="ProjectionPaused" if paused else "ProjectionResumed", projection=name, reason=req.reason,
        requested_by=req.requested_by or f"key:{principal.key_id}"))
    snap = await st.monitor.sample()
    return next(p for p in snap["projections"] if p["name"] == name)


@router.post("/v1/admin/projections/{name}/pause", summary="Stop one projection; the others keep running (admin)",
             response_model=Projection, responses=errors(404))
async def pause_projection(request: Request, principal: Admin, name: ViewName = ProjectionName, req: ControlRequest | None = None):
    return await _control(request, name, True, req or ControlRequest(), principal)


@router.post("/v1/admin/projections/{name}/resume", summary="Restart a paused projection from where it stopped (admin)",
             response_model=Projection, responses=errors(404))
async def resume_projection(request: Request, principal: Admin, name: ViewName = ProjectionName, req: ControlRequest | None = None):
    return await _control(request, name, False, req or ControlRequest(), principal)
