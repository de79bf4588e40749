"""The HTTP API against its own OpenAPI document, as a third party checks it: `schemathesis run`
(the CLI, over real HTTP) against a running `memstream serve`, once per role (reader, writer,
admin key), with every check schemathesis has — server errors, status codes, content types and
response headers as documented, response bodies against their schemas, invalid data refused
(negative data rejection), valid data accepted (positive data acceptance), missing headers and
undeclared methods answered as HTTP says, authentication not ignored, and the stateful checks
(use after free, resource availability) where its inferred links fit — in every phase
(examples, coverage, fuzzing, stateful), with a fixed seed and EXAMPLES cases per operation.
The run must find nothing.

What makes the run affordable and faithful: the server runs on the declared fast model path
(infra/models/fast.py; the models are not what this tests), with a reader stand-in for
/v1/answer's one LLM call (tests/e2e/reader_stub.py), rate limits off (they have their own
tests), and its own limits small where a request's schema follows them — at most MAX_BATCH
events per publish and MAX_WAIT seconds per wait, which the document it serves states. The
hooks (tests/e2e/fuzz_hooks.py) put real names where generated ones would name nothing — key ids,
event ids, the tenant, the conversation, asset names — and change nothing else.

The views hold the demo conversation and the dead-letter topic a few records, so that listings
have pages and searches have evidence."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from infra.registry import Registry
from infra.settings import Settings
from memstream_client import AuthenticationError, Client, WaitTimeout
from schemas.ports.event_log import NewRecord
from services.routes.dashboard import DASHBOARD_DIR
from tests.e2e.fast_processes import FAST
from tests.e2e.helpers import sample_items
from tests.e2e.reader_stub import ReaderStub
from tests.integration import servers

pytestmark = pytest.mark.e2e

SEED = 20261205
EXAMPLES = 50
MAX_BATCH, MAX_WAIT = 20, 0.5
ROLES = ("reader", "writer", "admin")
TENANT = "demo"
REPO = Path(__file__).resolve().parents[2]
SCHEMATHESIS = Path(sys.executable).with_name("schemathesis")


def _works(url: str, key: str) -> bool:
    try:
        with Client(url, key) as c:
            c.status()
        return True
    except AuthenticationError:
        return False


async def _dead_letters(data_dir: Path) -> None:
    """Records no projection can decode, straight onto the log (as a foreign producer could)."""
    settings = Settings.load(data_dir=data_dir)
    log = Registry(settings).event_log()
    await log.start()
    try:
        await log.append(settings.log.topic, [NewRecord(f"fuzz/{i}", f"not an event {i}".encode()) for i in range(4)])
    finally:
        await log.close()


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory):
    if not SCHEMATHESIS.exists():
        pytest.fail(f"schemathesis is not installed in {SCHEMATHESIS.parent} (requirements.lock has it)")
    stub = ReaderStub()
    work = tmp_path_factory.mktemp("fuzz")
    env = {**FAST, "MEMSTREAM_READER_URL": stub.url, "MEMSTREAM_READER_MODEL": "reader-stub", "MEMSTREAM_API_RATE_LIMIT_PER_SECOND": "0",
           "MEMSTREAM_API_MAX_BATCH": str(MAX_BATCH), "MEMSTREAM_API_MAX_WAIT_SECONDS": str(MAX_WAIT)}
    try:
        with servers.memstream_serve(work, 120, env=env) as s:
            cli_env = servers.embedded_env(s.data_dir)
            keys = {"admin": s.admin_key["key"], **{role: servers.cli_key(s.data_dir, role, TENANT, env=cli_env)["key"]
                                                    for role in ("reader", "writer")}}
            victims = {action: [servers.cli_key(s.data_dir, "writer", "victims", env=cli_env)["key_id"] for _ in range(3)]
                       for action in ("revoke", "rotate")}
            deadline = time.monotonic() + 30
            while not _works(s.url, keys["writer"]):
                assert time.monotonic() < deadline, "the new keys were never accepted"
                time.sleep(0.2)
            asyncio.run(_dead_letters(s.data_dir))
            with Client(s.url, keys["writer"]) as c:
                positions, deadline = c.add(sample_items()).positions, time.monotonic() + 120
                while True:  # in waits this server allows (MAX_WAIT)
                    try:
                        c.wait(positions, timeout=MAX_WAIT)
                        break
                    except WaitTimeout:
                        assert time.monotonic() < deadline, "the sample was never processed"
            deadline = time.monotonic() + 60
            while len(httpx.get(f"{s.url}/v1/dead-letters", headers={"Authorization": f"Bearer {keys['admin']}"})
                      .json()["dead_letters"]) < 2:
                assert time.monotonic() < deadline, "the undecodable records were never dead-lettered"
                time.sleep(0.2)
            items = sample_items()
            real = {"tenant": TENANT, "conversation": items[0]["conversation_id"], "event_ids": [i["event_id"] for i in items[:6]],
                    "victims": victims, "assets": sorted(p.name for p in DASHBOARD_DIR.iterdir() if p.suffix in (".js", ".css")),
                    "ops_token": s.ops_token}
            (work / "real.json").write_text(json.dumps(real), encoding="utf-8")
            s.keys = keys
            s.work = work
            yield s
    finally:
        stub.close()


def run_schemathesis(served, role: str) -> tuple[int, str, float]:
    out = served.work / f"schemathesis-{role}"
    shutil.rmtree(out, ignore_errors=True)
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "tests.e2e.fuzz_hooks", "MEMSTREAM_FUZZ_REAL": str(served.work / "real.json"),
           "PYTHONPATH": str(REPO), "NO_COLOR": "1"}
    args = [str(SCHEMATHESIS), "run", f"{served.url}/openapi.json", "--checks", "all", "--max-examples", str(EXAMPLES),
            "--seed", str(SEED), "--workers", "1", "--phases", "examples,coverage,fuzzing,stateful",
            "--suppress-health-check", "all", "--continue-on-failure", "--request-timeout", "30",
            "-H", f"Authorization: Bearer {served.keys[role]}", "--report", "junit", "--report-dir", str(out)]
    t0 = time.perf_counter()
    done = subprocess.run(args, cwd=served.work, env=env, capture_output=True, text=True, timeout=900)
    return done.returncode, done.stdout + done.stderr, time.perf_counter() - t0


@pytest.mark.parametrize("role", ROLES)
def test_schemathesis_finds_nothing(fuzzed, role, request):
    code, output, seconds = run_schemathesis(fuzzed, role)
    summary = "\n".join(line for line in output.splitlines() if re.search(r"generated|passed|failed|ST\d{3}|Seed", line))
    terminal = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if terminal is not None and capture is not None:
        with capture.global_and_fixture_disabled():
            terminal.write_line(f"\nschemathesis, {role} key, {seconds:.0f} s:\n{summary}")
    assert code == 0, f"schemathesis found failures with the {role} key:\n{output[-20000:]}"
    assert re.search(r"\b0 failures\b|No issues found|passed", output), output[-3000:]
