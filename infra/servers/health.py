"""Readiness probe used by start.sh: polls a server with its real Python client until it answers.

usage: python health.py <kafka|neo4j|opensearch|qdrant> <address> <timeout-seconds> [pid]
  kafka:      address = host:port   -> AIOKafkaAdminClient.describe_cluster() (SASL/SCRAM as
                                       "memstream" when $KAFKA_SASL_PASSWORD is set) and
                                       find_coordinator() (creates __consumer_offsets, so the
                                       first consumer group of a test does not have to wait)
  neo4j:      address = bolt URI    -> RETURN gds.version() through the neo4j driver (as
                                       "neo4j" / $NEO4J_PASSWORD when set)
  opensearch: address = http URL    -> cluster health green/yellow through opensearch-py
  qdrant:     address = http URL?grpc_port=N -> GET /readyz ("all shards are ready"), then
                                       get_collections() over gRPC through qdrant-client (API
                                       key from $QDRANT_API_KEY when the server has one)
Exits 0 when healthy, 1 on timeout or when <pid> dies (prints the last error).
"""
import asyncio
import json
import os
import sys
import time


def alive(pid):
    if not pid:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


async def kafka_once(addr):
    import logging

    from aiokafka.admin import AIOKafkaAdminClient

    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    password = os.environ.get("KAFKA_SASL_PASSWORD")
    auth = {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "SCRAM-SHA-512", "sasl_plain_username": "memstream",
            "sasl_plain_password": password} if password else {}
    admin = AIOKafkaAdminClient(bootstrap_servers=addr, request_timeout_ms=5000, **auth)
    await admin.start()
    try:
        c = await admin.describe_cluster()
        await admin.find_coordinator("memstream-healthcheck")
        return f"cluster {c.get('cluster_id')} brokers={len(c.get('brokers', []))}"
    finally:
        await admin.close()


def kafka_probe(addr):
    return asyncio.run(asyncio.wait_for(kafka_once(addr), 10))


def neo4j_probe(addr):
    from neo4j import GraphDatabase

    password = os.environ.get("NEO4J_PASSWORD")
    with GraphDatabase.driver(addr, auth=("neo4j", password) if password else None, connection_timeout=5) as d:
        rec = d.execute_query("RETURN gds.version() AS gds").records[0]
        comp = d.execute_query("CALL dbms.components() YIELD versions RETURN versions[0] AS v").records[0]
        return f"neo4j {comp['v']} gds {rec['gds']}"


def opensearch_probe(addr):
    from opensearchpy import OpenSearch

    c = OpenSearch(hosts=[addr], timeout=5, max_retries=0)
    h = c.cluster.health()
    if h["status"] not in ("green", "yellow"):
        raise RuntimeError(f"cluster status {h['status']}")
    return f"opensearch {c.info()['version']['number']} status={h['status']}"


def qdrant_probe(addr):
    """addr = http://host:port?grpc_port=N: both APIs must answer (gRPC opens after REST, and
    later still when the server reloads collections after a restart)."""
    import urllib.request
    from urllib.parse import urlparse

    from qdrant_client import QdrantClient

    url = urlparse(addr)
    base, grpc_port = f"{url.scheme}://{url.netloc}", int(url.query.removeprefix("grpc_port=") or 6334)
    key = os.environ.get("QDRANT_API_KEY") or None
    with urllib.request.urlopen(f"{base}/readyz", timeout=5) as resp:  # answered without a key
        body = resp.read().decode()
    if "all shards are ready" not in body:
        raise RuntimeError(f"/readyz answered {body[:80]!r}")
    request = urllib.request.Request(f"{base}/", headers={"api-key": key} if key else {})
    version = json.loads(urllib.request.urlopen(request, timeout=5).read())["version"]
    client = QdrantClient(host=url.hostname, port=url.port, grpc_port=grpc_port, prefer_grpc=True, https=url.scheme == "https", api_key=key, timeout=5,
                          check_compatibility=False)
    try:
        return f"qdrant {version}, {len(client.get_collections().collections)} collections (REST and gRPC)"
    finally:
        client.close()


def main():
    name, addr, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
    pid = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    probe = {"kafka": kafka_probe, "neo4j": neo4j_probe, "opensearch": opensearch_probe, "qdrant": qdrant_probe}[name]
    deadline = time.monotonic() + timeout
    last = "no attempt"
    while time.monotonic() < deadline:
        if not alive(pid):
            print(f"{name}: process {pid} exited; last probe error: {last}")
            return 1
        try:
            print(f"{name}: healthy ({probe(addr)})")
            return 0
        except Exception as exc:  # noqa: BLE001 - any failure means "not ready yet"
            last = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        time.sleep(0.5)
    print(f"{name}: not healthy after {timeout:.0f}s; last probe error: {last}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
