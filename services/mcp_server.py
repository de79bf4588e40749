"""memstream as an MCP server (`memstream mcp`): a thin client of a running `memstream serve`.

It loads no model and opens no store: every tool is one or two calls of the HTTP API through
`memstream_client.AsyncClient`, so the keys, roles and tenant bounds are the API's. Over stdio
the key is MEMSTREAM_API_KEY (the agent host starts this process with it); over streamable HTTP
each request's own `Authorization: Bearer …` header is passed through (the MCP server holds no
key of its own). A refusal of the API (a bad key, another tenant, invalid arguments) comes back
as an MCP tool error whose text is the API's error shape (`{"error": {"status", "code", "message",
"details", "request_id"}}`); the server keeps running.

The HTTP transport binds to loopback unless told otherwise and validates `Host` and `Origin`
(DNS-rebinding protection): only the loopback names, plus the origins given with
`--allow-origin`, may call it from a browser.

Results carry provenance: every evidence turn has its event id, log position (partition,
offset), session, session date (`occurred_at`) and speaker.
"""

from __future__ import annotations

import json
import logging
import sys
from collections import OrderedDict
from datetime import datetime
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel, Field

from memstream_client import AsyncClient, MemstreamError, Turn
from memstream_client.models import SearchResult

log = logging.getLogger(__name__)

ID = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[^\s\x00-\x1f\x7f](?:[^\x00-\x1f\x7f]{0,198}[^\s\x00-\x1f\x7f])?$")]
Strategy = Literal["zero-mem", "graph-only", "hierarchy-only", "no-closure", "no-calibration", "bm25", "dense", "hybrid-rrf", "raw-rag",
                   "pyramid"]


# -- tool arguments and results --------------------------------------------------------------
class TurnIn(BaseModel):
    speaker: Annotated[str, Field(min_length=1, max_length=200, description="Who said it (a name, or 'user'/'assistant').")]
    text: Annotated[str, Field(max_length=100_000)]
    role: Literal["user", "assistant", "agent", "tool", "system"] = "user"
    session_id: ID | None = Field(None, description="Default: the call's session_id, else 'default'.")
    agent_id: ID | None = Field(None, description="The agent that published it; default: derived from the speaker.")
    occurred_at: datetime | None = Field(None, description="When it was said (ISO 8601 with offset); default: now.")
    event_id: ID | None = Field(None, description="Idempotency key; default: a new random id.")
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
    complete: bool = Field(description="True when the call waited and the forget is complete (gone from every view, keys destroyed).")


class ViewLag(BaseModel):
    view: str
    lag_events: int
    lag_seconds: float = Field(description="Age of the oldest event the view has not processed yet (0 when caught up).")
    paused: bool


class StatusOut(BaseModel):
    caught_up: bool
    views: list[ViewLag]


def _search_out(result: SearchResult) -> dict[str, Any]:
    return {
        "strategy": result.strategy, "llm_tokens": result.llm_tokens,
        "evidence": [{
            "rank": e.rank, "kind": e.kind, "text": e.text, "conversation_id": e.conversation_id, "session_id": e.session_id,
            "occurred_from": e.occurred_from, "occurred_to": e.occurred_to,
            "turns": [{"event_id": t.event_id, "speaker": t.speaker, "text": t.text, "session_id": t.session_id,
                       "session_date": t.occurred_at, "partition": t.partition, "offset": t.offset} for t in e.turns],
        } for e in result.evidence],
    }


# -- the server -------------------------------------------------------------------------------
class _Clients:
    """One API client per key (bounded): stdio has one; HTTP passes each caller's key through."""

    def __init__(self, url: str | None, api_key: str | None, size: int = 64):
        self.url, self.api_key, self.size = url, api_key, size
        self._by_key: OrderedDict[str | None, AsyncClient] = OrderedDict()

    async def get(self, ctx) -> AsyncClient:
        key = self.api_key
        headers = getattr(ctx, "headers", None) if ctx is not None else None
        if headers is not None:  # streamable HTTP: the caller's own key, or none at all
            auth = headers.get("authorization") or ""
            key = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
        client = self._by_key.get(key)
        if client is None:
            client = self._by_key[key] = AsyncClient(self.url, api_key=key or "", retry=None)
            while len(self._by_key) > self.size:
                _, old = self._by_key.popitem(last=False)
                await old.aclose()
        self._by_key.move_to_end(key)
        return client


