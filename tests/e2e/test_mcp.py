"""`memstream mcp` against a real `memstream serve`, through the MCP SDK's own client (`ClientSession`) over stdio
and streamable HTTP: the tools' round trip, closed arguments and errors that name the field and rule, the key
refused at the transport (HTTP 401 with `WWW-Authenticate: Bearer`) or at start (stdio), and the size of the text a
model reads from search_memory on LoCoMo dev questions."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Iterator

import pytest

from tests.e2e.conftest import OTHER
from tests.e2e.fast_processes import FAST
from tests.integration import servers

pytestmark = pytest.mark.e2e
BIN = Path(sys.executable).with_name("memstream")
BAD_KEY = "msk_0000000000000000_" + "y" * 43
ROLES = {"primary", "bridge", "neighbour", "fill"}
PYDANTIC_URL = "errors.pydantic.dev"


def _stdio(url: str, key: str | None):
    from mcp import StdioServerParameters

    env = {k: v for k, v in os.environ.items() if k != "MEMSTREAM_API_KEY"}
    return StdioServerParameters(command=str(BIN), args=["mcp", "--transport", "stdio", "--url", url],
                                 env={**env, "MEMSTREAM_API_KEY": key} if key is not None else env)


def _error(result) -> dict:
    """A tool error's `{"error": …}` (its text is the SDK's `Error executing tool <name>: ` and the API's shape)."""
    assert result.is_error, result.content
    text = result.content[0].text
    assert PYDANTIC_URL not in text, text
    return json.loads(text.split(": ", 1)[1])["error"]


@contextmanager
def _mcp_over_http(url: str, log: Path) -> Iterator[str]:
    """`memstream mcp --transport http` on a free loopback port (no key in its environment): its endpoint."""
    [port] = servers.free_ports(1)
    env = {k: v for k, v in os.environ.items() if k != "MEMSTREAM_API_KEY"}
    with open(log, "w") as out:
        proc = subprocess.Popen([str(BIN), "mcp", "--transport", "http", "--port", str(port), "--url", url], env=env,
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)
        yield f"http://127.0.0.1:{port}/mcp"
        assert proc.poll() is None, "the MCP server died"
    finally:
        proc.terminate()
        proc.wait(30)


# -- the round trip, over both transports -----------------------------------------------------------
async def _round_trip(session) -> None:
    """Initialize (the server names its version), list tools, add, wait, search and find (with score and role), the
    text as a model reads it, forget, search and not find; refusals as tool errors in the API's shape."""
    init = await session.initialize()
    assert init.server_info.name == "memstream" and init.server_info.version == metadata.version("memstream")
    tools = {t.name: t for t in (await session.list_tools()).tools}
    assert set(tools) == {"add_memory", "search_memory", "answer_question", "forget_memory", "memory_status",
                          "wait_for_memory"}
    search = tools["search_memory"].input_schema
    assert search["required"] == ["question"] and search["properties"]["max_turns"]["default"] == 25
    assert "k" not in search["properties"]
    assert tools["answer_question"].input_schema["properties"]["max_turns"]["default"] == 25
    assert {"score", "role"} <= set(tools["search_memory"].output_schema["$defs"]["EvidenceItem"]["properties"])
    conversation = f"mcp-{os.getpid()}-{time.monotonic_ns()}"
    added = await session.call_tool("add_memory", {"conversation_id": conversation, "wait_seconds": 120, "turns": [
        {"speaker": "Ada", "text": "The spare key is under the blue flowerpot by the back door."},
        {"speaker": "Bo", "text": "Thanks, I will water the tomatoes too."}]})
    assert not added.is_error, added.content
    assert added.structured_content["accepted"] == 2 and added.structured_content["ready"] is True
    found = await session.call_tool("search_memory", {"question": "Where is the spare key?",
                                                      "conversation_id": conversation})
    assert not found.is_error, found.content
    evidence = found.structured_content["evidence"]
    assert evidence and all(e["role"] in ROLES and isinstance(e["score"], float) for e in evidence)
    assert evidence[0]["role"] == "primary"
    turns = [t for e in evidence for t in e["turns"]]
    key_turn = [t for t in turns if "flowerpot" in t["text"]]
    assert key_turn and {"event_id", "partition", "offset", "session_date", "speaker"} <= set(key_turn[0])
    assert key_turn[0]["speaker"] == "Ada"
    text = found.content[0].text  # one line per turn under its unit's header; the ids stay in the structured content
    date = key_turn[0]["session_date"][:10]
    assert f"[{date}] Ada: The spare key is under the blue flowerpot by the back door." in text
    assert text.startswith(f"#1 {evidence[0]['role']} ") and key_turn[0]["event_id"] not in text
    status = await session.call_tool("memory_status", {})
    assert not status.is_error
    assert {v["view"] for v in status.structured_content["views"]} == {"hierarchy", "lexical", "dense", "graph"}
    answer = await session.call_tool("answer_question", {"question": "Where is the spare key?"})
    assert "no reader is configured" in _error(answer)["message"]
    forgot = await session.call_tool("forget_memory", {"conversation_id": conversation, "wait_seconds": 120})
    assert not forgot.is_error and forgot.structured_content["complete"] is True
    again = await session.call_tool("search_memory", {"question": "Where is the spare key?",
                                                      "conversation_id": conversation})
    assert not again.is_error
    assert not [t for e in again.structured_content["evidence"] for t in e["turns"] if "flowerpot" in t["text"]]
    # refusals come back as tool errors, and the server lives on
    other = await session.call_tool("search_memory", {"question": "anything", "tenant_id": OTHER})
    assert _error(other)["status"] == 403
    empty = await session.call_tool("add_memory", {"conversation_id": conversation, "turns": []})
    assert _error(empty)["status"] == 422
    assert not (await session.call_tool("memory_status", {})).is_error


