"""Every example of docs/agents.md runs: fenced blocks tagged after their language (```python run,
```bash run, ```bash run-kafka, ```json run-mcp-stdio, ```bash/json run-mcp-http) are extracted
and run against a live `memstream serve` (the Kafka one against the test broker). A block of that
page without one of these tags fails the test, so no example is left unrun (tests/unit/test_docs.py
holds every other page's blocks to a `norun <reason>` tag)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.e2e.conftest import TENANT
from tests.integration import servers

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).with_name("memstream")
KINDS = {("python", "run"), ("bash", "run"), ("bash", "run-kafka"), ("json", "run-mcp-stdio"), ("bash", "run-mcp-http"),
         ("json", "run-mcp-http")}
FENCE = re.compile(r"^```(\w+)(?: ([^\n]+))?\n(.*?)^```", re.S | re.M)


def examples() -> list[tuple[str, str | None, str]]:
    text = (REPO / "docs" / "agents.md").read_text(encoding="utf-8")
    return [(lang, tag, body) for lang, tag, body in FENCE.findall(text)]


def of(lang: str, tag: str) -> list[str]:
    return [body for la, t, body in examples() if (la, t) == (lang, tag)]


def test_every_example_of_the_section_is_one_this_test_runs():
    found = [(lang, tag) for lang, tag, _ in examples()]
    assert found and all(k in KINDS for k in found), f"untagged or unknown examples: {[k for k in found if k not in KINDS]}"
    assert set(found) == KINDS


def _env(served) -> dict[str, str]:
    return {**os.environ, "MEMSTREAM_URL": served.url, "MEMSTREAM_API_KEY": served.keys["writer"]}


@pytest.mark.parametrize("index", range(2))
def test_python_examples(served, tmp_path, index):
    blocks = of("python", "run")
    assert len(blocks) == 2
    script = tmp_path / "example.py"
    script.write_text(blocks[index])
    out = subprocess.run([sys.executable, str(script)], env=_env(served), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    expected = ["order 1234 arrived damaged", "I prefer aisle seats on long flights.\n['ADD', 'UPDATE']"][index]
    assert expected in out.stdout, out.stdout


def test_the_curl_example(served):
    [block] = of("bash", "run")
    out = subprocess.run(["bash", "-euo", "pipefail", "-c", block], env=_env(served), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "The nightly backup moved to 02:30 UTC."


@pytest.mark.integration
def test_the_kcat_example(kafka_bootstrap, tmp_path):
    from schemas.events import decode_event, partition_key
    from schemas.ports.event_log import default_partition
    from infra.log.kafka import KafkaEventLog

    [block] = of("bash", "run-kafka")
    topic = f"readme{uuid.uuid4().hex[:8]}.events"
    sec = servers.kafka_security()
    log = KafkaEventLog(kafka_bootstrap, security=sec)

    async def read():
        await log.start()
        try:
            await log.ensure_topic(f"{topic}.intake", 3)
            env = {**os.environ, "KAFKA_BOOTSTRAP": kafka_bootstrap, "KCAT_OPTS": " ".join(servers.kcat_config(tmp_path)),
                   "MEMSTREAM_LOG_TOPIC": topic}
            out = await asyncio.to_thread(subprocess.run, ["bash", "-euo", "pipefail", "-c", block], env=env, capture_output=True, text=True,
                                          timeout=120)
            assert out.returncode == 0, out.stderr
            end = await log.end_offsets(f"{topic}.intake")
            return [r for p, off in end.items() if off for r in await log.read(f"{topic}.intake", p, 0, max_records=off)]
        finally:
            await log.close()

    [record] = asyncio.run(read())
    event = decode_event(record.value)
    assert event.event_id == "kcat-demo-1" and event.tenant_id == "acme"
    assert record.partition == default_partition(partition_key("acme", "kcat-demo"), 3)  # where memstream's own producer puts it


def _stdio_params(config: dict, served):
    from mcp import StdioServerParameters

    spec = config["mcpServers"]["memstream"]
    args = [served.url if a == "http://127.0.0.1:8080" else a for a in spec["args"]]
    env = {**os.environ, **{k: served.keys["writer"] if v == "msk_..." else v for k, v in spec["env"].items()}}
    command = str(BIN) if spec["command"] == "memstream" else spec["command"]
    return StdioServerParameters(command=command, args=args, env=env)


async def _tools_and_status(session) -> None:
    await session.initialize()
    assert "search_memory" in {t.name for t in (await session.list_tools()).tools}
    status = await session.call_tool("memory_status", {})
    assert not status.is_error and status.structured_content["views"]


def test_the_mcp_stdio_configuration(served):
    from mcp import ClientSession
    from mcp.client.stdio import stdio_client

    [block] = of("json", "run-mcp-stdio")
    params = _stdio_params(json.loads(block), served)

    async def run():
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await _tools_and_status(session)

    asyncio.run(run())


def test_the_mcp_http_command_and_configuration(served, tmp_path):
    import httpx2
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    [command] = of("bash", "run-mcp-http")
    [block] = of("json", "run-mcp-http")
    [port] = servers.free_ports(1)
    argv = [str(BIN) if a == "memstream" else served.url if a == "http://127.0.0.1:8080" else str(port) if a == "8765" else a
            for a in shlex.split(command)]
    spec = json.loads(block.replace("8765", str(port)))["mcpServers"]["memstream"]
    headers = {k: v.replace("msk_...", served.keys["writer"]) for k, v in spec["headers"].items()}
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stderr.read().decode()
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline
                time.sleep(0.2)

        async def run():
            async with httpx2.AsyncClient(headers=headers, timeout=120) as http, \
                    streamable_http_client(spec["url"], http_client=http) as (read, write), ClientSession(read, write) as session:
                await _tools_and_status(session)

        asyncio.run(run())
    finally:
        proc.terminate()
        proc.wait(30)


def test_the_examples_wrote_into_the_keys_tenant(served):
    """(The curl example names no tenant: its key's is used.)"""
    from memstream_client import Client

    with Client(served.url, served.keys["writer"]) as ms:
        assert ms.get_turn("curl-demo-1").tenant_id == TENANT
