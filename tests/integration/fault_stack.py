"""Shared by the fault tests on the real servers (store outages, broker restart): a fresh
deployment on Kafka + OpenSearch + Neo4j/GDS + the Qdrant server with the fast model path, and
stopping/starting one of the servers scripts/test.sh started (same data, same ports)."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest

from infra.settings import Settings
from tests.integration import servers

REPO = servers.REPO
FAST_SETTINGS = {"encoder": {"model": "hashing"}, "ner": {"model": "lexicon"}}


def server(action: str, name: str) -> None:
    """`infra/servers/{action}.sh NAME` on the servers of this test run."""
    state = os.environ.get("MEMSTREAM_TEST_SERVERS_STATE")
    if not state:
        pytest.skip("SERVER FAULTS NOT TESTED: the servers were not started by scripts/test.sh (MEMSTREAM_TEST_SERVERS_STATE)")
    out = subprocess.run([str(REPO / "infra" / "servers" / f"{action}.sh"), name, "--data", state], capture_output=True, text=True,
                         timeout=300, cwd=REPO)
    assert out.returncode == 0, f"{action} {name}: {out.stderr[-2000:]}"


@pytest.fixture
def stack(kafka_bootstrap, opensearch_url, neo4j_uri, qdrant_url, tmp_path):
    servers.reset_neo4j_graph_view(neo4j_uri)
    prefix = f"out{uuid.uuid4().hex[:8]}"
    host = opensearch_url.removeprefix("http://")
    settings = Settings.load(
        data_dir=tmp_path / "distributed", **FAST_SETTINGS,
        log=servers.kafka_log(kafka_bootstrap, topic=f"{prefix}.events", partitions=2),
        views={"hierarchy_url": f"opensearch://{host}?prefix={prefix}", "lexical_url": f"opensearch://{host}?prefix={prefix}",
               "dense_url": servers.qdrant_view_url(qdrant_url, prefix), **servers.neo4j_views(neo4j_uri)},
        keys={"url": f"opensearch://{host}?prefix={prefix}"},
    )
    Path(settings.data_dir).mkdir(parents=True)
    yield settings
    servers.drop_qdrant_prefix(qdrant_url, prefix)
