"""memstream as an MCP server (`memstream mcp`): a thin client of a running `memstream serve`.

It loads no model and opens no store: every tool is one or two calls of the HTTP API through
`memstream_client.AsyncClient`, so the keys, roles and tenant bounds are the API's.

Keys. Over stdio the key is MEMSTREAM_API_KEY (the agent host starts this process with it): it is
checked against the API at start, and a missing or refused key stops the process with the reason.
Over streamable HTTP each request carries its own `Authorization: Bearer <key>`, passed through to
the API (this server holds no key of its own). A request without one, or with one the API refuses,
is answered 401 with `WWW-Authenticate: Bearer` before MCP handles it. A key the API accepted is
trusted for KEY_TTL seconds (remembered by its SHA-256, never logged), so a session's calls do not
each cost a second round trip; a key revoked within that time still reaches the tools, where the
API refuses it.

Tools. Arguments are closed: an unknown one (a misspelt `conversationId`) is refused, not ignored.
An argument error, like a refusal of the API (another tenant, a role too low), is an MCP tool error
whose text is the API's error shape (`{"error": {"status", "code", "message", "details"}}`) naming
each field and rule; the server keeps running.

Results. The structured content carries everything: each evidence unit's rank, role, score and
turns with their provenance (event id, log position, session, date, speaker). The text content is
what a model reads: per unit a header `#rank role score`, then one line per turn `[date] speaker:
text`. MCP asks for the structured content's JSON in a text block for clients that predate
structured content; for evidence that JSON is mostly ids, offsets and a second copy of every
turn's text, so the model would read several times the evidence it needs. The other tools' text is
their structured content as compact JSON.

The HTTP transport binds to loopback unless told otherwise and validates `Host` and `Origin`
(DNS-rebinding protection) before the key: only the loopback names, plus the origins given with
`--allow-origin`, may call it from a browser.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
import logging
import sys
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from datetime import datetime
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.tools import Tool
from mcp.server.transport_security import TransportSecurityMiddleware, TransportSecuritySettings
from mcp.types import CallToolResult, TextContent
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from memstream_client import (AsyncClient, AuthenticationError, BadRequest, MemstreamError, RateLimited, RetryPolicy,
                              TransportError, Turn, WaitTimeout)
from memstream_client.models import AnswerResult, Evidence
from schemas.errors import ConfigurationError
from schemas.events import TENANT_PATTERN, Identifier
from schemas.query import DEFAULT_MAX_TURNS, Strategy
from services import __version__

log = logging.getLogger(__name__)

KEY_TTL = 30.0          # seconds a key the API accepted is trusted without asking again
KEY_CACHE_SIZE = 1024   # keys remembered at most (least recently used forgotten first)
KEY_CHECK_TIMEOUT = 10.0

Tenant = Annotated[str | None, Field(pattern=TENANT_PATTERN,
                                     description="Default: the key's tenant (an admin key must name one).")]
Question = Annotated[str, Field(min_length=1, max_length=4000)]
MaxTurns = Annotated[int, Field(ge=1, le=200, description=(
    "The results' limit: evidence units are added in rank order until they hold this many distinct turns "
    "(the last unit may be cut)."))]
Wait = Annotated[float, Field(ge=0, le=300)]
Positions = Annotated[dict[Annotated[str, Field(pattern=r"^[0-9]{1,9}$")], Annotated[int, Field(ge=0)]], Field(
    description="partition -> offset, as add_memory or forget_memory returned them.")]


def version() -> str:
    """memstream's version (services/__init__.py)."""
    return __version__


