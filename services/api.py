"""HTTP API. In embedded mode `memstream serve` also runs the projections in-process.

Every error has one body shape: {"error": {"code": str, "message": str, "details": [...]}}.
The OpenAPI document is at /openapi.json (no bundled docs UI: it would load assets from a CDN).

POST /v1/events accepts one event, a JSON array of events, {"events": [...]}, or JSON Lines
(Content-Type: application/x-ndjson). Items are
validated one by one: valid items are appended even when others are invalid. Status 200 means
all were accepted, 207 some, 422 none; the body lists every item in input order with its
partition/offset or its field errors.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response
from pydantic import BaseModel, Field, TypeAdapter
from starlette.exceptions import HTTPException as StarletteHTTPException

from infra.registry import Registry
from infra.settings import Settings
from schemas.control import ProjectionControl
from schemas.errors import BadRequest, MemstreamError, NotFound
from schemas.events import Event
from schemas.query import AnswerResponse, SearchRequest, SearchResponse
from services.ops.metrics import Metrics
from services.ops.monitor import OpsMonitor
from services.runtime import build_pipeline
from services.views import LiveViews
from streams.ingest import Publisher

log = logging.getLogger(__name__)


def error_body(code: str, message: str, details: list | None = None) -> dict:
    return {"error": {"code": code, "message": message, "details": details or []}}


class WaitRequest(BaseModel):
    positions: dict[int, int] = Field(description="partition -> offset to wait for (e.g. the `positions` of a POST /v1/events answer)")
    timeout_seconds: float = Field(10.0, ge=0, le=300)


class ControlRequest(BaseModel):
    reason: str = Field("", max_length=2000, description="Why (kept on the control topic with the request)")
    requested_by: str = Field("", max_length=200)


DASHBOARD_DIR = Path(__file__).resolve().parent / "ops" / "dashboard"


class State:
    pipeline: Any
    metrics: Metrics
    monitor: OpsMonitor
    monitor_task: asyncio.Task | None = None
    views: LiveViews
    publisher: Publisher
    query: Any
    reader: Any = None
    runner_task: asyncio.Task | None = None
    stop: asyncio.Event


def build_query_service(settings: Settings, registry: Registry, views: LiveViews):
    from services.query.service import QueryService

    return QueryService(views, registry.encoder(), extractor=registry.extractor())


def build_reader(settings: Settings):
    if not settings.reader.url:
        return None
    from infra.reader.openai import OpenAICompatibleReader

    key = settings.reader.api_key.get_secret_value() if settings.reader.api_key else None
    return OpenAICompatibleReader(settings.reader.url, settings.reader.model, key, settings.reader.timeout_seconds)


def create_app(settings: Settings, *, process: bool = True, registry: Registry | None = None) -> FastAPI:
    registry = registry or Registry(settings)
    state = State()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        state.metrics = Metrics()
        state.pipeline = build_pipeline(settings, registry=registry, metrics=state.metrics)
        state.stop = asyncio.Event()
        if process:
            await state.pipeline.start()
            state.runner_task = asyncio.create_task(state.pipeline.run(state.stop))
        else:
            await state.pipeline.start_log()
        state.views = LiveViews(registry)
        state.publisher = Publisher(state.pipeline.log, settings.log.topic)
        state.query = build_query_service(settings, registry, state.views)
        await asyncio.to_thread(state.query.start)
        state.reader = build_reader(settings)
        state.monitor = OpsMonitor(state.pipeline, state.metrics, interval=settings.ops.sample_seconds,
                                   window_seconds=settings.ops.window_seconds, history_seconds=settings.ops.history_seconds,
                                   mode="embedded" if state.pipeline.log.backend == "sqlite" else state.pipeline.log.backend)
        state.monitor_task = asyncio.create_task(state.monitor.run(state.stop))
        try:
            yield
        finally:
            state.stop.set()
            await state.monitor_task
            if state.runner_task is not None:
                await state.runner_task
            state.views.close()
            if state.reader is not None:
                state.reader.close()
            await state.pipeline.close()

    app = FastAPI(title="memstream", version="0.1.0", lifespan=lifespan, docs_url=None, redoc_url=None,
                  description="Event-sourced streaming memory for LLM agent fleets (Zero-Mem retrieval).")
    app.state.memstream = state

    # -- request metrics -------------------------------------------------------------------
    @app.middleware("http")
    async def _count_requests(request: Request, call_next):
        response = await call_next(request)
        route = request.scope.get("route")
        endpoint = getattr(route, "path", None) or "unmatched"
        if endpoint != "/metrics" and hasattr(state, "metrics"):
            state.metrics.requests.labels(endpoint, request.method, str(response.status_code)).inc()
            if response.status_code >= 500:
                state.metrics.request_errors.labels(endpoint).inc()
        return response

    # -- errors: one shape everywhere ------------------------------------------------------
    @app.exception_handler(MemstreamError)
    async def _memstream_error(request: Request, exc: MemstreamError):
        return JSONResponse(error_body(exc.code, str(exc), getattr(exc, "errors", None)), status_code=exc.http_status)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError):
        details = [{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]} for e in exc.errors()]
        return JSONResponse(error_body("invalid_request", "the request does not match the API schema", details), status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        code = {404: "not_found", 405: "method_not_allowed", 413: "too_large"}.get(exc.status_code, "http_error")
        return JSONResponse(error_body(code, str(exc.detail)), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        log.exception("unhandled error on %s", request.url.path)
        return JSONResponse(error_body("internal_error", f"{type(exc).__name__}: {exc}"), status_code=500)

    # -- ingest ------------------------------------------------------------------------------
    @app.post(
        "/v1/events",
        summary="Publish one event or a batch",
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": {"oneOf": [
                    {"$ref": "#/components/schemas/Event"},
                    {"type": "array", "items": {"$ref": "#/components/schemas/Event"}},
                    {"type": "object", "properties": {"events": {"type": "array", "items": {"$ref": "#/components/schemas/Event"}}},
                     "required": ["events"]},
                ]}}},
            },
            "responses": {"207": {"description": "Some items accepted, some rejected"}, "413": {"description": "Body or batch too large"}},
        },
    )
    async def post_events(request: Request):
        items = await _read_items(request, settings)
        results = await state.publisher.publish_items(items)
        accepted = [r for r in results if r.status == "accepted"]
        positions: dict[int, int] = {}
        for r in accepted:
            positions[r.partition] = max(positions.get(r.partition, 0), r.offset + 1)
        body = {"accepted": len(accepted), "rejected": len(results) - len(accepted), "positions": positions,
                "items": [r.as_dict() for r in results]}
        if not accepted:
            return JSONResponse(error_body("invalid_event", f"none of the {len(results)} event(s) is valid; nothing was appended",
                                           body["items"]), status_code=422)
        return JSONResponse(body, status_code=200 if len(accepted) == len(results) else 207)

    @app.post("/v1/wait", summary="Wait until every view has processed up to the given positions (read-your-writes)")
    async def post_wait(req: WaitRequest):
        if state.runner_task is None:
            raise BadRequest("this server does not run the projections (--no-process); poll /v1/status instead")
        done = await state.pipeline.wait_for(req.positions, req.timeout_seconds)
        if not done:
            paused = await state.pipeline.paused_views()
            note = f" (paused: {', '.join(paused)}; `memstream resume NAME`)" if paused else ""
            return JSONResponse(error_body("timeout", f"views did not reach the positions within {req.timeout_seconds}s{note}"),
                                status_code=504)
        return {"caught_up": True}

    # -- query -------------------------------------------------------------------------------
    @app.post("/v1/search", response_model=SearchResponse, summary="Evidence for a question (zero LLM tokens)")
    async def post_search(req: SearchRequest):
        response = await asyncio.to_thread(state.query.search, req)
        state.monitor.query_done(response.strategy, response.timings_ms.get("total", 0.0), response.timings_ms)
        return response

    @app.post("/v1/answer", response_model=AnswerResponse, summary="Evidence, then the reader's calibrated answer (one LLM call)")
    async def post_answer(req: SearchRequest):
        from services.query.answering import answer

        t0 = time.perf_counter()
        response = await asyncio.to_thread(answer, state.query, state.reader, req)
        state.monitor.query_done(req.strategy, (time.perf_counter() - t0) * 1000, {})
        return response

    # -- operations --------------------------------------------------------------------------
    @app.get("/v1/status", summary="Each view's generation, positions, end offsets and lag")
    async def get_status():
        statuses = await state.pipeline.status()
        return {"views": [s.__dict__ for s in statuses]}

    @app.get("/metrics", summary="Prometheus metrics", response_class=Response)
    async def get_metrics():
        from prometheus_client import CONTENT_TYPE_LATEST

        await state.monitor.sample(max_age=0.5)
        return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/ops/snapshot", summary="Per-projection lag, freshness, health, dead letters, query latency, with history")
    async def get_snapshot():
        snap = await state.monitor.sample(max_age=0.5)
        return {**snap, "history": state.monitor.history()}

    async def _control(name: str, paused: bool, req: ControlRequest):
        if name not in state.pipeline.views:
            raise NotFound(f"unknown projection {name!r}; known: {', '.join(state.pipeline.views)}")
        await state.pipeline.control.request(ProjectionControl(
            type="ProjectionPaused" if paused else "ProjectionResumed", projection=name, reason=req.reason,
            requested_by=req.requested_by or "http"))
        snap = await state.monitor.sample()
        return next(p for p in snap["projections"] if p["name"] == name)

    @app.post("/v1/admin/projections/{name}/pause", summary="Stop one projection (the others keep running)")
    async def pause_projection(name: str, req: ControlRequest | None = None):
        return await _control(name, True, req or ControlRequest())

    @app.post("/v1/admin/projections/{name}/resume", summary="Restart a paused projection from where it stopped")
    async def resume_projection(name: str, req: ControlRequest | None = None):
        return await _control(name, False, req or ControlRequest())

    @app.get("/dashboard", response_class=HTMLResponse, summary="Live operations dashboard")
    async def dashboard():
        return FileResponse(DASHBOARD_DIR / "index.html", media_type="text/html")

    @app.get("/dashboard/assets/{name}", summary="Dashboard assets (served locally, no CDN)")
    async def dashboard_asset(name: str):
        path = (DASHBOARD_DIR / name).resolve()
        if path.parent != DASHBOARD_DIR or not path.is_file():
            raise NotFound(f"no dashboard asset {name!r}")
        return FileResponse(path)

    @app.get("/v1/dead-letters", summary="Records a projection could not process, with the reason")
    async def get_dead_letters():
        from streams.dlq import list_dead_letters

        entries = await list_dead_letters(state.pipeline.log, settings.dlq_topic)
        return {"dead_letters": [
            {"origin": e.origin, "projections": e.projections, "reason": e.reason, "errors": e.errors, "replayed": e.replayed,
             "value": e.value.decode("utf-8", "replace")} for e in entries
        ]}

    @app.get("/healthz", summary="Liveness")
    async def healthz():
        return {"ok": True}

    def openapi() -> dict:
        if app.openapi_schema:
            return app.openapi_schema
        from fastapi.openapi.utils import get_openapi

        doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        defs = TypeAdapter(Event).json_schema(ref_template="#/components/schemas/{model}")
        components = doc.setdefault("components", {}).setdefault("schemas", {})
        components.update(defs.pop("$defs", {}))
        components["Event"] = defs
        app.openapi_schema = doc
        return doc

    app.openapi = openapi
    return app


async def _read_items(request: Request, settings: Settings) -> list[Any]:
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > settings.api.max_body_bytes:
        raise _TooLarge(f"request body is {length} bytes; the limit is {settings.api.max_body_bytes}")
    raw = await request.body()
    if len(raw) > settings.api.max_body_bytes:
        raise _TooLarge(f"request body is {len(raw)} bytes; the limit is {settings.api.max_body_bytes}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequest(f"request body is not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type in ("application/x-ndjson", "application/jsonl", "application/json-lines"):
        items = []
        for n, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                try:
                    items.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise BadRequest(f"line {n} is not valid JSON: {exc.msg} at column {exc.colno}") from None
        body = items
    else:
        try:
            body = json.loads(text)
        except json.JSONDecodeError as exc:
            raise BadRequest(f"request body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
                             " (send JSON Lines as application/x-ndjson)") from None
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
    if len(items) > settings.api.max_batch:
        raise _TooLarge(f"{len(items)} events in one request; the limit is {settings.api.max_batch}")
    return items


class _TooLarge(MemstreamError):
    code = "too_large"
    http_status = 413
