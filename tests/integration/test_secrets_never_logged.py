"""No secret reaches a log: every memstream component runs at DEBUG against the real servers with
authentication on — Kafka SASL/SCRAM, Neo4j, OpenSearch basic auth, a Qdrant API key, the
reader's API key, the ops token, API keys — plus wrong-password paths (Kafka, Neo4j, Qdrant, an
unknown API key), each credential a unique string; then every byte each process logged is
searched for every secret. A marker planted where DEBUG logging must show it (the topic name,
a request path) proves the logs were really read.

The servers keep their own passwords (scripts/test.sh makes fresh ones per run): those are
among the secrets searched for."""

from __future__ import annotations

import json
import secrets as pysecrets
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest

from schemas.security import token
from services.eval.zero_tokens import CountingReader
from tests.e2e.helpers import sample_items
from tests.integration import servers

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).with_name("memstream")


def unique(name: str) -> str:
    return f"{name}-{pysecrets.token_urlsafe(18)}"


def run(args: list[str], env: dict, log: Path, **kw) -> subprocess.CompletedProcess:
    out = subprocess.run([str(BIN), "-v", *args], env=env, capture_output=True, text=True, timeout=300, **kw)
    log.write_text(out.stderr)  # what the process logged; stdout is its answer
    return out


def wait_http(url: str, proc: subprocess.Popen, log: Path, headers: dict | None = None, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, f"{proc.args} exited:\n{log.read_text(errors='replace')[-3000:]}"
        try:
            if httpx.get(url, headers=headers or {}, timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, f"{url} did not answer:\n{log.read_text(errors='replace')[-3000:]}"
        time.sleep(0.5)


def test_no_secret_is_ever_logged(tmp_path, kafka_bootstrap, opensearch_url, neo4j_uri, qdrant_url):
    kafka, neo = servers.kafka_security(), servers.neo4j_auth()
    if not (kafka.sasl and neo):
        pytest.fail("the test servers must run with authentication on (scripts/test.sh starts them so)")
    marker = f"marker{uuid.uuid4().hex[:12]}"
    secret = {name: unique(name) for name in ("opensearch", "qdrant", "reader", "ops", "wrong-kafka", "wrong-neo4j", "wrong-qdrant")}
    secret.update(kafka=kafka.password, neo4j=neo[1], **{"wrong-api-key": token("f" * 16, pysecrets.token_urlsafe(32))})
    host = opensearch_url.removeprefix("http://")
    env = {
        **servers.embedded_env(tmp_path / "data"), "MEMSTREAM_LOG_LEVEL": "DEBUG",
        "MEMSTREAM_LOG_URL": f"kafka://{kafka.username}@{kafka_bootstrap}", "MEMSTREAM_LOG_KAFKA_PASSWORD": secret["kafka"],
        "MEMSTREAM_LOG_TOPIC": f"{marker}.events", "MEMSTREAM_LOG_PARTITIONS": "2",
        "MEMSTREAM_VIEWS_HIERARCHY_URL": f"opensearch://memstream@{host}?prefix={marker}",
        "MEMSTREAM_VIEWS_LEXICAL_URL": f"opensearch://memstream@{host}?prefix={marker}",
        "MEMSTREAM_VIEWS_OPENSEARCH_PASSWORD": secret["opensearch"],
        "MEMSTREAM_VIEWS_DENSE_URL": servers.qdrant_view_url(qdrant_url, marker), "MEMSTREAM_VIEWS_QDRANT_API_KEY": secret["qdrant"],
        "MEMSTREAM_VIEWS_GRAPH_URL": f"neo4j://{neo[0]}@{neo4j_uri.split('://', 1)[1]}", "MEMSTREAM_VIEWS_NEO4J_PASSWORD": secret["neo4j"],
        "MEMSTREAM_OPS_TOKEN": secret["ops"], "MEMSTREAM_READER_API_KEY": secret["reader"],
    }
    env = {k: v for k, v in env.items() if not k.startswith(("MEMSTREAM_TEST_", "KAFKA_SASL", "NEO4J_PASSWORD"))}
    logs: dict[str, Path] = {}
    servers.reset_neo4j_graph_view(neo4j_uri)

    counting = CountingReader().start()
    try:
        env["MEMSTREAM_READER_URL"] = counting.url
        # 1. the first admin key, made by the CLI straight on the control topic
        logs["keys create"] = tmp_path / "keys.log"
        made = run(["keys", "create", "--role", "admin", "--json"], env, logs["keys create"])
        assert made.returncode == 0, made.stderr[-3000:]
        admin = json.loads(made.stdout)["key"]
        secret["admin-key"] = admin
        headers = {"Authorization": f"Bearer {admin}"}

        # 2. a worker and a query service, at DEBUG
        wport, sport = servers.free_ports(2)
        logs["worker"], logs["serve"] = tmp_path / "worker.log", tmp_path / "serve.log"
        worker = subprocess.Popen([str(BIN), "-v", "worker", "--metrics-port", str(wport)], env=env, stdout=open(logs["worker"], "w"),
                                  stderr=subprocess.STDOUT)
        serve = subprocess.Popen([str(BIN), "-v", "serve", "--no-process", "--port", str(sport)], env=env, stdout=open(logs["serve"], "w"),
                                 stderr=subprocess.STDOUT)
        base = f"http://127.0.0.1:{sport}"
        try:
            wait_http(f"{base}/healthz", serve, logs["serve"])
            wait_http(f"http://127.0.0.1:{wport}/metrics", worker, logs["worker"], {"Authorization": f"Bearer {secret['ops']}"})
            published = httpx.post(f"{base}/v1/events", json=sample_items(), headers=headers, timeout=60)
            assert published.status_code == 200, published.text
            waited = httpx.post(f"{base}/v1/wait", json={"positions": published.json()["positions"], "timeout_seconds": 240},
                                headers=headers, timeout=300)
            assert waited.json().get("caught_up") is True, (waited.text, logs["worker"].read_text(errors="replace")[-3000:])
            for path in ("/v1/search", "/v1/answer"):
                r = httpx.post(f"{base}{path}", json={"question": "Where are Ada and Maya going?", "tenant_id": "demo"}, headers=headers, timeout=120)
                assert r.status_code == 200, r.text
            assert counting.counter.requests == 1  # the reader was called, with its key
            assert httpx.get(f"{base}/metrics", headers={"Authorization": f"Bearer {secret['ops']}"}, timeout=30).status_code == 200
            assert httpx.post(f"{base}/dashboard/session", json={"token": secret["ops"]}, timeout=30).status_code == 200
            assert httpx.get(f"{base}/v1/status", headers={"Authorization": f"Bearer {secret['wrong-api-key']}"}, timeout=30).status_code == 401
            assert httpx.get(f"{base}/v1/no-such-{marker}", headers=headers, timeout=30).status_code == 404  # in the access log
        finally:
            for proc in (serve, worker):
                proc.send_signal(signal.SIGINT if proc is serve else signal.SIGTERM)
            for proc in (serve, worker):
                try:
                    proc.wait(120)
                except subprocess.TimeoutExpired:
                    proc.kill()
    finally:
        counting.close()

    # 3. SASL/PLAIN sends the password itself (aiokafka would print it at DEBUG): still not logged
    logs["kafka sasl/plain"] = tmp_path / "plain.log"
    plain = run(["status", "--settle", "0"], {**env, "MEMSTREAM_LOG_URL": env["MEMSTREAM_LOG_URL"] + "?sasl_mechanism=PLAIN"}, logs["kafka sasl/plain"])
    assert plain.returncode == 0, plain.stderr[-2000:]

    # 4. wrong passwords: each fails with a message naming what to check, never the secret
    wrong_kafka = run(["status", "--settle", "0"], {**env, "MEMSTREAM_LOG_KAFKA_PASSWORD": secret["wrong-kafka"]}, tmp_path / "wrong-kafka.log")
    logs["wrong kafka password"] = tmp_path / "wrong-kafka.log"
    assert wrong_kafka.returncode != 0 and "MEMSTREAM_LOG_KAFKA_PASSWORD" in wrong_kafka.stderr, wrong_kafka.stderr[-2000:]
    wrong_neo = run(["search", "Where are they going?", "--tenant", "demo"], {**env, "MEMSTREAM_VIEWS_NEO4J_PASSWORD": secret["wrong-neo4j"]},
                    tmp_path / "wrong-neo4j.log")
    logs["wrong neo4j password"] = tmp_path / "wrong-neo4j.log"
    assert wrong_neo.returncode != 0 and "MEMSTREAM_VIEWS_NEO4J_PASSWORD" in wrong_neo.stderr, wrong_neo.stderr[-2000:]
    secret["right-qdrant"] = unique("right-qdrant")
    with servers.private_qdrant(api_key=secret["right-qdrant"]) as (keyed, _, _):
        wrong_qdrant = run(["search", "Where are they going?", "--tenant", "demo"],
                           {**env, "MEMSTREAM_VIEWS_DENSE_URL": servers.qdrant_view_url(keyed, marker),
                            "MEMSTREAM_VIEWS_QDRANT_API_KEY": secret["wrong-qdrant"]}, tmp_path / "wrong-qdrant.log")
        logs["wrong qdrant key"] = tmp_path / "wrong-qdrant.log"
        assert wrong_qdrant.returncode != 0 and "MEMSTREAM_VIEWS_QDRANT_API_KEY" in wrong_qdrant.stderr, wrong_qdrant.stderr[-2000:]
    secret = {k: v for k, v in secret.items() if v}

    # 5. every byte logged, searched for every secret; the marker proves the logs were read
    texts = {name: path.read_bytes() for name, path in logs.items()}
    found = {(name, s) for name, data in texts.items() for s, value in secret.items() if value.encode() in data}
    assert not found, f"secrets found in logs: {sorted(found)}"
    for name in ("worker", "serve"):
        assert marker.encode() in texts[name], f"the marker is not in the {name} log: was it read at DEBUG? {texts[name][-1500:]!r}"
    assert all(len(data) > 0 for data in texts.values()), {k: len(v) for k, v in texts.items()}
    assert sum(b"DEBUG" in data for data in texts.values()) >= 3  # they did log at DEBUG
    servers.drop_qdrant_prefix(qdrant_url, marker)