# -- tool arguments and results --------------------------------------------------------------
class TurnIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    speaker: Annotated[str, Field(min_length=1, max_length=200,
                                  description="Who said it (a name, or 'user'/'assistant').")]
    text: Annotated[str, Field(max_length=100_000)]
    role: Literal["user", "assistant", "agent", "tool", "system"] = "user"
    session_id: Identifier | None = Field(None, description="Default: the call's session_id, else 'default'.")
    agent_id: Identifier | None = Field(None, description="The agent that published it; default: derived from the "
                                                          "speaker.")
    occurred_at: datetime | None = Field(None, description="When it was said (ISO 8601 with offset); default: now.")
    event_id: Identifier | None = Field(None, description="Idempotency key; default: a new random id.")
    metadata: dict[str, str | int | float | bool | None] = Field(default_factory=dict)


class PublishedItem(BaseModel):
    index: int
    status: str
    event_id: str | None = None
    partition: int | None = None
    offset: int | None = None
    errors: list[dict[str, Any]] = Field(default_factory=list)


class AddResult(BaseModel):
    accepted: int
    rejected: int
    positions: dict[str, int] = Field(description="partition -> offset: pass to wait_for_memory for read-your-writes.")
    items: list[PublishedItem]
    ready: bool = Field(description="True when the call waited and every view has the turns.")


class EvidenceTurn(BaseModel):
    event_id: str
    speaker: str
    text: str
    session_id: str
    session_date: datetime = Field(description="When the turn happened (its occurred_at).")
    partition: int
    offset: int


class EvidenceItem(BaseModel):
    rank: int
    role: str = Field(description="Why the unit is in the evidence: primary (among the best-ranked units), bridge "
                                  "(shares entities with a primary unit), neighbour (a turn next to one), fill (the "
                                  "ranking's next units, filling the turn budget).")
    score: float = Field(description="The score the strategy ranked the unit by, higher first. Comparable within one "
                                     "response only: its scale depends on the strategy and the question.")
    kind: str
    text: str
    conversation_id: str
    session_id: str
    occurred_from: datetime
    occurred_to: datetime
    turns: list[EvidenceTurn]


class SearchOut(BaseModel):
    strategy: str
    evidence: list[EvidenceItem]
    llm_tokens: int


class AnswerOut(SearchOut):
    answer: str
    reader_model: str


class ForgetOut(BaseModel):
    forget_id: str
    scope: dict[str, Any]
    positions: dict[str, int]
    complete: bool = Field(description="True when the call waited and the forget is complete "
                                       "(gone from every view, keys destroyed).")


class ViewLag(BaseModel):
    view: str
    lag_events: int
    lag_seconds: float = Field(description="Age of the oldest event the view has not processed yet (0 when caught up).")
    paused: bool


class StatusOut(BaseModel):
    caught_up: bool
    views: list[ViewLag]


def _evidence(e: Evidence) -> EvidenceItem:
    return EvidenceItem(
        rank=e.rank, role=e.role, score=e.score, kind=e.kind, text=e.text, conversation_id=e.conversation_id,
        session_id=e.session_id, occurred_from=e.occurred_from, occurred_to=e.occurred_to,
        turns=[EvidenceTurn(event_id=t.event_id, speaker=t.speaker, text=t.text, session_id=t.session_id,
                            session_date=t.occurred_at, partition=t.partition, offset=t.offset) for t in e.turns])


def evidence_text(evidence: list[Evidence]) -> str:
    """The evidence as a model reads it: per unit `#rank role score`, then one line per turn `[date] speaker: text`.

    A turn already shown under an earlier unit (windows can overlap) points back to it instead of repeating its
    text. Ids, offsets and sessions stay in the structured content: they cost a model context and answer no
    question."""
    if not evidence:
        return "No evidence in memory for this question."
    lines: list[str] = []
    shown: dict[str, int] = {}
    for e in evidence:
        lines.append(f"#{e.rank} {e.role} {e.score:.3g}")
        for t in e.turns:
            head = f"[{t.occurred_at.date().isoformat()}] {t.speaker}:"
            if t.event_id in shown:
                lines.append(f"{head} (as under #{shown[t.event_id]})")
            else:
                shown[t.event_id] = e.rank
                lines.append(f"{head} {t.text}")
    return "\n".join(lines)


