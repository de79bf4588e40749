"""Forgetting reaches every byte on the servers: Kafka (events, dead letters, intake), OpenSearch
(hierarchy, lexical, the data keys), Qdrant (dense), Neo4j + GDS (graph). A canary planted in the
forgotten turns — published by memstream and by a foreign producer (kcat, through the intake
topic) — is found by a byte-level scan of the servers' data directories before the forget and in
none of them after it (OpenSearch after its stated erasure bound), nor the destroyed keys' bytes;
no record still held opens to it; a replay, a re-publish of the forgotten event and `dlq replay`
bring nothing back; the views are exactly those of an embedded pipeline that only ever saw the
other conversation."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from infra.settings import Settings
from schemas.events import decode_event
from schemas.ports.keystore import key_id
from schemas.ports.views import VIEW_NAMES
from tests.canary import key_needles, new_canary, open_everything, scan
from tests.e2e import helpers
from tests.e2e.test_forgetting import conversation
from tests.integration import servers

pytestmark = [pytest.mark.integration, pytest.mark.e2e]
REPO = servers.REPO


@pytest.fixture
def stack(kafka_bootstrap, opensearch_url, neo4j_uri, qdrant_url, tmp_path):
    servers.reset_neo4j_graph_view(neo4j_uri)
    prefix = f"fg{uuid.uuid4().hex[:8]}"
    host = opensearch_url.removeprefix("http://")
    settings = Settings.load(
        data_dir=tmp_path / "distributed",
        log=servers.kafka_log(kafka_bootstrap, topic=f"{prefix}.events", partitions=2, intake_retention_seconds=5),
        views={"hierarchy_url": f"opensearch://{host}?prefix={prefix}", "lexical_url": f"opensearch://{host}?prefix={prefix}",
               "dense_url": servers.qdrant_view_url(qdrant_url, prefix), **servers.neo4j_views(neo4j_uri)},
        keys={"url": f"opensearch://{host}?prefix={prefix}"},
    )
    Path(settings.data_dir).mkdir(parents=True)
    yield settings
    servers.drop_qdrant_prefix(qdrant_url, prefix)


def data_dirs() -> list[Path]:
    dirs = {name: servers.server_data_dir(name) for name in ("kafka", "opensearch", "neo4j", "qdrant")}
    missing = [n for n, d in dirs.items() if d is None]
    if missing:
        pytest.fail(f"the data directories of {missing} are unknown: run through scripts/test.sh (or set MEMSTREAM_TEST_<NAME>_DATA)")
    return list(dirs.values())


def test_a_forgotten_conversation_leaves_no_byte_on_any_server(stack, models, tmp_path, kafka_bootstrap):
    from fastapi.testclient import TestClient

    from services.api import create_app

    settings = stack
    canary = new_canary("d")
    victim, kept = conversation("victim", canary, n=6), conversation("kept", None, n=6)
    foreign = json.loads(json.dumps(victim[4]))
    foreign.update(event_id="victim-foreign", text=f"a foreign producer repeats {canary} once more")
    ready, log_path = tmp_path / "worker.ready", tmp_path / "worker.log"
    worker = servers.spawn_worker(settings, log_path, ready)
    admin = helpers.make_key(settings)
    try:
        helpers.until(ready.exists, "the worker to load its models", 300, alive=lambda: worker.poll() is not None and log_path.read_text()[-2000:])
        with TestClient(create_app(settings, process=False, registry=helpers.registry_with(settings, models)),
                        headers=helpers.bearer(admin)) as api:
            r = api.post("/v1/events", json=victim + kept)
            assert r.status_code == 200, r.text
            servers.kcat_publish(kafka_bootstrap, settings.log.topic + ".intake", [decode_event(json.dumps(foreign).encode())])
            end = helpers.until(lambda: (e := asyncio.run(helpers.publish_events(settings, models, []))) and sum(e.values()) == 13 and e,
                                "the relay to seal the foreign event", 120)
            assert api.post("/v1/wait", json={"positions": end, "timeout_seconds": 240}).json()["caught_up"] is True
            keystore = api.app.state.memstream.pipeline.keystore
            held = keystore.get([key_id("t1", "victim", e["event_id"]) for e in [*victim, foreign]])
            assert len(held) == 7
            dirs = data_dirs()
            assert scan(dirs, [canary.encode()]), "positive control: the scan must see the canary before the forget"

            forget = api.post("/v1/forget", json={"tenant_id": "t1", "conversation_id": "victim"})
            assert forget.status_code == 202, forget.text
            assert api.post("/v1/wait", json={"positions": forget.json()["positions"], "timeout_seconds": 240}).json()["caught_up"] is True

            def gone(when: str) -> None:
                bound = 120  # OpenSearch's deferred expunge (retention-lease sync ~30 s, then a merge), Kafka's intake retention
                deadline = time.monotonic() + bound
                while found := scan(dirs, [canary.encode(), *key_needles([k.secret for k in held.values()])]):
                    assert time.monotonic() < deadline, f"{when}: still on disk after {bound}s: {found[:5]}"
                    time.sleep(2)
                records = asyncio.run(_all_records(settings))
                assert open_everything(records, keystore, [canary]) == [], when
                r = api.post("/v1/search", json={"question": f"secret code word {canary}", "tenant_id": "t1"})
                assert canary not in r.text, when

            gone("after the forget")
            again = api.post("/v1/events", json=[victim[3]])
            assert again.status_code == 409, again.text
            gone("after re-publishing")
            from services.runtime import build_pipeline

            async def replay():
                p = build_pipeline(settings, registry=helpers.registry_with(settings, models))
                await p.start_log()
                try:
                    return [await p.replay(v) for v in VIEW_NAMES]
                finally:
                    await p.close()

            asyncio.run(replay())
            gone("after a replay")
            out = subprocess.run([sys.executable, "-m", "services.cli", "dlq", "replay"], env={**os.environ, **servers.memstream_env(settings)},
                                 cwd=REPO, capture_output=True, text=True, timeout=300)
            assert out.returncode == 0, out.stderr
            gone("after dlq replay")
            live = api.app.state.memstream.views
            distributed = {v: live.store(v).canonical_dump() for v in VIEW_NAMES}  # the test's own prefix: only its data
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(120)
        except subprocess.TimeoutExpired:
            worker.kill()

    async def embedded():
        p, _ = helpers.make_pipeline(tmp_path / "embedded", models)
        await p.start()
        try:
            await helpers.publish(p, kept)
            await p.process_until_caught_up()
            return {v: p.store(v).canonical_dump() for v in VIEW_NAMES}
        finally:
            await p.close()

    helpers.assert_same_views(helpers.strip_positions(asyncio.run(embedded())), helpers.strip_positions(distributed), atol=1e-5)


async def _all_records(settings):
    from services.runtime import build_pipeline

    p = build_pipeline(settings, views=())
    await p.start_log()
    try:
        out = []
        for topic in (settings.log.topic, settings.dlq_topic):  # the intake topic is erased below its relayed records
            for part, end in (await p.log.end_offsets(topic)).items():
                out.extend(await p.log.read(topic, part, 0, max_records=end + 1))
        return out
    finally:
        await p.close()
