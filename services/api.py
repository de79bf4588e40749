"""HTTP API. In embedded mode `memstream serve` also runs the projections in-process.

Assembled here: state and lifespan, the edge guard (services/http_guard.py: request ids, body
limits, content types, origins, safe JSON), authentication (services/auth.py), the routes
(services/routes/), one error shape and the OpenAPI document.

Every error has one body shape: {"error": {"code": str, "message": str, "details": [...],
"request_id": str}} — 401/403/429/503 included; a 500 says only that something failed and
which request id to look for in the server log, never the exception's text.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from infra.registry import Registry
from infra.settings import Settings
from schemas.errors import ConfigurationError, MemstreamError, RateLimited, TransientError
from services import __version__
from services.auth import Authenticator, TokenBuckets
from services.http_guard import EdgeGuard, error_body
from services.ops.metrics import Metrics
from services.backpressure import Backpressure
from services.ops.monitor import OpsMonitor
from services.projection_child import ProjectionChild
from services.runtime import build_pipeline, keep_heap_settled, settle_heap
from services.views import LiveViews
from services.waiting import PositionWatch
from streams.audit import AuditTrail
from streams.ingest import Publisher
from streams.keys import KeyRing

log = logging.getLogger(__name__)

OPEN_PATHS = ("/healthz", "/openapi.json", "/dashboard", "/dashboard/session", "/dashboard/assets/{name}")


class State:
    settings: Settings
    pipeline: Any
    metrics: Metrics
    monitor: OpsMonitor
    monitor_task: asyncio.Task | None = None
    views: LiveViews
    publisher: Publisher
    keyring: KeyRing
    audit: AuditTrail
    auth: Authenticator
    backpressure: Backpressure
    query: Any
    reader: Any = None
    runner_task: asyncio.Task | None = None
    projections: ProjectionChild | None = None
    position_watch: PositionWatch
    stop: asyncio.Event


def build_query_service(settings: Settings, registry: Registry, views: LiveViews):
    from services.query.config import bounds_for
    from services.query.service import QueryService

    return QueryService(views, registry.encoder(), extractor=registry.extractor(), encoders=registry.encoder,
                        bounds=bounds_for(settings.query.path))


def build_reader(settings: Settings):
    if not settings.reader.url:
        return None
    from infra.reader.openai import OpenAICompatibleReader

    key = settings.reader.api_key.get_secret_value() if settings.reader.api_key else None
    return OpenAICompatibleReader(settings.reader.url, settings.reader.model, key, settings.reader.timeout_seconds)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


NO_KEY = ("no API key is configured: create one with `memstream keys create --role admin` (or a tenant's "
          "`--tenant T --role writer`), or start with --insecure-no-auth on a loopback address for local experiments")


def allowed_methods(app: FastAPI, scope: dict) -> list[str]:
    """The methods some route of the app takes at the request's path."""
    from starlette.routing import Match

    def leaves(routes):  # the routes of included routers too (none of ours has a prefix)
        for route in routes:
            inner = getattr(route, "original_router", None)
            yield from leaves(inner.routes) if inner is not None else (route,)

    methods: set[str] = set()
    for route in leaves(app.routes):
        if getattr(route, "methods", None) and route.matches({**scope, "method": "GET"})[0] is not Match.NONE:
            methods |= set(route.methods)
    return sorted(methods)


def invalid_request_message(details: list[dict[str, Any]], shown: int = 3) -> str:
    """A 422's message naming the fields: `body.max_turns: Input should be ...; ...`."""
    parts = [f"{'.'.join(str(p) for p in d['loc']) or '(request)'}: {d['msg']}" for d in details[:shown]]
    more = f" (+{len(details) - shown} more)" if len(details) > shown else ""
    return "the request does not match the API schema: " + "; ".join(parts) + more