def _result(out: BaseModel, text: str | None = None) -> CallToolResult:
    structured = out.model_dump(mode="json")
    text = json.dumps(structured, separators=(",", ":"), ensure_ascii=False) if text is None else text
    return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=structured)


# -- errors -----------------------------------------------------------------------------------
def _error_text(status: int | None, code: str, message: str, details: Iterable[Any] = (),
                request_id: str | None = None) -> str:
    """The API's error shape (plus the HTTP status), as a tool error's text."""
    error: dict[str, Any] = {"status": status, "code": code, "message": message, "details": list(details)}
    if request_id:
        error["request_id"] = request_id
    return json.dumps({"error": error}, default=str, ensure_ascii=False)


def _client_code(exc: MemstreamError) -> str:
    """An error code for what the client raised without an answer of the API carrying one."""
    if isinstance(exc, TransportError):
        return "unavailable"
    if isinstance(exc, WaitTimeout):
        return "timeout"
    return "invalid_request" if isinstance(exc, BadRequest) else "client_error"


def invalid_arguments(tool: str, details: list[dict[str, Any]]) -> ToolError:
    """An argument error naming each field and its rule, shaped like the API's 422."""
    problems = "; ".join(f"{'.'.join(map(str, d['loc'])) or 'arguments'}: {d['msg']}" for d in details)
    return ToolError(_error_text(422, "invalid_arguments", f"invalid arguments for {tool}: {problems}", details))


def _argument_details(schema: dict[str, Any], exc: ValidationError) -> list[dict[str, Any]]:
    """pydantic's errors without its documentation URLs or the rejected values; an unknown argument says what the
    object it was given in accepts."""
    details = []
    for e in exc.errors(include_url=False, include_input=False, include_context=False):
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = f"unknown argument (accepted: {', '.join(_accepted(schema, e['loc']))})"
        details.append({"loc": list(e["loc"]), "msg": msg, "type": e["type"]})
    return details


def _accepted(schema: dict[str, Any], loc: tuple[int | str, ...]) -> list[str]:
    """The property names of the object holding `loc`'s last part, found through the schema's arrays and $refs."""
    defs = schema.get("$defs", {})

    def resolve(node: dict[str, Any]) -> dict[str, Any]:
        while True:
            if "$ref" in node:
                node = defs.get(node["$ref"].rsplit("/", 1)[-1], {})
            elif "anyOf" in node:
                node = next((n for n in node["anyOf"] if n.get("type") != "null"), {})
            else:
                return node

    node = resolve(schema)
    for part in loc[:-1]:
        node = resolve(node.get("items", {}) if isinstance(part, int) else node.get("properties", {}).get(part, {}))
    return list(node.get("properties", {}))


class ClosedTool(Tool):
    """A tool whose arguments are closed (`additionalProperties: false`: an unknown argument is an error, where the
    SDK ignores it) and whose argument errors name each field and rule in the API's error shape (pydantic's own text
    carries documentation URLs and echoes the rejected values)."""

    @classmethod
    def of(cls, fn: Callable[..., Awaitable[Any]]) -> ClosedTool:
        tool = cls.from_function(fn, description=inspect.cleandoc(fn.__doc__ or ""))
        args = tool.fn_metadata.arg_model
        closed = type(args.__name__, (args,), {"model_config": ConfigDict(extra="forbid"), "__module__": __name__})
        tool.fn_metadata.arg_model = closed
        tool.parameters = closed.model_json_schema(by_alias=True)
        return tool

    async def run(self, arguments: dict[str, Any], context: Any, convert_result: bool = False) -> Any:
        try:
            self.fn_metadata.validate_arguments(arguments)
        except ValidationError as exc:
            error = invalid_arguments(self.name, _argument_details(self.parameters, exc))
            raise ToolError(f"Error executing tool {self.name}: {error}") from exc
        return await super().run(arguments, context, convert_result=convert_result)