def test_the_mcp_server_over_stdio(served):
    from mcp import ClientSession
    from mcp.client.stdio import stdio_client

    async def run():
        async with stdio_client(_stdio(served.url, served.keys["writer"])) as (read, write), \
                ClientSession(read, write) as session:
            await _round_trip(session)

    asyncio.run(run())


def test_over_stdio_a_missing_or_refused_key_stops_the_server_at_start_saying_why(served):
    for key, why in ((None, "needs MEMSTREAM_API_KEY"), (BAD_KEY, "does not accept MEMSTREAM_API_KEY (401")):
        params = _stdio(served.url, key)
        out = subprocess.run([params.command, *params.args], env=params.env, stdin=subprocess.DEVNULL,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 2 and why in out.stderr and served.url in out.stderr, out.stderr
        assert BAD_KEY not in out.stderr + out.stdout and not out.stdout  # stdout is the protocol's channel


def test_the_mcp_server_over_streamable_http(served, tmp_path):
    import httpx
    import httpx2
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client
    from mcp.types import LATEST_PROTOCOL_VERSION

    log = tmp_path / "mcp.log"
    with _mcp_over_http(served.url, log) as endpoint:
        headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
        initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": LATEST_PROTOCOL_VERSION, "capabilities": {},
            "clientInfo": {"name": "test", "version": "0"}}}
        list_tools = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}

        def refused(body: dict, **extra: str) -> httpx.Response:
            r = httpx.post(endpoint, json=body, headers={**headers, **extra})
            assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer "), (r.status_code, r.text)
            assert r.json()["error"]["code"] == "unauthorized"
            return r

        # a page of another origin may not call it (DNS rebinding / cross-site), key or not; a loopback one may
        assert httpx.post(endpoint, json=initialize, headers={**headers, "Origin": "http://evil.example"}
                          ).status_code == 403
        assert httpx.post(endpoint, json=initialize, headers={**headers, "Host": "evil.example"}).status_code == 421
        # no key, a bad key, another scheme: refused before MCP sees the request
        refused(initialize)
        refused(list_tools)
        refused(initialize, Authorization="Basic " + served.keys["writer"])
        bad = refused(initialize, Authorization=f"Bearer {BAD_KEY}")
        assert 'error="invalid_token"' in bad.headers["www-authenticate"]
        refused(list_tools, Authorization=f"Bearer {BAD_KEY}")

        def session_for(key: str):
            return httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=180)

        async def run():
            async with session_for(served.keys["writer"]) as http, \
                    streamable_http_client(endpoint, http_client=http) as (read, write), \
                    ClientSession(read, write) as session:
                await _round_trip(session)

        asyncio.run(run())
        refused(list_tools, Authorization=f"Bearer {BAD_KEY}")  # a good key trusted does not open the door to others
    assert served.keys["writer"] not in log.read_text() and BAD_KEY not in log.read_text()


