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
def _server(name: str, env_var: str, output_key: str, port_vars: tuple[str, ...], strip: str = "") -> Iterator[str]:
    given = os.environ.get(env_var)
    if given:
        yield given.removeprefix(strip) if strip else given
        return
    _check_tools(name)
    state = Path(tempfile.mkdtemp(prefix="memstream-test-servers-"))
    env = {**os.environ, **{var: str(p) for var, p in zip(port_vars, free_ports(len(port_vars)))}, "MEMSTREAM_PYTHON": sys.executable}
    started = subprocess.run([str(SERVERS / "start.sh"), name, "--data", str(state), "--fresh"], env=env,
                             capture_output=True, text=True, timeout=900)
    if started.returncode != 0:
        if "JDK" in started.stderr and ">= 21" in started.stderr:
            raise Unavailable(f"{name} not tested: {started.stderr.strip().splitlines()[-1]}")
        raise RuntimeError(f"infra/servers/start.sh {name} failed (state kept in {state}):\n{started.stderr[-4000:]}")
    try:
        yield dict(line.split("=", 1) for line in started.stdout.split() if "=" in line)[output_key]
    finally:
        subprocess.run([str(SERVERS / "stop.sh"), name, "--data", str(state)], env=env, capture_output=True, timeout=180)
        shutil.rmtree(state, ignore_errors=True)


@contextmanager
def kafka(env_var: str = "MEMSTREAM_TEST_KAFKA") -> Iterator[str]:
    """Yields a Kafka bootstrap address (host:port)."""
    with _server("kafka", env_var, "KAFKA_BOOTSTRAP", ("KAFKA_PORT", "KAFKA_CONTROLLER_PORT"), "kafka://") as address:
        yield address


@contextmanager
def opensearch(env_var: str = "MEMSTREAM_TEST_OPENSEARCH") -> Iterator[str]:
    """Yields an OpenSearch URL (http://host:port)."""
    with _server("opensearch", env_var, "OPENSEARCH_URL", ("OPENSEARCH_PORT", "OPENSEARCH_TRANSPORT_PORT")) as url:
        yield url


@contextmanager
def neo4j(env_var: str = "MEMSTREAM_TEST_NEO4J") -> Iterator[str]:
    """Yields a Neo4j Bolt URI (bolt://host:port) of a server with the GDS library."""
    with _server("neo4j", env_var, "NEO4J_URI", ("NEO4J_BOLT_PORT",)) as uri:
        yield uri


def kcat_publish(bootstrap: str, topic: str, events) -> int:
    """Publish events with kcat (librdkafka): a foreign producer. Keys are `tenant/conversation`
    and the partitioner is murmur2, so records land where memstream's own producer puts them."""
    import shutil
    import subprocess

    if shutil.which("kcat") is None:
        raise Unavailable("kcat is not installed (Debian package `kcat`)")
    lines = "".join(f"{e.tenant_id}/{e.conversation_id}\t{e.model_dump_json()}\n" for e in events)
    out = subprocess.run(["kcat", "-P", "-b", bootstrap, "-t", topic, "-K", "\t", "-X", "partitioner=murmur2_random"],
                         input=lines, text=True, capture_output=True, timeout=300)
    if out.returncode != 0:
        raise RuntimeError(f"kcat failed: {out.stderr}")
    return lines.count("\n")


def reset_neo4j_graph_view(uri: str, generations: range = range(1, 10)) -> None:
    """Neo4j Community has one database and the graph view is not namespaced by topic: a run
    that reuses a server starts its graph view from scratch (contract tests use generations
    >= 1e6 and are left alone)."""
    import neo4j

    from infra.neo4j_base import drop_generation_data

    with neo4j.GraphDatabase.driver(uri, auth=None) as driver, driver.session() as s:
        for generation in generations:
            drop_generation_data(s, "graph", generation)
        s.run("MATCH (n) WHERE (n:MemstreamGeneration OR n:MemstreamCatalogLock) AND n.view = 'graph' DETACH DELETE n").consume()