def _forget_scope_details(conversation_id: str | None, session_id: str | None, event_id: str | None,
                          agent_id: str | None) -> list[dict[str, Any]]:
    """The combinations of ids forget_memory refuses, said per field before the API is asked."""
    details = []
    if event_id is not None and conversation_id is None:
        details.append({"loc": ["conversation_id"], "msg": "required with event_id (a turn is forgotten within its "
                        "conversation)", "type": "missing"})
    if session_id is not None and conversation_id is None:
        details.append({"loc": ["conversation_id"], "msg": "required with session_id", "type": "missing"})
    if agent_id is not None and (conversation_id or session_id or event_id):
        details.append({"loc": ["agent_id"], "msg": "name the agent alone: its scope is the agent's turns in every "
                        "conversation (to forget one conversation, name the conversation alone)", "type": "conflict"})
    return details


# -- the server -------------------------------------------------------------------------------
def bearer(authorization: str | None) -> str:
    """The key of an `Authorization: Bearer <key>` header ("" without one)."""
    scheme, _, key = (authorization or "").partition(" ")
    return key.strip() if scheme.lower() == "bearer" else ""


class _Clients:
    """One API client per key (bounded): stdio has one; HTTP passes each caller's key through."""

    def __init__(self, url: str | None, api_key: str | None, size: int = 64):
        self.url, self.api_key, self.size = url, api_key, size
        self._by_key: OrderedDict[str, AsyncClient] = OrderedDict()

    async def get(self, ctx: Context | None) -> AsyncClient:
        key = self.api_key or ""
        headers = ctx.headers if ctx is not None else None
        if headers is not None:  # streamable HTTP: the caller's own key (the transport refused requests without one)
            key = bearer(headers.get("authorization"))
        client = self._by_key.get(key)
        if client is None:
            client = self._by_key[key] = AsyncClient(self.url, api_key=key)
            while len(self._by_key) > self.size:
                _, old = self._by_key.popitem(last=False)
                await old.aclose()
        self._by_key.move_to_end(key)
        return client


