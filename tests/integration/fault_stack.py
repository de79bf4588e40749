"""Shared by the fault tests on the real servers (store outages, broker restart): a fresh
deployment on Kafka + OpenSearch + Neo4j/GDS + the Qdrant server with the fast model path, and
stopping/starting one of the servers scripts/test.sh started (same data, same ports)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import uuid
from pathlib import Path

import pytest

from infra.settings import Settings
from schemas.ports.views import VIEW_NAMES
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


def stop_worker(worker: subprocess.Popen) -> None:
    """SIGTERM (faust's clean shutdown), SIGKILL if it does not exit within two minutes."""
    worker.send_signal(signal.SIGTERM)
    try:
        worker.wait(120)
    except subprocess.TimeoutExpired:
        worker.kill()


def uninterrupted(data_dir: Path, events: list[dict]) -> dict:
    """Canonical dumps of an embedded run over `events` that nothing interrupted (the fast path)."""
    from services.runtime import build_pipeline
    from tests.e2e import helpers

    async def run():
        pipeline = build_pipeline(Settings.load(data_dir=data_dir, **FAST_SETTINGS))
        await pipeline.start()
        try:
            await helpers.publish(pipeline, events)
            await pipeline.process_until_caught_up()
            return {v: pipeline.store(v).canonical_dump() for v in VIEW_NAMES}
        finally:
            await pipeline.close()
    return asyncio.run(run())


def distributed(registry) -> dict:
    """Canonical dumps of the deployment's live views."""
    from services.views import LiveViews

    live = LiveViews(registry)
    try:
        return {v: live.store(v).canonical_dump() for v in VIEW_NAMES}
    finally:
        live.close()


def end_offsets(settings: Settings) -> dict[int, int]:
    """The event topic's end offsets."""
    from infra.registry import Registry

    async def read():
        log = Registry(settings).event_log()
        await log.start()
        try:
            return await log.end_offsets(settings.log.topic)
        finally:
            await log.close()
    return asyncio.run(read())
