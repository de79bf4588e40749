"""`Client` (blocking) and `AsyncClient`: the same operations; the requests are built once, in
`_http.Operations`, and these classes only send them (with the retries of `_http.RetryPolicy`).

Search options, for `search` and `answer` (each left None lets the server's default apply):

- `max_turns` is the results' limit: evidence units are added in rank order until they hold that
  many distinct turns (the last unit may be cut). Server default 25, at most 500.
- `k` is how many of the best fused units seed the evidence as `primary`, before closure adds
  `bridge` and `neighbour` units and `fill` tops it up to `max_turns`; it does not limit the
  results. Server default 5.
- Each evidence unit carries `rank`, `role` (primary | bridge | neighbour | fill) and `score`: the
  score its strategy ranked it by, comparable within one result only.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Iterator

import httpx

from memstream_client import _http
from memstream_client._http import (Call, Operations, RetryPolicy, Settings, events_of, outcome, request_kwargs,
                                    retry_delay, transport_error)
from memstream_client.errors import WaitTimeout
from memstream_client.models import (AddResult, AnswerResult, ForgetResult, Positions, SearchResult, Status, StoredTurn,
                                     TurnHistory, TurnPage)

if TYPE_CHECKING:
    from memstream_client.batch import AsyncBatch, Batch

# A builder makes each attempt's request afresh: a retried wait asks for the time left, not the time it had.
CallOrBuild = Call | Callable[[], Call]


def _search_options(conversation_id, session_id, agent_id, since, until, as_of, strategy, k, max_turns,
                    tenant_id) -> dict[str, Any]:
    return {"conversation_id": conversation_id, "session_id": session_id, "agent_id": agent_id, "since": since,
            "until": until, "as_of": as_of, "strategy": strategy, "k": k, "max_turns": max_turns,
            "tenant_id": tenant_id}


def _wait_more(started: float, deadline: float) -> bool:
    """After a WaitTimeout: whether to send the wait's next request — time is left, and the
    request ran out its whole time (one of several of a long wait) rather than being answered
    early by something in between, which a loop would only repeat."""
    now = time.monotonic()
    return now < deadline - 0.01 and now - started >= 0.5 * min(_http.MAX_WAIT, deadline - started)


def _forget_scope(conversation_id, session_id, event_id, agent_id, occurred_before, reason,
                  tenant_id) -> dict[str, Any]:
    return {"conversation_id": conversation_id, "session_id": session_id, "event_id": event_id, "agent_id": agent_id,
            "occurred_before": occurred_before, "reason": reason, "tenant_id": tenant_id}


class Client:
    """A blocking client. `url` and `api_key` default to MEMSTREAM_URL and MEMSTREAM_API_KEY;
    `tenant_id` (optional) is named in every request — a reader or writer key's own tenant is
    the default on the server; an admin key must name one. `timeout` is the HTTP timeout of
    every request but `wait`'s, which lasts as long as the wait."""

    def __init__(self, url: str | None = None, api_key: str | None = None, *, tenant_id: str | None = None,
                 timeout: float | httpx.Timeout | None = 30.0,
                 retry: RetryPolicy | None = None, headers: dict[str, str] | None = None,
                 transport: httpx.BaseTransport | None = None):
        self._settings = Settings(url, api_key, timeout, retry or RetryPolicy(), dict(headers or {}))
        self.url, headers_ = self._settings.resolved()
        self._ops = Operations(tenant_id)
        self._http = httpx.Client(base_url=self.url, headers=headers_, timeout=timeout, transport=transport)

    # -- lifecycle ---------------------------------------------------------------------------
    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- sending -----------------------------------------------------------------------------
    def _send(self, call: CallOrBuild, deadline: float | None = None) -> Any:
        """The call's result, retried as `_http.retry_delay` says (no retry starts after `deadline`)."""
        policy, attempt = self._settings.retry, 0
        while True:
            this = call() if callable(call) else call
            try:
                response = self._http.request(this.method, this.path, **request_kwargs(this, self._settings.timeout))
            except httpx.TransportError as exc:
                delay = retry_delay(policy, attempt, None, deadline)
                if delay is None:
                    raise transport_error(exc, self.url) from exc
            else:
                delay = retry_delay(policy, attempt, response, deadline)
                if delay is None:
                    return outcome(this, response)
            time.sleep(delay)
            attempt += 1

    # -- operations --------------------------------------------------------------------------
    def add(self, turns: Any) -> AddResult:
        """Publish turns (`Turn`s, or dicts with at least conversation_id, speaker and text) or
        events (dicts with a `type`). Returns every item's fate and the positions to `wait` on;
        raises only when nothing was accepted. A turn dict `Turn` refuses (an unknown key, a
        wrong type) raises InvalidRequest naming it, before anything is sent."""
        return self._send(self._ops.add(turns))

    def batch(self, max_size: int = 500, max_delay: float = 1.0) -> "Batch":
        """A buffer that publishes when it holds `max_size` items or its oldest waited
        `max_delay` seconds, and on `flush()`/exit."""
        from memstream_client.batch import Batch

        return Batch(self, max_size, max_delay)

    def search(self, question: str, *, conversation_id: str | None = None, session_id: str | None = None,
               agent_id: str | None = None, since: datetime | None = None, until: datetime | None = None,
               as_of: datetime | None = None, strategy: str | None = None, k: int | None = None,
               max_turns: int | None = None, tenant_id: str | None = None) -> SearchResult:
        """Evidence for a question (zero LLM tokens): ranked units, each with its turns and
        their provenance (event id, log position, session date, speaker). `max_turns` limits the
        results (distinct turns; server default 25); `k` is how many of the best units seed them
        as `primary` and does not limit them (module docstring)."""
        return self._send(self._ops.search(question, **_search_options(
            conversation_id, session_id, agent_id, since, until, as_of, strategy, k, max_turns, tenant_id)))

    def answer(self, question: str, *, conversation_id: str | None = None, session_id: str | None = None,
               agent_id: str | None = None, since: datetime | None = None, until: datetime | None = None,
               as_of: datetime | None = None, strategy: str | None = None, k: int | None = None,
               max_turns: int | None = None, tenant_id: str | None = None) -> AnswerResult:
        """The search (same options), then the server's reader model's calibrated answer. A
        server with no reader configured answers 400 (BadRequest, "no reader is configured")."""
        return self._send(self._ops.answer(question, **_search_options(
            conversation_id, session_id, agent_id, since, until, as_of, strategy, k, max_turns, tenant_id)))

    def forget(self, *, conversation_id: str | None = None, session_id: str | None = None, event_id: str | None = None,
               agent_id: str | None = None, occurred_before: datetime | None = None, reason: str | None = None,
               tenant_id: str | None = None) -> ForgetResult:
        """Forget a conversation, a session, a turn (`event_id`), an agent's turns, or — with
        none of those and an admin key — a tenant; `occurred_before` narrows any of them.
        `wait(result.positions)` returns once it is complete."""
        return self._send(self._ops.forget(**_forget_scope(
            conversation_id, session_id, event_id, agent_id, occurred_before, reason, tenant_id)))

    def wait(self, positions: Positions, timeout: float = 30.0) -> bool:
        """Block until every view has processed up to `positions` (read-your-writes). Returns True
        then; raises WaitTimeout once `timeout` seconds passed without it, whatever the client's
        HTTP timeout (a wait's request lasts as long as the wait). Waits longer than the API's
        300 s per request are several requests; a wait that ran out is not retried."""
        deadline = time.monotonic() + timeout
        self._ops.wait(positions, 0)  # malformed positions are refused before any request
        while True:
            started = time.monotonic()
            try:
                return self._send(lambda: self._ops.wait(positions, deadline - time.monotonic()), deadline)
            except WaitTimeout:
                if not _wait_more(started, deadline):
                    raise

    def status(self) -> Status:
        return self._send(self._ops.status())

    def get_turn(self, event_id: str, *, conversation_id: str | None = None,
                 tenant_id: str | None = None) -> StoredTurn:
        return self._send(self._ops.turn(event_id, conversation_id, tenant_id))

    def turn_history(self, event_id: str, *, conversation_id: str | None = None,
                     tenant_id: str | None = None) -> TurnHistory:
        return self._send(self._ops.turn_history(event_id, conversation_id, tenant_id))

    def list_turns(self, *, conversation_id: str | None = None, session_id: str | None = None,
                   agent_id: str | None = None, cursor: str | None = None, limit: int = 100,
                   include_superseded: bool = False, tenant_id: str | None = None) -> TurnPage:
        """One page of a boundary's turns in conversation order; pass `next_cursor` for the next."""
        return self._send(self._ops.turns(conversation_id=conversation_id, session_id=session_id, agent_id=agent_id,
                                          cursor=cursor, limit=limit, include_superseded=include_superseded or None,
                                          tenant_id=tenant_id))

    def iter_turns(self, **query: Any) -> Iterator[StoredTurn]:
        cursor = None
        while True:
            page = self.list_turns(**query, cursor=cursor)
            yield from page.turns
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    def export(self, *, conversation_id: str | None = None, tenant_id: str | None = None) -> Iterator[dict[str, Any]]:
        """The raw turns still held (TurnRecorded events as dicts), in log order."""
        call = self._ops.export(conversation_id, tenant_id)
        with self._http.stream("GET", call.path, params=call.params) as response:
            if response.status_code != 200:
                response.read()
                outcome(Call("GET", call.path, ok=()), response)
            yield from events_of(response.iter_lines())