def build_server(url: str | None = None, api_key: str | None = None) -> MCPServer:
    """The MCP server object (mcp.server.mcpserver.MCPServer) with memstream's tools."""
    clients = _Clients(url, api_key)

    async def call(ctx: Context, fn: Callable[[AsyncClient], Awaitable[Any]]) -> Any:
        client = await clients.get(ctx)
        try:
            return await fn(client)
        except MemstreamError as exc:  # the API's one error shape, as the tool error's text (plus the HTTP status)
            raise ToolError(_error_text(exc.status, exc.code or _client_code(exc), exc.message, exc.details,
                                        exc.request_id)) from None

    async def add_memory(
            conversation_id: Identifier,
            turns: Annotated[list[TurnIn], Field(min_length=1, max_length=1000)],
            ctx: Context,
            session_id: Identifier | None = None,
            tenant_id: Tenant = None,
            wait_seconds: Annotated[Wait, Field(description="Wait until every view has the turns.")] = 0.0,
    ) -> Annotated[CallToolResult, AddResult]:
        """Store turns of a conversation as memory (each becomes an immutable event). Returns the log positions."""
        events = [Turn(conversation_id=conversation_id, tenant_id=tenant_id, speaker=t.speaker, text=t.text,
                       role=t.role, session_id=t.session_id or session_id or "default", agent_id=t.agent_id,
                       metadata=t.metadata,
                       **({"occurred_at": t.occurred_at} if t.occurred_at else {}),
                       **({"event_id": t.event_id} if t.event_id else {})) for t in turns]

        async def run(client: AsyncClient) -> AddResult:
            result = await client.add(events)
            ready = bool(wait_seconds and result.positions) and await client.wait(result.positions, wait_seconds)
            return AddResult(accepted=result.accepted, rejected=result.rejected,
                             positions={str(p): o for p, o in result.positions.items()},
                             items=[PublishedItem(**i.model_dump(include={"index", "status", "event_id", "partition",
                                                                          "offset", "errors"})) for i in result.items],
                             ready=ready)

        return _result(await call(ctx, run))

    async def wait_for_memory(positions: Positions, ctx: Context, timeout_seconds: Wait = 30.0) -> bool:
        """Wait until every view has processed up to `positions` (from add_memory or forget_memory)."""
        return await call(ctx, lambda c: c.wait({int(p): o for p, o in positions.items()}, timeout_seconds))

    async def search_memory(question: Question, ctx: Context, conversation_id: Identifier | None = None,
                            session_id: Identifier | None = None, agent_id: Identifier | None = None,
                            since: datetime | None = None, until: datetime | None = None,
                            strategy: Strategy = "zero-mem", max_turns: MaxTurns = DEFAULT_MAX_TURNS,
                            tenant_id: Tenant = None) -> Annotated[CallToolResult, SearchOut]:
        """Evidence for a question from memory, best first (no LLM is called).

        The text lists each evidence unit as `#rank role score`, then its turns, one per line: `[date] speaker: text`.
        role says why the unit is there: primary (among the best-ranked units for the question), bridge (shares
        entities with a primary unit), neighbour (a turn next to one), fill (the ranking's next units, filling the
        budget). score is what the strategy ranked the unit by, higher first: it compares units within one response
        only, never across calls. The structured content also carries each turn's event id, log position and
        session."""
        result = await call(ctx, lambda c: c.search(question, conversation_id=conversation_id, session_id=session_id,
                                                    agent_id=agent_id, since=since, until=until, strategy=strategy,
                                                    max_turns=max_turns, tenant_id=tenant_id))
        out = SearchOut(strategy=result.strategy, llm_tokens=result.llm_tokens,
                        evidence=[_evidence(e) for e in result.evidence])
        return _result(out, evidence_text(result.evidence))

    async def answer_question(question: Question, ctx: Context, conversation_id: Identifier | None = None,
                              session_id: Identifier | None = None, agent_id: Identifier | None = None,
                              max_turns: MaxTurns = DEFAULT_MAX_TURNS,
                              tenant_id: Tenant = None) -> Annotated[CallToolResult, AnswerOut]:
        """The server's reader model answers from the evidence, then the answer is calibrated against it (an error
        when the server has no reader configured). The text is the answer, then the evidence as search_memory shows
        it."""
        result: AnswerResult = await call(ctx, lambda c: c.answer(
            question, conversation_id=conversation_id, session_id=session_id, agent_id=agent_id, max_turns=max_turns,
            tenant_id=tenant_id))
        out = AnswerOut(strategy=result.strategy, llm_tokens=result.llm_tokens, answer=result.answer,
                        reader_model=result.reader_model, evidence=[_evidence(e) for e in result.evidence])
        return _result(out, f"Answer: {result.answer}\n\n{evidence_text(result.evidence)}")

    async def forget_memory(
            ctx: Context,
            conversation_id: Identifier | None = None,
            session_id: Annotated[Identifier | None, Field(description="With conversation_id.")] = None,
            event_id: Annotated[Identifier | None, Field(description="One turn (with conversation_id).")] = None,
            agent_id: Annotated[Identifier | None, Field(description="Everything this agent said (alone).")] = None,
            occurred_before: datetime | None = None,
            reason: Annotated[str | None, Field(max_length=1000)] = None,
            wait_seconds: Annotated[Wait, Field(description="Wait until the forget is complete.")] = 0.0,
            tenant_id: Tenant = None,
    ) -> Annotated[CallToolResult, ForgetOut]:
        """Forget a conversation, a session, one turn, or an agent's turns (a whole tenant needs an admin key and no
        ids)."""
        details = _forget_scope_details(conversation_id, session_id, event_id, agent_id)
        if details:
            raise invalid_arguments("forget_memory", details)

        async def run(client: AsyncClient) -> ForgetOut:
            result = await client.forget(conversation_id=conversation_id, session_id=session_id, event_id=event_id,
                                         agent_id=agent_id, occurred_before=occurred_before, reason=reason,
                                         tenant_id=tenant_id)
            complete = bool(wait_seconds) and await client.wait(result.positions, wait_seconds)
            return ForgetOut(forget_id=result.forget_id, scope=result.scope,
                             positions={str(p): o for p, o in result.positions.items()}, complete=complete)

        return _result(await call(ctx, run))

    async def memory_status(ctx: Context) -> Annotated[CallToolResult, StatusOut]:
        """How far behind each view is (events and seconds): zero means every published turn is searchable."""
        status = await call(ctx, lambda c: c.status())
        return _result(StatusOut(caught_up=status.caught_up, views=[
            ViewLag(view=v.view, lag_events=v.lag_events, lag_seconds=v.lag_seconds, paused=v.paused)
            for v in status.views]))

    tools = [ClosedTool.of(fn) for fn in (add_memory, wait_for_memory, search_memory, answer_question, forget_memory,
                                         memory_status)]
    return MCPServer("memstream", version=version(), tools=tools, instructions=(
        "Long-term memory of agent conversations. add_memory stores turns (raw, never rewritten); search_memory "
        "returns evidence with provenance (event id, log position, session date, speaker); forget_memory erases; "
        "memory_status shows lag."))


