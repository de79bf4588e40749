"""Agent integration against one real `memstream serve` process (embedded, real models): the Python
client (blocking, asyncio, batching, waits longer than its HTTP timeout, retries through a
connection that breaks after the server committed, its distribution and build), the Mem0-compatible
surface (Mem0's quick-start program with only its import changed; its other documented programs
are in test_mem0_usage.py). The MCP server has tests/e2e/test_mcp.py, the TypeScript client
tests/e2e/test_typescript_client.py."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from memstream_client import (AsyncClient, Attachment, AuthenticationError, BadRequest, Client, PermissionDenied, Turn,
                              WaitTimeout)
from tests.e2e.conftest import OTHER, TENANT
from tests.integration import servers

pytestmark = pytest.mark.e2e
BIN = Path(sys.executable).with_name("memstream")
REPO = Path(__file__).resolve().parents[2]


def _turns(conversation: str, texts: list[str], **kw) -> list[Turn]:
    return [Turn(conversation_id=conversation, speaker="Ada" if i % 2 == 0 else "Bo", text=t, turn_index=i, **kw)
            for i, t in enumerate(texts)]


# -- the Python client ----------------------------------------------------------------------------
def test_the_client_adds_waits_searches_reads_back_forgets_and_says_why_it_is_refused(served):
    with Client(served.url, served.keys["writer"]) as ms:
        turns = _turns("trip", ["My sister Grace breeds Icelandic horses near Akureyri.",
                                "We should visit her farm in July.",
                                "I booked the ferry to the Westman Islands for the 14th."])
        turns[0] = turns[0].model_copy(update={"metadata": {"channel": "chat"},
                                               "attachments": [Attachment(kind="image_caption", text="a grey horse")]})
        added = ms.add(turns)
        assert added.accepted == 3 and added.rejected == 0 and added.positions
        assert ms.wait(added.positions, 120) is True
        found = ms.search("Who breeds horses?", conversation_id="trip")
        hit = [t for e in found.evidence for t in e.turns if "Icelandic horses" in t.text]
        assert hit and hit[0].event_id == turns[0].event_id and hit[0].partition >= 0 and found.llm_tokens == 0
        stored = ms.get_turn(turns[0].event_id)
        assert stored.metadata == {"channel": "chat"} and stored.attachments[0]["text"] == "a grey horse"
        assert stored.conversation_id == "trip"
        first = ms.list_turns(conversation_id="trip", limit=2)
        assert len(first.turns) == 2 and first.next_cursor
        rest = ms.list_turns(conversation_id="trip", limit=2, cursor=first.next_cursor)
        assert [t.event_id for t in first.turns + rest.turns] == [t.event_id for t in turns]
        assert rest.next_cursor is None
        assert [e["event_id"] for e in ms.export(conversation_id="trip")] == [t.event_id for t in turns]
        assert ms.status().caught_up
        with pytest.raises(BadRequest, match="no reader is configured"):
            ms.answer("Who breeds horses?", conversation_id="trip")
        with pytest.raises(PermissionDenied):
            ms.search("Who breeds horses?", tenant_id=OTHER)
        # a batch: sent on size and on time, one wait for all of it
        with ms.batch(max_size=2, max_delay=0.2) as batch:
            for t in _turns("batched", [f"batched turn {i} about the glacier walk" for i in range(5)]):
                batch.add(t)
        assert ms.wait(batch.positions, 120) and len(batch.results) >= 3
        assert len(list(ms.iter_turns(conversation_id="batched"))) == 5
        forgot = ms.forget(conversation_id="trip")
        assert ms.wait(forgot.positions, 120)
        again = ms.search("Who breeds horses?", conversation_id="trip")
        assert not [t for e in again.evidence for t in e.turns if "Icelandic" in t.text]
    with Client(served.url, served.keys["reader"]) as reader, pytest.raises(PermissionDenied):
        reader.add(_turns("trip", ["a reader may not write"]))
    with Client(served.url, "msk_0000000000000000_" + "x" * 43) as nobody, \
            pytest.raises(AuthenticationError) as refused:
        nobody.status()
    assert refused.value.status == 401 and refused.value.request_id


def test_the_async_client_does_the_same(served):
    async def run():
        async with AsyncClient(served.url, served.keys["writer"]) as ms:
            added = await ms.add(_turns("async-trip", ["The violin lessons are on Thursdays at five.",
                                                       "Bring the rosin."]))
            assert await ms.wait(added.positions, 120)
            found = await ms.search("When are the violin lessons?", conversation_id="async-trip")
            assert any("Thursdays" in t.text for e in found.evidence for t in e.turns)
            async with ms.batch(max_size=10, max_delay=0.1) as batch:
                await batch.add(_turns("async-batch", ["one", "two", "three"]))
                await asyncio.sleep(0.5)  # sent on time, not on size
                assert batch.results
            assert [t.text async for t in ms.iter_turns(conversation_id="async-batch")] == ["one", "two", "three"]
            forgot = await ms.forget(conversation_id="async-trip")
            assert await ms.wait(forgot.positions, 120)
            assert [e async for e in ms.export(conversation_id="async-trip")] == []

    asyncio.run(run())


class _CountingTransport(httpx.HTTPTransport):
    def __init__(self):
        super().__init__()
        self.waits = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.waits += request.url.path == "/v1/wait"
        return super().handle_request(request)


class _AsyncCountingTransport(httpx.AsyncHTTPTransport):
    def __init__(self):
        super().__init__()
        self.waits = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.waits += request.url.path == "/v1/wait"
        return await super().handle_async_request(request)


def test_a_wait_longer_than_the_http_timeout_ends_on_time_as_wait_timeout(served):
    """Scaled down from a 40 s wait with the 30 s default: a 2 s HTTP timeout and a 5 s wait on
    positions never reached end after about 5 s in WaitTimeout (the server's `caught_up: false`), in one request —
    no read timeout, no retry — from the blocking and the asyncio client at once."""
    never, outcome = {0: 10**9}, {}
    blocking_transport, async_transport = _CountingTransport(), _AsyncCountingTransport()

    def blocking() -> None:
        t0 = time.monotonic()
        with Client(served.url, served.keys["writer"], timeout=2, transport=blocking_transport) as ms:
            try:
                ms.wait(never, timeout=5)
            except Exception as exc:  # noqa: BLE001 - checked below, in the test's thread
                outcome["blocking"] = (exc, time.monotonic() - t0)

    async def asyncio_client() -> tuple[Exception, float]:
        t0 = time.monotonic()
        async with AsyncClient(served.url, served.keys["writer"], timeout=2, transport=async_transport) as ms:
            try:
                await ms.wait(never, timeout=5)
            except Exception as exc:  # noqa: BLE001
                return exc, time.monotonic() - t0
        raise AssertionError("the wait returned")

    thread = threading.Thread(target=blocking)
    thread.start()
    outcome["asyncio"] = asyncio.run(asyncio_client())
    thread.join(30)
    for name, (exc, took) in outcome.items():
        assert isinstance(exc, WaitTimeout) and exc.code == "timeout", (name, exc)
        assert 4.5 <= took < 8, (name, took)
    assert len(outcome) == 2 and blocking_transport.waits == async_transport.waits == 1


class BreakingProxy:
    """A TCP proxy in front of the API that forwards each request and, for the first `breaks`
    POST /v1/events, drops the connection instead of passing the server's answer back: the
    server committed, the client saw a broken connection."""

    def __init__(self, target: str, breaks: int):
        host, port = target.removeprefix("http://").split(":")
        self.target, self.breaks, self.posts = (host, int(port)), breaks, 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    @staticmethod
    def _read_message(conn: socket.socket) -> bytes:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return data
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        while len(body) < length:
            chunk = conn.recv(65536)
            if not chunk:
                break
            body += chunk
        return head + b"\r\n\r\n" + body

    def _serve(self) -> None:
        while True:
            client, _ = self.sock.accept()
            threading.Thread(target=self._one, args=(client,), daemon=True).start()

    def _one(self, client: socket.socket) -> None:
        with client:
            request = self._read_message(client)
            if not request:
                return
            head, _, body = request.partition(b"\r\n\r\n")
            lines = [line for line in head.split(b"\r\n") if not line.lower().startswith(b"connection:")]
            request = b"\r\n".join([*lines, b"Connection: close"]) + b"\r\n\r\n" + body
            with socket.create_connection(self.target) as upstream:
                upstream.sendall(request)
                response = b""
                while chunk := upstream.recv(65536):
                    response += chunk
            if request.startswith(b"POST /v1/events"):
                self.posts += 1
                if self.posts <= self.breaks:
                    client.shutdown(socket.SHUT_RDWR)  # committed on the server; the client never hears
                    return
            client.sendall(response)


def _view_counts(data_dir: Path, conversation: str) -> dict[str, int]:
    """Turns of `conversation` in each view's live generation, read from the stores' own files."""
    from infra.registry import Registry
    from infra.settings import Settings
    from schemas.ports.views import VIEW_NAMES

    registry = Registry(Settings.load(data_dir=data_dir))
    counts = {}
    for view in VIEW_NAMES:
        store = registry.open_view(view, registry.catalog().current(view))
        try:
            turns = store.canonical_dump()["turns"]  # every view's dump carries its turn ledger
            counts[view] = sum(1 for t in turns if t["conversation"] == conversation and t["tenant"] == TENANT)
        finally:
            store.close()
    return counts


def test_a_publish_retried_after_a_broken_connection_never_duplicates_memory(served):
    proxy = BreakingProxy(served.url, breaks=2)
    turns = _turns("retried", [f"retried turn {i}: the bakery on Rua Augusta opens at seven" for i in range(20)])
    with Client(proxy.url, served.keys["writer"]) as ms:
        added = ms.add(turns)  # two attempts break after the server appended them; the third answers
    assert proxy.posts == 3 and added.accepted == 20
    with Client(served.url, served.keys["writer"]) as ms:
        assert ms.wait(added.positions, 120)
        assert len(list(ms.iter_turns(conversation_id="retried"))) == 20
    assert _view_counts(served.data_dir, "retried") == {"hierarchy": 20, "lexical": 20, "dense": 20, "graph": 20}


def test_the_client_distribution_depends_on_httpx_and_pydantic_only(tmp_path):
    """The built wheel's dependencies, resolved in a fresh virtualenv (not this one) from the
    wheels the install step keeps (or the package index when there are none)."""
    dist = tmp_path / "dist"
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                            "-w", str(dist), str(REPO / "clients" / "python")], capture_output=True, text=True,
                           timeout=300)
    assert built.returncode == 0, built.stderr
    [wheel] = dist.glob("memstream_client-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    wheels = Path(os.environ.get("MEMSTREAM_CACHE", Path.home() / ".cache" / "memstream")) / "wheels"
    source = ["--no-index", "--find-links", str(wheels)] if any(wheels.glob("httpx-*.whl")) else []
    report = tmp_path / "report.json"
    out = subprocess.run([str(venv / "bin" / "pip"), "install", "--dry-run", "--ignore-installed", "--quiet",
                          "--report", str(report), *source, str(wheel)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    names = {item["metadata"]["name"].lower().replace("_", "-") for item in json.loads(report.read_text())["install"]}
    assert {"memstream-client", "httpx", "pydantic"} <= names
    heavy = names & {"torch", "spacy", "numpy", "flagembedding", "transformers", "scipy", "aiokafka"}
    assert not heavy, f"the client pulls in {heavy}"
    assert len(names) <= 12, names  # httpx, pydantic and their own few dependencies


def test_building_and_installing_the_client_writes_nothing_into_its_source_tree(tmp_path):
    """A wheel (pip wheel), an editable install as scripts/bootstrap.sh makes it (offline, no build
    isolation) and an sdist installed in turn, each into a fresh virtualenv: the editable one
    imports the source tree itself, the sdist builds, and clients/python has the same files after."""
    source = REPO / "clients" / "python"

    def files() -> set[str]:  # __pycache__ is Python importing the package, not the build
        return {str(p.relative_to(source)) for p in source.rglob("*") if "__pycache__" not in p.parts}

    before = files()
    pip = [sys.executable, "-m", "pip"]
    offline = ["--no-index", "--no-deps", "--no-build-isolation", "--quiet"]
    wheel = subprocess.run([*pip, "wheel", *offline, "-w", str(tmp_path / "dist"), str(source)],
                           capture_output=True, text=True, timeout=300)
    assert wheel.returncode == 0, wheel.stderr
    [built] = (tmp_path / "dist").glob("memstream_client-*.whl")
    assert built.name == f"memstream_client-{_client_version()}-py3-none-any.whl"
    for name, target in (("editable", ["-e", str(source)]), ("sdist", None)):
        venv = tmp_path / name
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
        if target is None:  # the sdist, built by the backend's hook as a frontend calls it
            hook = ("import sys; sys.path.insert(0, '_backend'); import memstream_build as b; "
                    f"print(b.build_sdist({str(tmp_path / 'sdist')!r}))")
            out = subprocess.run([sys.executable, "-c", hook], cwd=source, capture_output=True, text=True, timeout=120)
            assert out.returncode == 0, out.stderr
            target = [str(tmp_path / "sdist" / out.stdout.strip())]
        installed = subprocess.run([*pip, "--python", str(venv / "bin" / "python"), "install", *offline, *target],
                                   capture_output=True, text=True, timeout=300)
        assert installed.returncode == 0, installed.stderr
        where = subprocess.run([str(venv / "bin" / "python"), "-c", "import importlib.util as u; "
                                "print(u.find_spec('memstream_client').origin)"],
                               capture_output=True, text=True, timeout=60)
        origin = Path(where.stdout.strip())
        assert (origin.is_relative_to(source / "src")) == (name == "editable"), origin
        assert (origin.parent / "compat" / "mem0" / "plans.py").is_file() and (origin.parent / "py.typed").is_file()
    assert files() == before, f"the build wrote {sorted(files() - before)} into {source}"


def _client_version() -> str:
    import tomllib

    return tomllib.loads((REPO / "clients" / "python" / "pyproject.toml").read_text())["project"]["version"]


# -- Mem0 ------------------------------------------------------------------------------------------
QUICKSTART = '''
from mem0 import Memory

memory = Memory()


def chat_with_memories(message: str, user_id: str = "default_user") -> str:
    relevant_memories = memory.search(query=message, filters={"user_id": user_id}, top_k=3)
    memories_str = "\\n".join(f"- {entry['memory']}" for entry in relevant_memories["results"])
    answer = f"Here is what I remember:\\n{memories_str}"  # the quick start asks an LLM here
    messages = [{"role": "user", "content": message}, {"role": "assistant", "content": answer}]
    memory.add(messages, user_id=user_id)
    return answer


chat_with_memories("I am allergic to peanuts and I love hiking in the Alps.", user_id="alice")
print(chat_with_memories("Which food am I allergic to?", user_id="alice"))
'''


def test_mem0s_quick_start_runs_with_only_its_import_changed(served, tmp_path):
    program = tmp_path / "quickstart.py"
    program.write_text(QUICKSTART.replace("from mem0 import Memory", "from memstream_client.compat.mem0 import Memory"))
    ours = "from memstream_client.compat.mem0 import Memory"
    assert QUICKSTART.replace("from mem0 import Memory", "") == program.read_text().replace(ours, "")
    env = {**os.environ, "MEMSTREAM_URL": served.url, "MEMSTREAM_API_KEY": served.keys["writer"]}
    out = subprocess.run([sys.executable, str(program)], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "allergic to peanuts" in out.stdout


def test_the_mem0_surface_updates_keeps_history_and_deletes(served):
    from memstream_client.compat.mem0 import AsyncMemory, Memory

    m = Memory({"url": served.url, "api_key": served.keys["writer"]})
    added = m.add([{"role": "user", "content": "My favourite colour is green."},
                   {"role": "system", "content": "be brief"}],
                  user_id="bob", run_id="s1", metadata={"topic": "colours"})
    [item] = added["results"]  # the system message is not memory
    assert item["event"] == "ADD" and item["memory"] == "My favourite colour is green."
    got = m.get(item["id"])
    assert got["memory"] == "My favourite colour is green." and got["user_id"] == "bob" and got["run_id"] == "s1"
    assert got["metadata"] == {"topic": "colours"}
    assert m.update(item["id"], text="My favourite colour is blue.") == {"message": "Memory updated successfully!"}
    assert m.update(item["id"], data="My favourite colour is purple.") == {"message": "Memory updated successfully!"}
    assert m.get(item["id"])["memory"] == "My favourite colour is purple."
    found = m.search("What is my favourite colour?", filters={"user_id": "bob"})["results"]
    assert [r["memory"] for r in found if r["id"] == item["id"]] == ["My favourite colour is purple."]
    assert not [r for r in found if "green" in r["memory"] or "blue" in r["memory"]]
    history = m.history(item["id"])
    assert [(h["event"], h["old_memory"], h["new_memory"]) for h in history] == [
        ("ADD", None, "My favourite colour is green."),
        ("UPDATE", "My favourite colour is green.", "My favourite colour is blue."),
        ("UPDATE", "My favourite colour is blue.", "My favourite colour is purple.")]
    assert [r["id"] for r in m.get_all(filters={"user_id": "bob"})["results"]] == [item["id"]]
    with pytest.raises(ValueError, match="filters"):
        m.search("colour", user_id="bob")
    with pytest.raises(ValueError):
        m.delete_all()
    assert m.delete(item["id"]) == {"message": "Memory deleted successfully!"}
    assert m.get(item["id"]) is None and m.history(item["id"]) == []
    assert m.get_all(filters={"user_id": "bob"})["results"] == []

    async def run():
        am = AsyncMemory({"url": served.url, "api_key": served.keys["writer"]})
        await am.add("I water the plants on Sundays.", user_id="carol")
        await am.add("The fern needs less water in winter.", user_id="carol", agent_id="gardener")
        hits = await am.search("When do I water the plants?", filters={"user_id": "carol"})
        assert any("Sundays" in r["memory"] for r in hits["results"])
        assert await am.delete_all(user_id="carol") == {"message": "Memories deleted successfully!"}
        assert (await am.get_all(filters={"user_id": "carol"}))["results"] == []
        await am.aclose()

    asyncio.run(run())
