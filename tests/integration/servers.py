"""Real servers for the integration tier, through infra/servers/start.sh and stop.sh.

A server named by an environment variable (scripts/test.sh starts one per run and exports e.g.
MEMSTREAM_TEST_KAFKA=127.0.0.1:PORT) is used as is. Otherwise the server is started once per
test session on free ports with a temporary state directory, and stopped at the end. Without
Java (or without Maven while the jars are not cached yet) the caller skips, saying why; under
CI=true tests/conftest.py turns such skips into failures.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from services.bench.procfs import cpu_seconds

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


def qdrant_binary() -> Path | None:
    """The Qdrant server binary (infra/servers/common.sh's qdrant_bin, same order)."""
    for candidate in (os.environ.get("MEMSTREAM_QDRANT_BIN"), REPO.parent / "shared/bin/qdrant", Path("/work/shared/bin/qdrant"),
                      shutil.which("qdrant")):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return Path(candidate)
    return None


def _check_tools(name: str) -> None:
    if name == "qdrant":
        if qdrant_binary() is None:
            raise Unavailable("qdrant not tested: no Qdrant server binary (../shared/bin/qdrant, MEMSTREAM_QDRANT_BIN or `qdrant` "
                              "on PATH), or set MEMSTREAM_TEST_QDRANT to a running server's URL")
        return
    if shutil.which("java") is None:
        raise Unavailable(f"{name} not tested: no `java` on PATH (install a JDK >= 17, or set the server's "
                          f"MEMSTREAM_TEST_* address)")
    if shutil.which("mvn") is None and not (CACHE / "servers" / name / "lib" / ".stamp").is_file():
        raise Unavailable(f"{name} not tested: no `mvn` on PATH to fetch its jars (install Maven, or set the "
                          f"server's MEMSTREAM_TEST_* address)")


# server -> (the variable start.sh reads, (the tests' user and password variables))
SERVER_SECRETS = {
    "kafka": ("KAFKA_SASL_PASSWORD", ("MEMSTREAM_TEST_KAFKA_USERNAME", "MEMSTREAM_TEST_KAFKA_PASSWORD")),
    "neo4j": ("NEO4J_PASSWORD", ("MEMSTREAM_TEST_NEO4J_USERNAME", "MEMSTREAM_TEST_NEO4J_PASSWORD")),
}


def server_data_dir(name: str) -> Path | None:
    """Where a test server keeps its files (for byte-level scans): the server started here, or
    scripts/test.sh's, or $MEMSTREAM_TEST_<NAME>_DATA for one given from outside; None if unknown."""
    given = os.environ.get(f"MEMSTREAM_TEST_{name.upper()}_DATA")
    if given:
        return Path(given)
    state = os.environ.get("MEMSTREAM_TEST_SERVERS_STATE")
    return Path(state) / name if state and (Path(state) / name).is_dir() else None


def server_cpu_ms() -> dict[str, float]:
    """CPU time (ms) each test server has used so far, found by its pid file (a server given
    from outside without its state directory is left out; of two servers of one kind, the one
    started last)."""
    out = {}
    for name in ("kafka", "opensearch", "neo4j", "qdrant"):
        state = server_data_dir(name)
        try:
            out[name] = cpu_seconds((state / f"{name}.pid").read_text().split()[0]) * 1000
        except (OSError, TypeError, IndexError):
            continue
    return out


def kafka_security():
    """How the tests authenticate to the test broker (SASL/SCRAM when it has a password)."""
    from infra.log.kafka_security import KafkaSecurity

    password = os.environ.get("MEMSTREAM_TEST_KAFKA_PASSWORD")
    if not password:
        return KafkaSecurity()
    return KafkaSecurity("SASL_PLAINTEXT", "SCRAM-SHA-512", os.environ.get("MEMSTREAM_TEST_KAFKA_USERNAME", "memstream"), password)


def kafka_log(bootstrap: str, **fields) -> dict:
    """Settings.log for the test broker: its URL with the user, and the password."""
    sec = kafka_security()
    url = f"kafka://{sec.username}@{bootstrap}" if sec.sasl else f"kafka://{bootstrap}"
    return {"url": url, **({"kafka_password": sec.password} if sec.sasl else {}), **fields}


def kafka_admin_kwargs(bootstrap: str) -> dict:
    """Keyword arguments for an aiokafka client of the test broker."""
    return {"bootstrap_servers": bootstrap, **kafka_security().client_kwargs()}


def neo4j_auth() -> tuple[str, str] | None:
    password = os.environ.get("MEMSTREAM_TEST_NEO4J_PASSWORD")
    return (os.environ.get("MEMSTREAM_TEST_NEO4J_USERNAME", "neo4j"), password) if password else None


def neo4j_views(uri: str) -> dict:
    """Settings.views fields for the graph view on the test Neo4j."""
    auth = neo4j_auth()
    return {"graph_url": uri, **({"neo4j_password": auth[1]} if auth else {})}


@contextmanager
def _server(name: str, env_var: str, output_key: str, port_vars: tuple[str, ...], strip: str = "") -> Iterator[str]:
    given = os.environ.get(env_var)
    if given:
        yield given.removeprefix(strip) if strip else given
        return
    _check_tools(name)
    state = Path(tempfile.mkdtemp(prefix="memstream-test-servers-"))
    env = {**os.environ, **{var: str(p) for var, p in zip(port_vars, free_ports(len(port_vars)))}, "MEMSTREAM_PYTHON": sys.executable}
    # Authentication on, as scripts/test.sh runs them: a fresh secret per server, handed to the
    # tests through the same MEMSTREAM_TEST_* variables test.sh exports.
    secret = SERVER_SECRETS.get(name)
    if secret is not None:
        server_var, test_vars = secret
        env[server_var] = os.environ[test_vars[1]] = secrets.token_urlsafe(24)
        os.environ[test_vars[0]] = "memstream" if name == "kafka" else "neo4j"
    started = subprocess.run([str(SERVERS / "start.sh"), name, "--data", str(state), "--fresh"], env=env,
                             capture_output=True, text=True, timeout=900)
    if started.returncode != 0:
        if "JDK" in started.stderr and ">= 21" in started.stderr:
            raise Unavailable(f"{name} not tested: {started.stderr.strip().splitlines()[-1]}")
        raise RuntimeError(f"infra/servers/start.sh {name} failed (state kept in {state}):\n{started.stderr[-4000:]}")
    os.environ[f"MEMSTREAM_TEST_{name.upper()}_DATA"] = str(state / name)
    try:
        yield dict(line.split("=", 1) for line in started.stdout.split() if "=" in line)[output_key]
    finally:
        subprocess.run([str(SERVERS / "stop.sh"), name, "--data", str(state)], env=env, capture_output=True, timeout=180)
        shutil.rmtree(state, ignore_errors=True)


@contextmanager
def private_qdrant(api_key: str | None = None) -> Iterator[tuple[str, Path, dict[str, str]]]:
    """A Qdrant server of the caller's own (e.g. with an API key, or to be killed and restarted):
    (URL as `qdrant()` yields it, state directory, the environment start.sh/stop.sh need)."""
    _check_tools("qdrant")
    state = Path(tempfile.mkdtemp(prefix="memstream-test-qdrant-"))
    http, grpc = free_ports(2)
    env = {**os.environ, "QDRANT_HTTP_PORT": str(http), "QDRANT_GRPC_PORT": str(grpc), "MEMSTREAM_PYTHON": sys.executable}
    if api_key:
        env["QDRANT_API_KEY"] = api_key
    try:
        start_qdrant(state, env)
        yield f"http://127.0.0.1:{http}?grpc_port={grpc}", state, env
    finally:
        subprocess.run([str(SERVERS / "stop.sh"), "qdrant", "--data", str(state)], env=env, capture_output=True, timeout=60)
        shutil.rmtree(state, ignore_errors=True)


def start_qdrant(state: Path, env: dict[str, str]) -> None:
    """(Re)start the Qdrant server whose state is in `state` (its storage survives restarts)."""
    started = subprocess.run([str(SERVERS / "start.sh"), "qdrant", "--data", str(state)], env=env, capture_output=True, text=True, timeout=120)
    if started.returncode != 0:
        raise RuntimeError(f"infra/servers/start.sh qdrant failed:\n{started.stderr[-4000:]}")


def kill_qdrant(state: Path) -> None:
    """SIGKILL the server (no clean shutdown: what was acknowledged must survive)."""
    pid_file = state / "qdrant" / "qdrant.pid"
    pid = int(pid_file.read_text())
    os.kill(pid, signal.SIGKILL)
    while Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text(errors="replace").lower():
        time.sleep(0.05)
    pid_file.unlink()


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


@contextmanager
def qdrant(env_var: str = "MEMSTREAM_TEST_QDRANT") -> Iterator[str]:
    """Yields a Qdrant server URL: http://host:port?grpc_port=N (the REST port, and the gRPC one)."""
    with _server("qdrant", env_var, "QDRANT_URL", ("QDRANT_HTTP_PORT", "QDRANT_GRPC_PORT")) as url:
        yield url


def qdrant_view_url(server_url: str, prefix: str, *, grpc: bool = True) -> str:
    """MEMSTREAM_VIEWS_DENSE_URL for the Qdrant server at `server_url` (as `qdrant()` yields it)."""
    from urllib.parse import parse_qs, urlparse

    parsed = urlparse(server_url)
    query = f"prefix={prefix}"
    grpc_port = parse_qs(parsed.query).get("grpc_port", [None])[0]
    if grpc and grpc_port:
        query += f"&grpc_port={grpc_port}"
    return f"qdrant://{parsed.netloc}?{query}"


def qdrant_test_client(server_url: str, *, grpc: bool = True):
    """A client of the test Qdrant server built the way the registry builds it from a view URL."""
    from infra.registry import Registry
    from infra.settings import Settings

    url = qdrant_view_url(server_url, "unused", grpc=grpc)
    return Registry(Settings.load(views={"dense_url": url}))._qdrant(url)


def drop_qdrant_prefix(server_url: str, prefix: str) -> None:
    """Delete every collection (and so its aliases) a test made under `prefix` on the shared server."""
    client = qdrant_test_client(server_url, grpc=False)
    try:
        for c in client.get_collections().collections:
            if c.name.startswith(prefix + "-"):
                client.delete_collection(c.name)
    finally:
        client.close()


def kcat_config(directory: Path | None = None) -> list[str]:
    """kcat arguments for the test broker's authentication: a librdkafka config file (mode 0600)
    rather than -X flags, so the password is never on a command line."""
    sec = kafka_security()
    if sec.sasl:  # librdkafka < 2.6.1 (Debian's kcat) cannot SCRAM with Kafka >= 4.0: the test broker offers PLAIN too
        from dataclasses import replace

        sec = replace(sec, mechanism="PLAIN")
    config = sec.librdkafka_config()
    if config == {"security.protocol": "plaintext"}:
        return []
    fd, path = tempfile.mkstemp(prefix="kcat-", suffix=".conf", dir=directory)
    with os.fdopen(fd, "w") as f:
        f.write("".join(f"{k}={v}\n" for k, v in config.items()))
    return ["-F", path]


def kcat_publish(bootstrap: str, topic: str, events) -> int:
    """Publish events with kcat (librdkafka): a foreign producer. Keys are `tenant/conversation`
    and the partitioner is murmur2, so records land where memstream's own producer puts them."""
    if shutil.which("kcat") is None:
        raise Unavailable("kcat is not installed (Debian package `kcat`)")
    lines = "".join(f"{e.tenant_id}/{e.conversation_id}\t{e.model_dump_json()}\n" for e in events)
    auth = kcat_config()
    try:
        out = subprocess.run(["kcat", *auth, "-P", "-b", bootstrap, "-t", topic, "-K", "\t", "-X", "partitioner=murmur2_random"],
                             input=lines, text=True, capture_output=True, timeout=300)
    finally:
        if auth:
            os.unlink(auth[1])
    if out.returncode != 0:
        raise RuntimeError(f"kcat failed: {out.stderr}")
    return lines.count("\n")


def reset_neo4j_graph_view(uri: str, generations: range = range(1, 10)) -> None:
    """Neo4j Community has one database and the graph view is not namespaced by topic: a run
    that reuses a server starts its graph view from scratch (contract tests use generations
    >= 1e6 and are left alone)."""
    import neo4j
    from neo4j.exceptions import ClientError

    from infra.neo4j_base import drop_generation_data

    deadline = time.monotonic() + 30
    while True:
        try:
            with neo4j.GraphDatabase.driver(uri, auth=neo4j_auth()) as driver, driver.session() as s:
                for generation in generations:
                    drop_generation_data(s, "graph", generation)
                s.run("MATCH (n) WHERE (n:MemstreamGeneration OR n:MemstreamCatalogLock) AND n.view = 'graph' DETACH DELETE n").consume()
            return
        except ClientError as exc:
            # Tests that try wrong passwords on purpose make Neo4j lock logins for a few seconds
            # (dbms.security.auth_lock_time, 5 s by default), the right password's too.
            if exc.code != "Neo.ClientError.Security.AuthenticationRateLimit" or time.monotonic() > deadline:
                raise
            time.sleep(1.0)


def memstream_env(settings) -> dict[str, str]:
    """Environment variables that give a child `memstream` process these settings' log and views
    (the secrets included, as an operator's environment would hold them)."""
    env = {
        "MEMSTREAM_DATA_DIR": str(settings.data_dir), "MEMSTREAM_LOG_URL": settings.log.url, "MEMSTREAM_LOG_TOPIC": settings.log.topic,
        "MEMSTREAM_LOG_PARTITIONS": str(settings.log.partitions),
        "MEMSTREAM_VIEWS_HIERARCHY_URL": settings.views.hierarchy_url, "MEMSTREAM_VIEWS_LEXICAL_URL": settings.views.lexical_url,
        "MEMSTREAM_VIEWS_DENSE_URL": settings.views.dense_url, "MEMSTREAM_VIEWS_GRAPH_URL": settings.views.graph_url,
        "MEMSTREAM_KEYS_URL": settings.keys.url,
    }
    for var, secret in (("MEMSTREAM_LOG_KAFKA_PASSWORD", settings.log.kafka_password), ("MEMSTREAM_VIEWS_NEO4J_PASSWORD", settings.views.neo4j_password),
                        ("MEMSTREAM_VIEWS_OPENSEARCH_PASSWORD", settings.views.opensearch_password),
                        ("MEMSTREAM_VIEWS_QDRANT_API_KEY", settings.views.qdrant_api_key)):
        if secret is not None:
            env[var] = secret.get_secret_value()
    return env


def spawn_worker(settings, log_path: Path, ready_file: Path, *args: str, **env: str):
    """Start `memstream worker ARGS` for these settings (extra MEMSTREAM_* variables in `env`); it
    writes `ready_file` once its models are loaded and its views open."""
    environ = {**os.environ, **memstream_env(settings), **env, "MEMSTREAM_WORKER_READY_FILE": str(ready_file)}
    return subprocess.Popen([sys.executable, "-m", "services.cli", "worker", *args], env=environ, cwd=REPO,
                            stdout=open(log_path, "w"), stderr=subprocess.STDOUT)


def embedded_env(data_dir: Path) -> dict[str, str]:
    """The embedded default on `data_dir`: no log or view URL from the caller's environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MEMSTREAM_LOG_", "MEMSTREAM_VIEWS_"))}
    env["MEMSTREAM_DATA_DIR"] = str(data_dir)
    return env


def cli_key(data_dir: Path, role: str = "admin", tenant: str | None = None, env: dict | None = None) -> dict:
    """`memstream keys create --json` on an embedded data directory: the new key's record."""
    args = [str(Path(sys.executable).with_name("memstream")), "keys", "create", "--role", role, "--json", "--name", f"test {role}"]
    if tenant:
        args += ["--tenant", tenant]
    out = subprocess.run(args, env=env or embedded_env(data_dir), capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise RuntimeError(f"memstream keys create failed ({out.returncode}): {out.stderr}")
    return json.loads(out.stdout)


@dataclass
class Served:
    """A running `memstream serve`: its base URL, process and log; an admin key made for it
    and the ops token it was started with."""

    url: str
    proc: subprocess.Popen
    log_path: Path
    data_dir: Path
    admin_key: dict | None
    ops_token: str | None

    def __iter__(self):  # url, proc, log_path = served
        return iter((self.url, self.proc, self.log_path))

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.admin_key['key']}"} if self.admin_key else {}


@contextmanager
def memstream_serve(workdir: Path, timeout: float = 300.0, *args: str, data_dir: Path | None = None, env: dict | None = None,
                    admin_key: bool = True, scheme: str = "http", name: str = "serve") -> Iterator[Served]:
    """`memstream serve ARGS` on the embedded default (data in `data_dir`, default
    `workdir`/data; log in `workdir`/<name>.log) on a free loopback port, once /healthz answers.
    An admin key is made first (`admin_key=False`: none, e.g. with --insecure-no-auth) and a
    random ops token passed in MEMSTREAM_OPS_TOKEN. Stopped with SIGINT — uvicorn's graceful
    shutdown, so the lifespan closes the stores."""
    import pytest  # here, not at the top: benchmarks import this module too

    data_dir, log_path = data_dir or workdir / "data", workdir / f"{name}.log"
    [port] = free_ports(1)
    environ = {**embedded_env(data_dir), "MEMSTREAM_OPS_TOKEN": "ops-" + secrets.token_urlsafe(24), **(env or {})}
    key = cli_key(data_dir, env=environ) if admin_key else None
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen([str(Path(sys.executable).with_name("memstream")), "serve", "--host", "127.0.0.1", "--port", str(port), *args],
                                env=environ, stdout=log_file, stderr=subprocess.STDOUT, cwd=workdir)
    url = f"{scheme}://127.0.0.1:{port}"
    tail = lambda: log_path.read_text(errors="replace")[-4000:]  # noqa: E731
    import ssl

    insecure_tls = ssl.create_default_context()
    insecure_tls.check_hostname, insecure_tls.verify_mode = False, ssl.CERT_NONE  # only to see /healthz answer
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                pytest.fail(f"`memstream serve` exited with {proc.returncode} before /healthz answered:\n{tail()}")
            try:
                with urllib.request.urlopen(f"{url}/healthz", timeout=5, context=insecure_tls if scheme == "https" else None) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"`memstream serve` did not answer /healthz within {timeout:.0f}s:\n{tail()}")
            time.sleep(0.5)
        yield Served(url, proc, log_path, data_dir, key, environ["MEMSTREAM_OPS_TOKEN"])
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)
