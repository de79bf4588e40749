"""Real servers for the integration tier, through infra/servers/start.sh and stop.sh.

A server named by an environment variable (scripts/test.sh starts one per run and exports e.g.
MEMSTREAM_TEST_KAFKA=127.0.0.1:PORT) is used as is. Otherwise the server is started once per
test session on free ports with a temporary state directory, and stopped at the end. Without
Java (or without Maven while the jars are not cached yet) the caller skips, saying why; under
CI=true tests/conftest.py turns such skips into failures.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

REPO = Path(__file__).resolve().parents[2]
SERVERS = REPO / "infra/servers"
CACHE = Path(os.environ.get("MEMSTREAM_CACHE", Path.home() / ".cache/memstream"))


class Unavailable(Exception):
    """The machine lacks what the server needs; the message says what to install."""


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _check_tools(name: str) -> None:
    if shutil.which("java") is None:
        raise Unavailable(f"{name} not tested: no `java` on PATH (install a JDK >= 17, or set the server's "
                          f"MEMSTREAM_TEST_* address)")
    if shutil.which("mvn") is None and not (CACHE / "servers" / name / "lib" / ".stamp").is_file():
        raise Unavailable(f"{name} not tested: no `mvn` on PATH to fetch its jars (install Maven, or set the "
                          f"server's MEMSTREAM_TEST_* address)")


@contextmanager
def kafka(env_var: str = "MEMSTREAM_TEST_KAFKA") -> Iterator[str]:
    """Yields a Kafka bootstrap address (host:port)."""
    given = os.environ.get(env_var)
    if given:
        yield given.removeprefix("kafka://")
        return
    _check_tools("kafka")
    state = Path(tempfile.mkdtemp(prefix="memstream-test-servers-"))
    port, controller = free_ports(2)
    env = {**os.environ, "KAFKA_PORT": str(port), "KAFKA_CONTROLLER_PORT": str(controller),
           "MEMSTREAM_PYTHON": sys.executable}
    started = subprocess.run([str(SERVERS / "start.sh"), "kafka", "--data", str(state), "--fresh"], env=env,
                             capture_output=True, text=True, timeout=900)
    if started.returncode != 0:
        raise RuntimeError(f"infra/servers/start.sh kafka failed (state kept in {state}):\n{started.stderr[-4000:]}")
    try:
        yield dict(line.split("=", 1) for line in started.stdout.split() if "=" in line)["KAFKA_BOOTSTRAP"]
    finally:
        subprocess.run([str(SERVERS / "stop.sh"), "kafka", "--data", str(state)], env=env, capture_output=True, timeout=120)
        shutil.rmtree(state, ignore_errors=True)
