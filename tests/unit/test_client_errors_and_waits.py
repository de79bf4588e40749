"""The Python client without a server (httpx's MockTransport in its place): what `str()` of an
error says, input refused before sending as a MemstreamError, and how `wait` spends its time —
its HTTP read outlasts the wait, long waits are several requests, and a wait that ran out is
never retried. The same waits against a live server are in tests/e2e/test_clients.py."""

from __future__ import annotations

import asyncio
import json
import time
import tomllib
from pathlib import Path

import httpx
import pytest

import memstream_client
from memstream_client import (AsyncClient, BadRequest, Client, InvalidRequest, MemstreamError, RetryPolicy,
                              TransportError, Unavailable, WaitTimeout)
from memstream_client import _http
from memstream_client.errors import from_response

pytestmark = pytest.mark.unit
FAST_RETRY = RetryPolicy(attempts=5, base_delay=0.01, max_delay=0.05)


def _error(status: int, message: str, details: list) -> dict:
    return {"error": {"code": "invalid_request", "message": message, "details": details, "request_id": "r1"}}


# -- errors ----------------------------------------------------------------------------------------
def test_a_422_names_the_fields_it_blames():
    exc = from_response(422, _error(422, "the request does not match the API schema", [
        {"loc": ["body", "max_turns"], "msg": "Input should be less than or equal to 500", "type": "less_than_equal"},
        {"loc": ["body", "turns", 2, "text"], "msg": "Field required", "type": "missing"}]))
    assert isinstance(exc, BadRequest) and exc.status == 422
    assert str(exc) == ("the request does not match the API schema: body.max_turns: Input should be less than or equal "
                        "to 500; body.turns[2].text: Field required [422 invalid_request] (request id r1)")
    assert exc.message == "the request does not match the API schema"  # the details stay structured, for programs


def test_a_refused_publish_names_each_item_and_the_message_stays_bounded():
    items = [{"index": i, "status": "rejected", "code": 422, "errors": [{"loc": ["text"], "msg": "x" * 300}]}
             for i in range(40)]
    exc = from_response(422, _error(422, "none of the 40 event(s) was accepted; nothing was appended", items))
    text = str(exc)
    assert text.startswith("none of the 40 event(s) was accepted; nothing was appended: item 0: text: xxx")
    assert len(text) < 600 and "[422 invalid_request]" in text
    seven = [{"index": i, "status": "rejected", "code": 422, "errors": [{"loc": ["text"], "msg": "too long"}]}
             for i in range(7)]
    few = str(from_response(422, _error(422, "none accepted", seven)))
    assert few.startswith("none accepted: item 0: text: too long; item 1: text: too long;") and "(and 2 more)" in few


def test_a_body_from_something_in_between_is_still_an_error_with_its_status():
    exc = from_response(502, "<html>Bad Gateway</html>")
    assert type(exc) is MemstreamError and str(exc) == "HTTP 502: <html>Bad Gateway</html> [502 None]"


def _client(handler, **kw) -> Client:
    return Client("http://memstream.test", "k", transport=httpx.MockTransport(handler), retry=FAST_RETRY, **kw)


def _never_called(request: httpx.Request) -> httpx.Response:
    raise AssertionError(f"nothing should be sent, but {request.method} {request.url.path} was")


@pytest.mark.parametrize("turns, blamed", [
    ([{"conversation_id": "c", "speaker": "Ada", "text": "hi", "speakr": "Bo"}],
     "turns[0].speakr: Extra inputs are not"),
    ([{"conversation_id": "c", "speaker": "Ada", "text": "ok"}, {"conversation_id": "c", "text": 7}],
     "turns[1].text: Input should be a valid string"),
    ([{"conversation_id": "c", "speaker": "Ada", "text": "hi", "role": "robot"}], "turns[0].role: Input should be"),
])
def test_a_turn_the_client_refuses_is_an_invalid_request_naming_the_key_and_nothing_is_sent(turns, blamed):
    with _client(_never_called) as ms, pytest.raises(InvalidRequest) as refused:
        ms.add(turns)
    assert blamed in str(refused.value) and refused.value.status is None
    assert isinstance(refused.value, BadRequest) and isinstance(refused.value, ValueError)


@pytest.mark.parametrize("call", [
    lambda ms: ms.add([42]), lambda ms: ms.add("just a string"), lambda ms: ms.wait(["0", "12"]),
    lambda ms: ms.wait({"zero": 12}), lambda ms: ms.batch(max_size=0),
])
def test_other_input_errors_before_sending_are_memstream_errors_too(call):
    with _client(_never_called) as ms, pytest.raises(InvalidRequest):
        call(ms)


