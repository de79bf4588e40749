"""`Client` (blocking) and `AsyncClient`: the same operations; the requests are built once, in
`_http.Operations`, and these classes only send them (with the retries of `_http.RetryPolicy`)."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime
from typing import TYPE_CHECKING, Any, AsyncIterator, Iterator

import httpx

from memstream_client.errors import WaitTimeout
from memstream_client._http import Call, Operations, RetryPolicy, Settings, events_of, outcome, request_kwargs, retry_after, transport_error
from memstream_client.models import AddResult, AnswerResult, ForgetResult, Positions, SearchResult, Status, StoredTurn, TurnHistory, TurnPage

if TYPE_CHECKING:
    from memstream_client.batch import AsyncBatch, Batch

SearchOptions = dict[str, Any]
MAX_WAIT = 300.0  # the API's longest single wait


def _search_options(conversation_id, session_id, agent_id, since, until, as_of, strategy, k, max_turns, tenant_id) -> SearchOptions:
    return {"conversation_id": conversation_id, "session_id": session_id, "agent_id": agent_id, "since": since, "until": until,
            "as_of": as_of, "strategy": strategy, "k": k, "max_turns": max_turns, "tenant_id": tenant_id}


def _forget_scope(conversation_id, session_id, event_id, agent_id, occurred_before, reason, tenant_id) -> dict[str, Any]:
    return {"conversation_id": conversation_id, "session_id": session_id, "event_id": event_id, "agent_id": agent_id,
            "occurred_before": occurred_before, "reason": reason, "tenant_id": tenant_id}


class Client:
    """A blocking client. `url` and `api_key` default to MEMSTREAM_URL and MEMSTREAM_API_KEY;
    `tenant_id` (optional) is named in every request — a reader or writer key's own tenant is
    the default on the server; an admin key must name one."""

    def __init__(self, url: str | None = None, api_key: str | None = None, *, tenant_id: str | None = None, timeout: float = 30.0,
                 retry: RetryPolicy | None = None, headers: dict[str, str] | None = None, transport: httpx.BaseTransport | None = None):
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
    def _send(self, call: Call) -> Any:
        policy = self._settings.retry
        for attempt in range(policy.attempts):
            last = attempt == policy.attempts - 1
            try:
                response = self._http.request(call.method, call.path, **request_kwargs(call))
            except httpx.TransportError as exc:
                if last:
                    raise transport_error(exc, self.url) from exc
                time.sleep(policy.delay(attempt, None))
                continue
            if response.status_code in policy.statuses and not last:
                time.sleep(policy.delay(attempt, retry_after(response)))
                continue
            return outcome(call, response)
        raise AssertionError("unreachable")

    # -- operations --------------------------------------------------------------------------
    def add(self, turns: Any) -> AddResult:
        """Publish turns (`Turn`s, or dicts with at least conversation_id, speaker and text) or
        events (dicts with a `type`). Returns every item's fate and the positions to `wait` on;
        raises only when nothing was accepted."""
        return self._send(self._ops.add(turns))

    def batch(self, max_size: int = 500, max_delay: float = 1.0) -> "Batch":
        """A buffer that publishes when it holds `max_size` items or its oldest waited
        `max_delay` seconds, and on `flush()`/exit."""
        from memstream_client.batch import Batch

        return Batch(self, max_size, max_delay)

    def search(self, question: str, *, conversation_id: str | None = None, session_id: str | None = None, agent_id: str | None = None,
               since: datetime | None = None, until: datetime | None = None, as_of: datetime | None = None, strategy: str | None = None,
               k: int | None = None, max_turns: int | None = None, tenant_id: str | None = None) -> SearchResult:
        """Evidence for a question (zero LLM tokens): ranked units, each with its turns and
        their provenance (event id, log position, session date, speaker)."""
        return self._send(self._ops.search(question, **_search_options(conversation_id, session_id, agent_id, since, until, as_of,
                                                                          strategy, k, max_turns, tenant_id)))

    def answer(self, question: str, *, conversation_id: str | None = None, session_id: str | None = None, agent_id: str | None = None,
               since: datetime | None = None, until: datetime | None = None, as_of: datetime | None = None, strategy: str | None = None,
               k: int | None = None, max_turns: int | None = None, tenant_id: str | None = None) -> AnswerResult:
        """The search, then the server's reader model's calibrated answer (503 when the server
        has no reader configured)."""
        return self._send(self._ops.answer(question, **_search_options(conversation_id, session_id, agent_id, since, until, as_of,
                                                                          strategy, k, max_turns, tenant_id)))

    def forget(self, *, conversation_id: str | None = None, session_id: str | None = None, event_id: str | None = None,
               agent_id: str | None = None, occurred_before: datetime | None = None, reason: str | None = None,
               tenant_id: str | None = None) -> ForgetResult:
        """Forget a conversation, a session, a turn (`event_id`), an agent's turns, or — with
        none of those and an admin key — a tenant; `occurred_before` narrows any of them.
        `wait(result.positions)` returns once it is complete."""
        return self._send(self._ops.forget(**_forget_scope(conversation_id, session_id, event_id, agent_id, occurred_before, reason,
                                                           tenant_id)))

    def wait(self, positions: Positions, timeout: float = 30.0) -> bool:
        """Block until every view has processed up to `positions` (read-your-writes); raises
        WaitTimeout if that takes longer than `timeout` seconds (longer waits than the API's
        300 s per request are several requests)."""
        deadline = time.monotonic() + timeout
        while True:
            chunk = min(MAX_WAIT, max(0.0, deadline - time.monotonic()))
            try:
                return self._send(self._ops.wait(positions, chunk))
            except WaitTimeout:
                if time.monotonic() >= deadline - 0.01:
                    raise

    def status(self) -> Status:
        return self._send(self._ops.status())

    def get_turn(self, event_id: str, *, conversation_id: str | None = None, tenant_id: str | None = None) -> StoredTurn:
        return self._send(self._ops.turn(event_id, conversation_id, tenant_id))

    def turn_history(self, event_id: str, *, conversation_id: str | None = None, tenant_id: str | None = None) -> TurnHistory:
        return self._send(self._ops.turn_history(event_id, conversation_id, tenant_id))

    def list_turns(self, *, conversation_id: str | None = None, session_id: str | None = None, agent_id: str | None = None,
                   cursor: str | None = None, limit: int = 100, include_superseded: bool = False, tenant_id: str | None = None) -> TurnPage:
        """One page of a boundary's turns in conversation order; pass `next_cursor` for the next."""
        return self._send(self._ops.turns(conversation_id=conversation_id, session_id=session_id, agent_id=agent_id, cursor=cursor,
                                          limit=limit, include_superseded=include_superseded or None, tenant_id=tenant_id))

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

    def __init__(self, url: str | None = None, api_key: str | None = None, *, tenant_id: str | None = None, timeout: float = 30.0,
                 retry: RetryPolicy | None = None, headers: dict[str, str] | None = None, transport: httpx.AsyncBaseTransport | None = None):
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

    async def _send(self, call: Call) -> Any:
        policy = self._settings.retry
        for attempt in range(policy.attempts):
            last = attempt == policy.attempts - 1
            try:
                response = await self._http.request(call.method, call.path, **request_kwargs(call))
            except httpx.TransportError as exc:
                if last:
                    raise transport_error(exc, self.url) from exc
                await asyncio.sleep(policy.delay(attempt, None))
                continue
            if response.status_code in policy.statuses and not last:
                await asyncio.sleep(policy.delay(attempt, retry_after(response)))
                continue
            return outcome(call, response)
        raise AssertionError("unreachable")

    async def add(self, turns: Any) -> AddResult:
        return await self._send(self._ops.add(turns))

    def batch(self, max_size: int = 500, max_delay: float = 1.0) -> "AsyncBatch":
        from memstream_client.batch import AsyncBatch

        return AsyncBatch(self, max_size, max_delay)

    async def search(self, question: str, *, conversation_id: str | None = None, session_id: str | None = None,
                     agent_id: str | None = None, since: datetime | None = None, until: datetime | None = None,
                     as_of: datetime | None = None, strategy: str | None = None, k: int | None = None, max_turns: int | None = None,
                     tenant_id: str | None = None) -> SearchResult:
        return await self._send(self._ops.search(question, **_search_options(conversation_id, session_id, agent_id, since, until, as_of,
                                                                                strategy, k, max_turns, tenant_id)))

    async def answer(self, question: str, *, conversation_id: str | None = None, session_id: str | None = None,
                     agent_id: str | None = None, since: datetime | None = None, until: datetime | None = None,
                     as_of: datetime | None = None, strategy: str | None = None, k: int | None = None, max_turns: int | None = None,
                     tenant_id: str | None = None) -> AnswerResult:
        return await self._send(self._ops.answer(question, **_search_options(conversation_id, session_id, agent_id, since, until, as_of,
                                                                                strategy, k, max_turns, tenant_id)))

    async def forget(self, *, conversation_id: str | None = None, session_id: str | None = None, event_id: str | None = None,
                     agent_id: str | None = None, occurred_before: datetime | None = None, reason: str | None = None,
                     tenant_id: str | None = None) -> ForgetResult:
        return await self._send(self._ops.forget(**_forget_scope(conversation_id, session_id, event_id, agent_id, occurred_before, reason,
                                                                 tenant_id)))

    async def wait(self, positions: Positions, timeout: float = 30.0) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            chunk = min(MAX_WAIT, max(0.0, deadline - time.monotonic()))
            try:
                return await self._send(self._ops.wait(positions, chunk))
            except WaitTimeout:
                if time.monotonic() >= deadline - 0.01:
                    raise

    async def status(self) -> Status:
        return await self._send(self._ops.status())

    async def get_turn(self, event_id: str, *, conversation_id: str | None = None, tenant_id: str | None = None) -> StoredTurn:
        return await self._send(self._ops.turn(event_id, conversation_id, tenant_id))

    async def turn_history(self, event_id: str, *, conversation_id: str | None = None, tenant_id: str | None = None) -> TurnHistory:
        return await self._send(self._ops.turn_history(event_id, conversation_id, tenant_id))

    async def list_turns(self, *, conversation_id: str | None = None, session_id: str | None = None, agent_id: str | None = None,
                         cursor: str | None = None, limit: int = 100, include_superseded: bool = False,
                         tenant_id: str | None = None) -> TurnPage:
        return await self._send(self._ops.turns(conversation_id=conversation_id, session_id=session_id, agent_id=agent_id, cursor=cursor,
                                                limit=limit, include_superseded=include_superseded or None, tenant_id=tenant_id))

    async def iter_turns(self, **query: Any) -> AsyncIterator[StoredTurn]:
        cursor = None
        while True:
            page = await self.list_turns(**query, cursor=cursor)
            for turn in page.turns:
                yield turn
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    async def export(self, *, conversation_id: str | None = None, tenant_id: str | None = None) -> AsyncIterator[dict[str, Any]]:
        import json

        call = self._ops.export(conversation_id, tenant_id)
        async with self._http.stream("GET", call.path, params=call.params) as response:
            if response.status_code != 200:
                await response.aread()
                outcome(Call("GET", call.path, ok=()), response)
            async for line in response.aiter_lines():
                if line.strip():
                    yield json.loads(line)

