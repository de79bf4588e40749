"""Readiness probe used by start.sh: polls a server with its real Python client until it answers.

usage: python health.py <kafka|neo4j|opensearch> <address> <timeout-seconds> [pid]
  kafka:      address = host:port   -> AIOKafkaAdminClient.describe_cluster() and
                                       find_coordinator() (creates __consumer_offsets, so the
                                       first consumer group of a test does not have to wait)
  neo4j:      address = bolt URI    -> RETURN gds.version() through the neo4j driver
  opensearch: address = http URL    -> cluster health green/yellow through opensearch-py
Exits 0 when healthy, 1 on timeout or when <pid> dies (prints the last error).
"""
import asyncio
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
    admin = AIOKafkaAdminClient(bootstrap_servers=addr, request_timeout_ms=5000)
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

    with GraphDatabase.driver(addr, auth=None, connection_timeout=5) as d:
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


def main():
    name, addr, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
    pid = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    probe = {"kafka": kafka_probe, "neo4j": neo4j_probe, "opensearch": opensearch_probe}[name]
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