# -- waits -----------------------------------------------------------------------------------------
class WaitServer:
    """POST /v1/wait as the server does it: wait `timeout_seconds`, then `caught_up: false` — or `caught_up` at
    the `ready_after`-th request, or the statuses of `answers` first. Records what each request
    asked for and the read timeout it was sent with."""

    def __init__(self, ready_after: int | None = None, answers: tuple[int, ...] = ()):
        self.ready_after, self.answers = ready_after, list(answers)
        self.asked: list[float] = []
        self.read_timeouts: list[float] = []

    def _answer(self, request: httpx.Request) -> tuple[float, httpx.Response]:
        assert request.url.path == "/v1/wait"
        seconds = json.loads(request.content)["timeout_seconds"]
        self.asked.append(seconds)
        self.read_timeouts.append(request.extensions["timeout"]["read"])
        if self.answers:
            return 0.0, httpx.Response(self.answers.pop(0), headers={"Retry-After": "0.05"},
                                       json={"error": {"code": "unavailable", "message": "later"}})
        if self.ready_after is not None and len(self.asked) >= self.ready_after:
            return 0.0, httpx.Response(200, json={"caught_up": True})
        return seconds, httpx.Response(200, json={"caught_up": False, "reason": f"not within {seconds}s"})

    def __call__(self, request: httpx.Request) -> httpx.Response:
        pause, response = self._answer(request)
        time.sleep(pause)
        return response

    async def handle_async(self, request: httpx.Request) -> httpx.Response:
        pause, response = self._answer(request)
        await asyncio.sleep(pause)
        return response


@pytest.mark.parametrize("timeout", [0.2, httpx.Timeout(0.2, connect=1.0)])
def test_a_waits_request_reads_for_the_wait_plus_a_margin_whatever_the_clients_timeout(timeout):
    server = WaitServer()
    with _client(server, timeout=timeout) as ms, pytest.raises(WaitTimeout):
        ms.wait({0: 10}, timeout=0.6)
    assert server.asked == [pytest.approx(0.6, abs=0.05)]  # one request: the wait that ran out is not retried
    assert server.read_timeouts[0] >= 0.6 + _http.WAIT_MARGIN - 0.05

    def status(request: httpx.Request) -> httpx.Response:
        server.read_timeouts.append(request.extensions["timeout"]["read"])
        return httpx.Response(200, json={"views": []})

    with _client(status, timeout=timeout) as ms:
        ms.status()
    assert server.read_timeouts[-1] == 0.2  # every other request keeps the client's timeout


def test_a_long_wait_is_several_requests_and_ends_on_time(monkeypatch):
    monkeypatch.setattr(_http, "MAX_WAIT", 0.3)
    server = WaitServer()
    t0 = time.monotonic()
    with _client(server) as ms, pytest.raises(WaitTimeout):
        ms.wait({0: 10}, timeout=0.8)
    assert 0.75 <= time.monotonic() - t0 < 1.3
    assert server.asked[:2] == [0.3, 0.3] and sum(server.asked) == pytest.approx(0.8, abs=0.06)
    ready = WaitServer(ready_after=2)
    with _client(ready) as ms:
        assert ms.wait({0: 10}, timeout=5) is True
    assert ready.asked == [0.3, 0.3]


def test_a_wait_retries_within_its_time_asking_for_the_time_left_and_never_after_it():
    server = WaitServer(ready_after=3, answers=(503, 503))
    with _client(server) as ms:
        assert ms.wait({0: 10}, timeout=3) is True
    assert len(server.asked) == 3 and server.asked[0] > server.asked[1] > server.asked[2]  # each asks what is left

    def unavailable_once_the_time_is_up(request: httpx.Request) -> httpx.Response:
        time.sleep(json.loads(request.content)["timeout_seconds"])
        calls.append(request)
        return httpx.Response(503, headers={"Retry-After": "0"},
                              json={"error": {"code": "unavailable", "message": "x"}})

    calls: list = []
    with _client(unavailable_once_the_time_is_up) as ms, pytest.raises(Unavailable):
        ms.wait({0: 10}, timeout=0.3)
    assert len(calls) == 1

    def no_answer(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        time.sleep(json.loads(request.content)["timeout_seconds"])
        raise httpx.ReadTimeout("no answer", request=request)

    calls.clear()
    with _client(no_answer) as ms, pytest.raises(TransportError):
        ms.wait({0: 10}, timeout=0.3)
    assert len(calls) == 1


def test_a_gateway_answering_504_early_is_not_looped_on():
    calls: list = []

    def early(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        return httpx.Response(504, text="Gateway Timeout")

    with _client(early) as ms, pytest.raises(WaitTimeout):
        ms.wait({0: 10}, timeout=2)
    assert len(calls) == 1


def test_the_async_client_waits_the_same_way(monkeypatch):
    monkeypatch.setattr(_http, "MAX_WAIT", 0.3)

    async def run(server: WaitServer, timeout: float):
        transport = httpx.MockTransport(server.handle_async)
        async with AsyncClient("http://memstream.test", "k", transport=transport, retry=FAST_RETRY, timeout=0.1) as ms:
            return await ms.wait({0: 10}, timeout=timeout)

    server = WaitServer()
    t0 = time.monotonic()
    with pytest.raises(WaitTimeout):
        asyncio.run(run(server, 0.8))
    assert 0.75 <= time.monotonic() - t0 < 1.3 and server.asked[:2] == [0.3, 0.3]
    assert min(server.read_timeouts) >= _http.WAIT_MARGIN
    assert asyncio.run(run(WaitServer(ready_after=3, answers=(503,)), 3)) is True


# -- the version -----------------------------------------------------------------------------------
def test_the_version_is_one_number_in_pyproject_the_package_and_the_user_agent():
    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "clients/python/pyproject.toml").read_text())
    seen: list[str] = []

    def status(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers["user-agent"])
        return httpx.Response(200, json={"views": []})

    with _client(status) as ms:
        ms.status()
    assert pyproject["project"]["version"] == memstream_client.__version__ == "0.2.0"
    assert seen == [f"memstream-client/{memstream_client.__version__}"]
