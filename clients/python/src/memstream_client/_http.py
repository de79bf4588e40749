"""What both clients share: the request of each operation (a `Call`, built without I/O), the
retry policy, and turning responses into results or errors. `Client` and `AsyncClient` only send.

Retries. 429 and 503 (the server says: later) and transport failures (refused, reset, timed
out) are retried with exponential back-off and full jitter, never sooner than a `Retry-After`
the server sent. Every operation is safe to repeat: a publish carries its event ids (the views
keep one turn per id: a repeat is a duplicate they drop), a forget repeated forgets nothing more,
reads change nothing. (An `answer` repeated may call the reader model twice.)

Waits. A wait's HTTP read timeout is its own time plus `WAIT_MARGIN`, so the server's answer (the
views did not get there in time) arrives as `WaitTimeout` instead of a read timeout; a wait is
retried only while its own time lasts (`retry_delay`'s deadline), never after it ran out.
"""

from __future__ import annotations

import os
import random
import time
from collections import abc
from dataclasses import dataclass, field
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from typing import Any, Callable, Iterable

import httpx
from pydantic import ValidationError

from memstream_client import errors
from memstream_client._version import __version__
from memstream_client.models import Positions, Turn

DEFAULT_URL = "http://127.0.0.1:8080"
USER_AGENT = f"memstream-client/{__version__}"
MAX_WAIT = 300.0  # the API's longest single wait (POST /v1/wait's timeout_seconds)
WAIT_MARGIN = 10.0  # what a wait's HTTP read may take beyond the wait: the server answering, a proxy in between


@dataclass(frozen=True)
class RetryPolicy:
    """`attempts` in all (1: no retry); the n-th retry waits a random time up to
    min(max_delay, base_delay * 2**n), or the server's Retry-After if that is longer."""

    attempts: int = 5
    base_delay: float = 0.2
    max_delay: float = 10.0
    statuses: tuple[int, ...] = (429, 503)

    def delay(self, retry: int, retry_after: float | None, rng: random.Random = random.Random()) -> float:
        jitter = rng.uniform(0, min(self.max_delay, self.base_delay * (2 ** retry)))
        return max(jitter, min(retry_after, 300.0)) if retry_after is not None else jitter


def retry_delay(policy: RetryPolicy, attempt: int, response: httpx.Response | None,
                deadline: float | None) -> float | None:
    """Seconds to sleep before the next attempt, or None: do not retry. `response` is None for a
    transport failure; `deadline` (time.monotonic) is when the operation's own time runs out —
    a retry that would start after it is not made."""
    if attempt >= policy.attempts - 1:
        return None
    if response is not None and response.status_code not in policy.statuses:
        return None
    delay = policy.delay(attempt, retry_after(response) if response is not None else None)
    if deadline is not None and time.monotonic() + delay >= deadline:
        return None
    return delay


def retry_after(response: httpx.Response) -> float | None:
    """Seconds from a Retry-After header (a number or an HTTP date)."""
    value = response.headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        try:
            return max(0.0, (parsedate_to_datetime(value) - datetime.now(timezone.utc)).total_seconds())
        except (TypeError, ValueError):
            return None


@dataclass
class Call:
    method: str
    path: str
    parse: Callable[[Any], Any] = lambda body: body
    json: Any = None
    params: dict[str, Any] | None = None
    ok: tuple[int, ...] = (200,)
    read_timeout: float | None = None  # at least this long for the answer (a wait's time plus WAIT_MARGIN)


def _positions(raw: dict) -> Positions:
    return {int(p): int(o) for p, o in raw.items()}


def merge_positions(*many: Positions) -> Positions:
    """The furthest offset per partition: waiting on it covers every publish merged."""
    out: Positions = {}
    for positions in many:
        for p, o in positions.items():
            out[int(p)] = max(out.get(int(p), 0), int(o))
    return out


def as_events(items: Any) -> list[dict[str, Any]]:
    """Turns (models or dicts without a `type`) and events (dicts with one) as API events; an
    item that is neither, or a turn dict `Turn` refuses, raises InvalidRequest naming it."""
    if isinstance(items, (Turn, dict)):
        items = [items]
    if isinstance(items, (str, bytes)) or not isinstance(items, abc.Iterable):
        raise errors.InvalidRequest(f"add() takes a turn or a list of turns, not {type(items).__name__}")
    out = []
    for i, item in enumerate(items):
        if isinstance(item, Turn):
            out.append(item.event())
        elif isinstance(item, dict) and "type" in item:
            out.append(dict(item))
        elif isinstance(item, dict):
            try:
                out.append(Turn(**item).event())
            except ValidationError as exc:
                details = [{"loc": ["turns", i, *e["loc"]], "msg": e["msg"], "type": e["type"]} for e in exc.errors()]
                raise errors.InvalidRequest(f"turn {i} is not a valid memstream_client.Turn", details=details) from None
        else:
            raise errors.InvalidRequest(f"add() takes turns (memstream_client.Turn or dicts) or event dicts; "
                                        f"item {i} is a {type(item).__name__}")
    return out