# -- arguments --------------------------------------------------------------------------------------
def test_tool_arguments_are_closed_and_an_error_names_the_field_and_the_rule(served):
    from mcp import ClientSession
    from mcp.client.stdio import stdio_client

    async def run():
        async with stdio_client(_stdio(served.url, served.keys["writer"])) as (read, write), \
                ClientSession(read, write) as session:
            await session.initialize()
            tools = (await session.list_tools()).tools
            assert all(t.input_schema["additionalProperties"] is False for t in tools)
            add = next(t for t in tools if t.name == "add_memory").input_schema
            assert add["$defs"]["TurnIn"]["additionalProperties"] is False
            # a misspelt argument is refused, not ignored (it used to search the whole tenant)
            typo = _error(await session.call_tool("search_memory", {"question": "Who?", "conversationId": "c1"}))
            assert typo["status"] == 422 and typo["details"][0]["loc"] == ["conversationId"]
            assert "conversationId: unknown argument (accepted: question, conversation_id," in typo["message"]
            nested = _error(await session.call_tool("add_memory", {"conversation_id": "c1", "turns": [
                {"speaker": "Ada", "text": "hi", "speakr": "Ada"}]}))
            assert "turns.0.speakr: unknown argument (accepted: speaker, text," in nested["message"]
            # each field and its rule, without pydantic's URLs or the rejected values
            bad = _error(await session.call_tool("search_memory", {"question": "", "max_turns": 10_000}))
            assert {tuple(d["loc"]) for d in bad["details"]} == {("question",), ("max_turns",)}
            assert "question: String should have at least 1 character" in bad["message"]
            assert "max_turns: Input should be less than or equal to 200" in bad["message"]
            assert "10000" not in json.dumps(bad)
            # a turn is forgotten within its conversation: said before the API is asked
            forget = _error(await session.call_tool("forget_memory", {"event_id": "some-turn"}))
            assert forget["details"] == [{"loc": ["conversation_id"], "type": "missing", "msg": (
                "required with event_id (a turn is forgotten within its conversation)")}]
            assert "agent_id: name the agent alone" in _error(await session.call_tool(
                "forget_memory", {"agent_id": "bot", "conversation_id": "c1"}))["message"]

    asyncio.run(run())


# -- what a model reads -----------------------------------------------------------------------------
def test_the_text_a_model_reads_is_the_evidence_and_little_more(locomo, tmp_path):
    """Measured on the LoCoMo dev split's conv-26 (419 turns): its 150 questions as the eval counts them (categories
    1–4 with parseable evidence), each asked through search_memory at max_turns 10. Summed over the questions, the
    text content is at most the evidence turns' own text plus 48 characters per turn (the date, the speaker and the
    unit's `#rank role score`); each turn is in it as `[date] speaker: text`. The server runs the declared fast model
    path (hashing encoder, lexicon NER: infra/models/fast.py) so the conversation is ingested in seconds: the models
    choose which turns are evidence, not how they are written."""
    from mcp import ClientSession
    from mcp.client.stdio import stdio_client

    from memstream_client import AsyncClient
    from services.eval.locomo import questions
    from streams.sources import locomo as source

    samples = [s for s in source.load(locomo) if s["sample_id"] == "conv-26"]
    asked = [q.question for q in questions(samples, {"conv-26"})]
    assert len(asked) == 150
    tenant = "mcp-text"
    with servers.memstream_serve(tmp_path, env=FAST) as s:
        key = s.admin_key["key"]  # made before the server started, so known at once; it names the tenant

        async def run() -> tuple[int, int, int]:
            async with AsyncClient(s.url, key, timeout=120) as client:
                added = await client.add([e.model_dump(mode="json") for e in source.events(samples, tenant)])
                assert added.accepted == 419 and await client.wait(added.positions, 120)
            text = turn_text = turns = 0
            async with stdio_client(_stdio(s.url, key)) as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                for question in asked:
                    r = await session.call_tool("search_memory", {"question": question, "conversation_id": "conv-26",
                                                                  "max_turns": 10, "tenant_id": tenant})
                    assert not r.is_error, r.content
                    evidence = r.structured_content["evidence"]
                    assert all(e["role"] in ROLES and isinstance(e["score"], float) for e in evidence)
                    distinct = {t["event_id"]: t for e in evidence for t in e["turns"]}
                    [content] = r.content
                    for t in distinct.values():
                        assert f"[{t['session_date'][:10]}] {t['speaker']}: {t['text']}" in content.text
                    text += len(content.text)
                    turn_text += sum(len(t["text"]) for t in distinct.values())
                    turns += len(distinct)
            return text, turn_text, turns

        text, turn_text, turns = asyncio.run(run())
    assert turns >= 10 * len(asked) * 0.9, turns  # the budget is used: a small text is not an empty one
    assert text <= turn_text + 48 * turns, (text, turn_text, turns)