# -- keys ---------------------------------------------------------------------------------------
def _key_client(url: str | None, key: str) -> AsyncClient:
    return AsyncClient(url, api_key=key, retry=RetryPolicy(attempts=1), timeout=KEY_CHECK_TIMEOUT)


async def check_key(url: str | None, key: str) -> None:
    """Ask the API whether it accepts `key` (GET /v1/status, which any key may read), once, without retrying: raises
    the client's error (AuthenticationError when refused)."""
    async with _key_client(url, key) as client:
        await client.status()


def check_stdio_key(url: str | None, key: str | None) -> None:
    """Fail at start, with the reason, rather than on every tool call: no key, or one the API refuses."""

    async def check() -> None:
        async with _key_client(url, key or "") as client:
            if not key:
                raise ConfigurationError("memstream mcp --transport stdio needs MEMSTREAM_API_KEY: a key of the "
                                         f"memstream API at {client.url} (`memstream keys create`), set by the agent "
                                         "host that starts it")
            try:
                await client.status()
            except AuthenticationError:
                raise ConfigurationError(f"the memstream API at {client.url} does not accept MEMSTREAM_API_KEY (401 "
                                         "unauthorized): set a key of that server (`memstream keys create` there makes "
                                         "one)") from None
            except MemstreamError as exc:
                raise ConfigurationError(f"could not check MEMSTREAM_API_KEY with the memstream API at {client.url}: "
                                         f"{exc} (is `memstream serve` running there? --url or MEMSTREAM_URL names "
                                         "it)") from None

    asyncio.run(check())


def _refusal(status: int, code: str, message: str, headers: dict[str, str]) -> Response:
    return JSONResponse({"error": {"code": code, "message": message, "details": []}}, status_code=status,
                        headers=headers)