def create_app(settings: Settings, *, process: bool | str = True, registry: Registry | None = None, insecure: bool = False) -> FastAPI:
    """`process`: True runs the projections in this process, "child" in a child process of their
    own (services/projection_child.py), False not at all (another process runs them).
    `insecure`: no authentication at all (--insecure-no-auth), refused unless the API binds
    to a loopback address, and announced in the log and on /v1/status."""
    if insecure and not is_loopback(settings.api.host):
        raise ConfigurationError(f"--insecure-no-auth is accepted only on a loopback address, not {settings.api.host!r}")
    registry = registry or Registry(settings)
    state = State()
    state.settings = settings

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        state.metrics = Metrics()
        state.pipeline = build_pipeline(settings, registry=registry, metrics=state.metrics)
        state.stop = asyncio.Event()
        await state.pipeline.start_log()
        state.keyring = KeyRing(state.pipeline.log, settings.log.topic, refresh_seconds=settings.api.key_refresh_seconds)
        await state.keyring.ensure_topic()
        await state.keyring.refresh(force=True)
        if insecure:
            log.warning("AUTHENTICATION IS OFF (--insecure-no-auth): every caller is an admin of every tenant; bound to %s",
                        settings.api.host)
        elif not state.keyring.has_active_key():
            await state.pipeline.close()
            raise ConfigurationError(NO_KEY)
        ops_token = settings.ops.token.get_secret_value() if settings.ops.token else None
        state.auth = Authenticator(None if insecure else state.keyring, ops_token,
                                   TokenBuckets(settings.api.rate_limit_per_second, settings.api.rate_limit_burst),
                                   secure_cookies=settings.api.tls_cert is not None)
        if process == "child":
            state.projections = ProjectionChild(settings.data_dir)
            state.runner_task = asyncio.create_task(state.projections.supervise(state.stop))
        elif process:
            await state.pipeline.start()
            state.runner_task = asyncio.create_task(state.pipeline.run(state.stop))
        state.audit = AuditTrail(state.pipeline.log, settings.log.topic)
        state.views = LiveViews(registry)
        state.position_watch = PositionWatch(state.views, state.pipeline.keystore)
        state.publisher = state.pipeline.publisher()
        state.query = build_query_service(settings, registry, state.views)
        await asyncio.to_thread(state.query.start)
        state.reader = build_reader(settings)
        state.monitor = OpsMonitor(state.pipeline, state.metrics, interval=settings.ops.sample_seconds,
                                   window_seconds=settings.ops.window_seconds, history_seconds=settings.ops.history_seconds,
                                   mode="embedded" if state.pipeline.log.backend == "sqlite" else state.pipeline.log.backend,
                                   audit=state.audit)
        state.monitor_task = asyncio.create_task(state.monitor.run(state.stop))
        state.backpressure = Backpressure(settings.api.max_backlog, state.metrics)
        settle_heap()
        heap_task = asyncio.create_task(keep_heap_settled(state.stop))
        try:
            yield
        finally:
            state.stop.set()
            await state.monitor_task
            await heap_task
            if state.runner_task is not None:
                await state.runner_task
            state.views.close()
            if state.reader is not None:
                state.reader.close()
            await state.pipeline.close()

    app = FastAPI(title="memstream", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None,
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

    def request_id(request: Request) -> str | None:
        return request.scope.get("state", {}).get("request_id")

    # -- errors: one shape everywhere ------------------------------------------------------
    @app.exception_handler(MemstreamError)
    async def _memstream_error(request: Request, exc: MemstreamError):
        headers = {}
        if isinstance(exc, RateLimited):
            headers["Retry-After"] = str(int(exc.retry_after))
        elif isinstance(exc, TransientError):
            headers["Retry-After"] = "5" if exc.code == "view_unavailable" else "1"  # a store restarting takes seconds
        if exc.http_status == 401:
            headers["WWW-Authenticate"] = 'Bearer realm="memstream"'
        if exc.http_status >= 500:
            log.warning("request %s on %s failed: %s", request_id(request), request.url.path, exc)
        return JSONResponse(error_body(exc.code, str(exc), getattr(exc, "errors", None), request_id(request)),
                            status_code=exc.http_status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError):
        details = [{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]} for e in exc.errors()]
        return JSONResponse(error_body("invalid_request", invalid_request_message(details), details, request_id(request)),
                            status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        code = {404: "not_found", 405: "method_not_allowed", 413: "too_large"}.get(exc.status_code, "http_error")
        headers = dict(exc.headers or {})
        if exc.status_code == 405:  # every method of the path, not only those of the one route that matched it
            headers["Allow"] = ", ".join(allowed_methods(app, request.scope))
        return JSONResponse(error_body(code, str(exc.detail), None, request_id(request)), status_code=exc.status_code,
                            headers=headers)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        rid = request_id(request)
        log.exception("unhandled error on %s (request %s)", request.url.path, rid)
        return JSONResponse(error_body("internal_error", f"the request failed inside memstream; the server log has the details "
                                                         f"under request id {rid}", None, rid), status_code=500)

    from services.routes import audit, dashboard, export, forget, ingest, keys, ops, query, turns

    for module in (ingest, forget, export, query, turns, ops, keys, audit, dashboard):
        app.include_router(module.router)

    from services.routes.models import Healthy

    @app.get("/healthz", summary="Liveness (no key needed)", response_model=Healthy)
    async def healthz():
        return {"ok": True}

    def openapi() -> dict:
        if app.openapi_schema:
            return app.openapi_schema
        from fastapi.openapi.utils import get_openapi

        from services.routes.document import complete

        doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        app.openapi_schema = complete(doc, open_paths=OPEN_PATHS, max_batch=settings.api.max_batch,
                                      max_wait=settings.api.max_wait_seconds)
        return app.openapi_schema

    app.openapi = openapi
    limit = lambda path: settings.api.max_body_bytes if path == "/v1/events" else settings.api.max_request_bytes  # noqa: E731
    app.add_middleware(EdgeGuard, body_limit=limit, ndjson_paths=("/v1/events",), allowed_origins=settings.api.cors_origins)
    if settings.api.cors_origins:
        from starlette.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=list(settings.api.cors_origins), allow_methods=["GET", "POST", "DELETE"],
                           allow_headers=["authorization", "content-type", "x-request-id"], expose_headers=["x-request-id", "retry-after"])
    return app