def _clean(params: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in params.items():
        if v is None:
            continue
        out[k] = v.isoformat() if isinstance(v, datetime) else v
    return out


@dataclass
class Operations:
    """The API's operations as `Call`s (no I/O)."""

    tenant_id: str | None = None

    def _tenant(self, tenant_id: str | None) -> dict[str, Any]:
        tenant = tenant_id or self.tenant_id
        return {"tenant_id": tenant} if tenant else {}

    def add(self, items: Any) -> Call:
        from memstream_client.models import AddResult

        events = as_events(items)
        if self.tenant_id:
            events = [{"tenant_id": self.tenant_id, **e} for e in events]
        return Call("POST", "/v1/events", AddResult.model_validate, json=events, ok=(200, 207))

    def search(self, question: str, **options: Any) -> Call:
        from memstream_client.models import SearchResult

        return Call("POST", "/v1/search", SearchResult.model_validate,
                    json={"question": question, **_clean(options), **self._tenant(options.get("tenant_id"))})

    def answer(self, question: str, **options: Any) -> Call:
        from memstream_client.models import AnswerResult

        return Call("POST", "/v1/answer", AnswerResult.model_validate,
                    json={"question": question, **_clean(options), **self._tenant(options.get("tenant_id"))})

    def forget(self, **scope: Any) -> Call:
        from memstream_client.models import ForgetResult

        return Call("POST", "/v1/forget", ForgetResult.model_validate,
                    json={**_clean(scope), **self._tenant(scope.get("tenant_id"))}, ok=(202,))

    def wait(self, positions: Positions, seconds: float) -> Call:
        """One POST /v1/wait of at most MAX_WAIT seconds; its HTTP read outlasts it by WAIT_MARGIN."""
        seconds = round(min(MAX_WAIT, max(0.0, seconds)), 3)
        return Call("POST", "/v1/wait", _caught_up, json={"positions": wanted(positions), "timeout_seconds": seconds},
                    read_timeout=seconds + WAIT_MARGIN)

    def status(self) -> Call:
        from memstream_client.models import Status

        return Call("GET", "/v1/status", Status.model_validate)

    def turn(self, event_id: str, conversation_id: str | None, tenant_id: str | None) -> Call:
        from memstream_client.models import StoredTurn

        return Call("GET", f"/v1/turns/{_segment(event_id)}", StoredTurn.model_validate,
                    params=_clean({"conversation_id": conversation_id, **self._tenant(tenant_id)}))

    def turn_history(self, event_id: str, conversation_id: str | None, tenant_id: str | None) -> Call:
        from memstream_client.models import TurnHistory

        return Call("GET", f"/v1/turns/{_segment(event_id)}/history", TurnHistory.model_validate,
                    params=_clean({"conversation_id": conversation_id, **self._tenant(tenant_id)}))

    def turns(self, **query: Any) -> Call:
        from memstream_client.models import TurnPage

        return Call("GET", "/v1/turns", TurnPage.model_validate,
                    params=_clean({**query, **self._tenant(query.get("tenant_id"))}))

    def export(self, conversation_id: str | None, tenant_id: str | None) -> Call:
        return Call("GET", "/v1/export", params=_clean({"conversation_id": conversation_id, **self._tenant(tenant_id)}))


def wanted(positions: Any) -> dict[str, int]:
    """`positions` as POST /v1/wait takes them, or InvalidRequest."""
    try:
        return {str(int(p)): int(o) for p, o in positions.items()}
    except (AttributeError, TypeError, ValueError):
        raise errors.InvalidRequest("wait() takes positions: partition -> offset (an add or forget result's positions)",
                                    details=[{"loc": ["positions"], "msg": f"not a mapping of ints: {positions!r:.80}",
                                              "type": "value_error"}]) from None


def _caught_up(body: Any) -> bool:
    if isinstance(body, dict) and body.get("caught_up") is True:
        return True
    reason = body.get("reason") if isinstance(body, dict) else None
    raise errors.WaitTimeout(str(reason or f"the views are not caught up: {str(body)[:200]}"), status=200, code="timeout",
                             body=body)


def _segment(value: str) -> str:
    from urllib.parse import quote

    return quote(str(value), safe="")


@dataclass
class Settings:
    """Where the server is and how to reach it; `api_key` and `url` default to the environment
    (MEMSTREAM_API_KEY, MEMSTREAM_URL)."""

    url: str | None = None
    api_key: str | None = None
    timeout: float | httpx.Timeout | None = 30.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    headers: dict[str, str] = field(default_factory=dict)

    def resolved(self) -> tuple[str, dict[str, str]]:
        url = (self.url or os.environ.get("MEMSTREAM_URL") or DEFAULT_URL).rstrip("/")
        key = self.api_key if self.api_key is not None else os.environ.get("MEMSTREAM_API_KEY")
        headers = {"User-Agent": USER_AGENT, "Accept": "application/json", **self.headers}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        return url, headers


def body_of(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return response.text


def outcome(call: Call, response: httpx.Response) -> Any:
    """The result of a response that is not to be retried, or the error to raise."""
    body = body_of(response)
    if response.status_code in call.ok:
        return call.parse(body)
    raise errors.from_response(response.status_code, body, retry_after(response))


def transport_error(exc: Exception, url: str) -> errors.TransportError:
    return errors.TransportError(f"could not reach memstream at {url}: {type(exc).__name__}: {exc}")


def request_kwargs(call: Call, timeout: float | httpx.Timeout | None) -> dict[str, Any]:
    """httpx's arguments for `call` on a client whose timeout is `timeout` (seconds or httpx's)."""
    kwargs: dict[str, Any] = {}
    if call.json is not None:
        kwargs["json"] = call.json
    if call.params:
        kwargs["params"] = call.params
    if call.read_timeout is not None and timeout is not None:
        base = timeout if isinstance(timeout, httpx.Timeout) else httpx.Timeout(timeout)
        if base.read is not None and call.read_timeout > base.read:
            kwargs["timeout"] = httpx.Timeout(connect=base.connect, read=call.read_timeout, write=base.write,
                                              pool=base.pool)
    return kwargs


def events_of(lines: Iterable[str]) -> Iterable[dict[str, Any]]:
    import json

    for line in lines:
        if line.strip():
            yield json.loads(line)


def positions_of(raw: dict) -> Positions:
    return _positions(raw)