def build_server(url: str | None = None, api_key: str | None = None):
    """The MCP server object (mcp.server.mcpserver.MCPServer) with memstream's tools."""
    server = MCPServer("memstream", instructions=(
        "Long-term memory of agent conversations. add_memory stores turns (raw, never rewritten); search_memory returns evidence "
        "with provenance (event id, log position, session date, speaker); forget_memory erases; memory_status shows lag."))
    clients = _Clients(url, api_key)

    async def call(ctx, fn):
        client = await clients.get(ctx)
        try:
            return await fn(client)
        except MemstreamError as exc:  # the API's one error shape, as the tool error's text (plus the HTTP status)
            raise ToolError(json.dumps({"error": {"status": exc.status, "code": exc.code or "unavailable", "message": exc.message,
                                                  "details": exc.details, "request_id": exc.request_id}}, default=str)) from None

    @server.tool()
    async def add_memory(conversation_id: ID, turns: Annotated[list[TurnIn], Field(min_length=1, max_length=1000)],
                         ctx: Context, session_id: ID | None = None, tenant_id: Annotated[str | None, Field(description="Default: the key's tenant (an admin key must name one).")] = None,
                         wait_seconds: Annotated[float, Field(ge=0, le=300, description="Wait until every view has the turns.")] = 0.0
                         ) -> AddResult:
        """Store turns of a conversation as memory (each becomes an immutable event). Returns the log positions."""
        events = [Turn(conversation_id=conversation_id, tenant_id=tenant_id, speaker=t.speaker, text=t.text, role=t.role, session_id=t.session_id or session_id or "default",
                       agent_id=t.agent_id, metadata=t.metadata, **({"occurred_at": t.occurred_at} if t.occurred_at else {}),
                       **({"event_id": t.event_id} if t.event_id else {})) for t in turns]

        async def run(client: AsyncClient):
            result = await client.add(events)
            ready = bool(wait_seconds and result.positions) and await client.wait(result.positions, wait_seconds)
            return AddResult(accepted=result.accepted, rejected=result.rejected, positions={str(p): o for p, o in result.positions.items()},
                             items=[PublishedItem(**i.model_dump(include={"index", "status", "event_id", "partition", "offset", "errors"}))
                                    for i in result.items], ready=ready)

        return await call(ctx, run)

    @server.tool()
    async def wait_for_memory(positions: dict[str, int], ctx: Context,
                              timeout_seconds: Annotated[float, Field(ge=0, le=300)] = 30.0) -> bool:
        """Wait until every view has processed up to `positions` (from add_memory or forget_memory)."""
        return await call(ctx, lambda c: c.wait({int(p): o for p, o in positions.items()}, timeout_seconds))

    @server.tool()
    async def search_memory(question: Annotated[str, Field(min_length=1, max_length=4000)], ctx: Context,
                            conversation_id: ID | None = None, session_id: ID | None = None, agent_id: ID | None = None,
                            since: datetime | None = None, until: datetime | None = None, strategy: Strategy = "zero-mem",
                            max_turns: Annotated[int, Field(ge=1, le=200, description="Evidence budget in distinct turns.")] = 10,
                            tenant_id: Annotated[str | None, Field(description="Default: the key's tenant (an admin key must name one).")] = None) -> SearchOut:
        """Evidence for a question from memory (no LLM is called): ranked units with their turns and provenance."""
        result = await call(ctx, lambda c: c.search(question, conversation_id=conversation_id, session_id=session_id, agent_id=agent_id,
                                                    since=since, until=until, strategy=strategy, max_turns=max_turns,
                                                    tenant_id=tenant_id))
        return SearchOut.model_validate(_search_out(result))

    @server.tool()
    async def answer_question(question: Annotated[str, Field(min_length=1, max_length=4000)], ctx: Context,
                              conversation_id: ID | None = None, session_id: ID | None = None, agent_id: ID | None = None,
                              max_turns: Annotated[int, Field(ge=1, le=200)] = 25, tenant_id: Annotated[str | None, Field(description="Default: the key's tenant (an admin key must name one).")] = None) -> AnswerOut:
        """The server's reader model answers from the evidence, then the answer is calibrated against it
        (an error when the server has no reader configured)."""
        result = await call(ctx, lambda c: c.answer(question, conversation_id=conversation_id, session_id=session_id, agent_id=agent_id,
                                                    max_turns=max_turns, tenant_id=tenant_id))
        return AnswerOut.model_validate({**_search_out(result), "answer": result.answer, "reader_model": result.reader_model})

    @server.tool()
    async def forget_memory(ctx: Context, conversation_id: ID | None = None, session_id: ID | None = None,
                            event_id: Annotated[str | None, Field(description="One turn (with conversation_id).")] = None,
                            agent_id: Annotated[str | None, Field(description="Everything this agent said.")] = None,
                            occurred_before: datetime | None = None, reason: Annotated[str | None, Field(max_length=1000)] = None,
                            wait_seconds: Annotated[float, Field(ge=0, le=300, description="Wait until the forget is complete.")] = 0.0,
                            tenant_id: Annotated[str | None, Field(description="Default: the key's tenant (an admin key must name one).")] = None) -> ForgetOut:
        """Forget a conversation, a session, one turn, or an agent's turns (a whole tenant needs an admin key and no ids)."""
        async def run(client: AsyncClient):
            result = await client.forget(conversation_id=conversation_id, session_id=session_id, event_id=event_id, agent_id=agent_id,
                                         occurred_before=occurred_before, reason=reason, tenant_id=tenant_id)
            complete = bool(wait_seconds) and await client.wait(result.positions, wait_seconds)
            return ForgetOut(forget_id=result.forget_id, scope=result.scope, positions={str(p): o for p, o in result.positions.items()},
                             complete=complete)

        return await call(ctx, run)

    @server.tool()
    async def memory_status(ctx: Context) -> StatusOut:
        """How far behind each view is (events and seconds): zero means every published turn is searchable."""
        status = await call(ctx, lambda c: c.status())
        return StatusOut(caught_up=status.caught_up, views=[ViewLag(view=v.view, lag_events=v.lag_events, lag_seconds=v.lag_seconds,
                                                                    paused=v.paused) for v in status.views])

    return server


LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")


def http_app(server, host: str, port: int, allowed_origins: list[str], allowed_hosts: list[str]):
    """The streamable HTTP ASGI app (endpoint /mcp) with Host and Origin validation."""
    from mcp.server.transport_security import TransportSecuritySettings

    hosts = [f"{h}:*" for h in LOOPBACK] + [h if ":" in h else f"{h}:*" for h in allowed_hosts]
    origins = [f"http://{h}:*" for h in LOOPBACK] + [f"https://{h}:*" for h in LOOPBACK] + list(allowed_origins)
    if host not in LOOPBACK and host not in allowed_hosts:
        hosts.append(f"{host}:{port}")
    security = TransportSecuritySettings(enable_dns_rebinding_protection=True, allowed_hosts=hosts, allowed_origins=origins)
    return server.streamable_http_app(streamable_http_path="/mcp", stateless_http=True, json_response=True, transport_security=security)


def run(transport: str, url: str | None, api_key: str | None, host: str, port: int, allowed_origins: list[str], allowed_hosts: list[str]) -> None:
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)  # stdout is the stdio transport's channel
    if transport == "stdio":
        build_server(url, api_key).run("stdio")
        return
    import uvicorn

    if host not in LOOPBACK:
        log.warning("memstream mcp: listening on %s, not a loopback address: only the origins given with --allow-origin may call it "
                    "from a browser, and every call needs its own memstream API key", host)
    app = http_app(build_server(url, None), host, port, allowed_origins, allowed_hosts)
    print(f"memstream mcp: streamable HTTP on http://{host}:{port}/mcp (memstream at {url or 'MEMSTREAM_URL / http://127.0.0.1:8080'})",
          file=sys.stderr, flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning")