class KeyGate:
    """ASGI middleware in front of the streamable HTTP app. Host and Origin are checked first (the SDK's own
    DNS-rebinding check, so a foreign page learns nothing about keys), then the bearer key: none, or one the memstream
    API refuses, is 401 with `WWW-Authenticate: Bearer` before MCP handles the request — initialize and tools/list
    included. Keys the API accepted are trusted for `ttl` seconds, `size` of them at most, by SHA-256."""

    def __init__(self, app: ASGIApp, security: TransportSecuritySettings, url: str | None, ttl: float = KEY_TTL,
                 size: int = KEY_CACHE_SIZE):
        self.app, self.url, self.ttl, self.size = app, url, ttl, size
        self.security = TransportSecurityMiddleware(security)
        self._trusted: OrderedDict[bytes, float] = OrderedDict()  # SHA-256 of a key -> when it stops being trusted

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # the lifespan
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        refused = await self.security.validate_request(request)
        if refused is None:
            key = bearer(request.headers.get("authorization"))
            if not key:
                refused = _refusal(401, "unauthorized", "this endpoint needs `Authorization: Bearer <memstream API "
                                   "key>`", {"WWW-Authenticate": 'Bearer realm="memstream"'})
            else:
                refused = await self._refusal(key)
        if refused is not None:
            await refused(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    async def _refusal(self, key: str) -> Response | None:
        digest, now = hashlib.sha256(key.encode()).digest(), time.monotonic()
        if self._trusted.get(digest, 0.0) > now:
            self._trusted.move_to_end(digest)
            return None
        try:
            await check_key(self.url, key)
        except AuthenticationError:
            log.info("memstream mcp: refused a request whose key the memstream API does not accept")
            return _refusal(401, "unauthorized", "the memstream API does not accept this key", {
                "WWW-Authenticate": 'Bearer realm="memstream", error="invalid_token", '
                                    'error_description="the memstream API does not accept this key"'})
        except RateLimited as exc:
            return _refusal(429, "rate_limited", exc.message, {"Retry-After": str(int(exc.retry_after or 1))})
        except MemstreamError as exc:
            log.warning("memstream mcp: could not check a key with the memstream API: %s", exc)
            return _refusal(503, "unavailable", f"could not check the key with the memstream API: {exc.message}",
                            {"Retry-After": "1"})
        self._trusted[digest] = now + self.ttl
        self._trusted.move_to_end(digest)
        while len(self._trusted) > self.size:
            self._trusted.popitem(last=False)
        return None


# -- transports -------------------------------------------------------------------------------
LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")


def http_app(url: str | None, host: str, port: int, allowed_origins: list[str], allowed_hosts: list[str]) -> ASGIApp:
    """The streamable HTTP ASGI app (endpoint /mcp): Host and Origin validation, then the bearer key, then MCP."""
    hosts = [f"{h}:*" for h in LOOPBACK] + [h if ":" in h else f"{h}:*" for h in allowed_hosts]
    origins = [f"http://{h}:*" for h in LOOPBACK] + [f"https://{h}:*" for h in LOOPBACK] + list(allowed_origins)
    if host not in LOOPBACK and host not in allowed_hosts:
        hosts.append(f"{host}:{port}")
    security = TransportSecuritySettings(enable_dns_rebinding_protection=True, allowed_hosts=hosts,
                                         allowed_origins=origins)
    app = build_server(url, None).streamable_http_app(streamable_http_path="/mcp", stateless_http=True,
                                                      json_response=True, transport_security=security)
    return KeyGate(app, security, url)


def run(transport: str, url: str | None, api_key: str | None, host: str, port: int, allowed_origins: list[str],
        allowed_hosts: list[str]) -> None:
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)  # stdout is the stdio transport's channel
    if transport == "stdio":
        check_stdio_key(url, api_key)
        build_server(url, api_key).run("stdio")
        return
    import uvicorn

    if host not in LOOPBACK:
        log.warning("memstream mcp: listening on %s, not a loopback address: only the origins given with "
                    "--allow-origin may call it from a browser, and every call needs its own memstream API key", host)
    app = http_app(url, host, port, allowed_origins, allowed_hosts)
    print(f"memstream mcp: streamable HTTP on http://{host}:{port}/mcp "
          f"(memstream at {url or 'MEMSTREAM_URL / http://127.0.0.1:8080'})", file=sys.stderr, flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning")