class AsyncClient:
    """The asyncio twin of `Client` (same arguments, same methods as coroutines)."""

    def __init__(self, url: str | None = None, api_key: str | None = None, *, tenant_id: str | None = None,
                 timeout: float | httpx.Timeout | None = 30.0,
                 retry: RetryPolicy | None = None, headers: dict[str, str] | None = None,
                 transport: httpx.AsyncBaseTransport | None = None):
        self._settings = Settings(url, api_key, timeout, retry or RetryPolicy(), dict(headers or {}))
        self.url, headers_ = self._settings.resolved()
        self._ops = Operations(tenant_id)
        self._http = httpx.AsyncClient(base_url=self.url, headers=headers_, timeout=timeout, transport=transport)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    async def _send(self, call: CallOrBuild, deadline: float | None = None) -> Any:
        policy, attempt = self._settings.retry, 0
        while True:
            this = call() if callable(call) else call
            try:
                response = await self._http.request(this.method, this.path,
                                                    **request_kwargs(this, self._settings.timeout))
            except httpx.TransportError as exc:
                delay = retry_delay(policy, attempt, None, deadline)
                if delay is None:
                    raise transport_error(exc, self.url) from exc
            else:
                delay = retry_delay(policy, attempt, response, deadline)
                if delay is None:
                    return outcome(this, response)
            await asyncio.sleep(delay)
            attempt += 1

    async def add(self, turns: Any) -> AddResult:
        """As `Client.add`."""
        return await self._send(self._ops.add(turns))

    def batch(self, max_size: int = 500, max_delay: float = 1.0) -> "AsyncBatch":
        from memstream_client.batch import AsyncBatch

        return AsyncBatch(self, max_size, max_delay)

    async def search(self, question: str, *, conversation_id: str | None = None, session_id: str | None = None,
                     agent_id: str | None = None, since: datetime | None = None, until: datetime | None = None,
                     as_of: datetime | None = None, strategy: str | None = None, k: int | None = None,
                     max_turns: int | None = None, tenant_id: str | None = None) -> SearchResult:
        """As `Client.search`: `max_turns` limits the results, `k` seeds them (module docstring)."""
        return await self._send(self._ops.search(question, **_search_options(
            conversation_id, session_id, agent_id, since, until, as_of, strategy, k, max_turns, tenant_id)))

    async def answer(self, question: str, *, conversation_id: str | None = None, session_id: str | None = None,
                     agent_id: str | None = None, since: datetime | None = None, until: datetime | None = None,
                     as_of: datetime | None = None, strategy: str | None = None, k: int | None = None,
                     max_turns: int | None = None, tenant_id: str | None = None) -> AnswerResult:
        """As `Client.answer` (400 BadRequest when the server has no reader configured)."""
        return await self._send(self._ops.answer(question, **_search_options(
            conversation_id, session_id, agent_id, since, until, as_of, strategy, k, max_turns, tenant_id)))

    async def forget(self, *, conversation_id: str | None = None, session_id: str | None = None,
                     event_id: str | None = None, agent_id: str | None = None, occurred_before: datetime | None = None,
                     reason: str | None = None, tenant_id: str | None = None) -> ForgetResult:
        return await self._send(self._ops.forget(**_forget_scope(
            conversation_id, session_id, event_id, agent_id, occurred_before, reason, tenant_id)))

    async def wait(self, positions: Positions, timeout: float = 30.0) -> bool:
        """As `Client.wait`: True, or WaitTimeout once `timeout` seconds passed (not retried)."""
        deadline = time.monotonic() + timeout
        self._ops.wait(positions, 0)
        while True:
            started = time.monotonic()
            try:
                return await self._send(lambda: self._ops.wait(positions, deadline - time.monotonic()), deadline)
            except WaitTimeout:
                if not _wait_more(started, deadline):
                    raise

    async def status(self) -> Status:
        return await self._send(self._ops.status())

    async def get_turn(self, event_id: str, *, conversation_id: str | None = None,
                       tenant_id: str | None = None) -> StoredTurn:
        return await self._send(self._ops.turn(event_id, conversation_id, tenant_id))

    async def turn_history(self, event_id: str, *, conversation_id: str | None = None,
                           tenant_id: str | None = None) -> TurnHistory:
        return await self._send(self._ops.turn_history(event_id, conversation_id, tenant_id))

    async def list_turns(self, *, conversation_id: str | None = None, session_id: str | None = None,
                         agent_id: str | None = None, cursor: str | None = None, limit: int = 100,
                         include_superseded: bool = False, tenant_id: str | None = None) -> TurnPage:
        return await self._send(self._ops.turns(conversation_id=conversation_id, session_id=session_id,
                                                agent_id=agent_id, cursor=cursor, limit=limit,
                                                include_superseded=include_superseded or None, tenant_id=tenant_id))

    async def iter_turns(self, **query: Any) -> AsyncIterator[StoredTurn]:
        cursor = None
        while True:
            page = await self.list_turns(**query, cursor=cursor)
            for turn in page.turns:
                yield turn
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    async def export(self, *, conversation_id: str | None = None,
                     tenant_id: str | None = None) -> AsyncIterator[dict[str, Any]]:
        import json

        call = self._ops.export(conversation_id, tenant_id)
        async with self._http.stream("GET", call.path, params=call.params) as response:
            if response.status_code != 200:
                await response.aread()
                outcome(Call("GET", call.path, ok=()), response)
            async for line in response.aiter_lines():
                if line.strip():
                    yield json.loads(line)
