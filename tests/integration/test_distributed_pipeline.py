"""The distributed pipeline end to end on the real servers: events published through Kafka (the
log adapter, and kcat as a foreign producer), projected by a `memstream worker` process (faust)
into OpenSearch, Neo4j + GDS and the Qdrant server, then compared with the embedded pipeline
fed the same events, queried, paused/resumed through the control topic, and replayed with an
alias swap while queries keep running."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from infra.registry import Registry
from infra.settings import Settings
from schemas.errors import TransientError
from schemas.events import decode_event
from schemas.ports.views import VIEW_NAMES
from schemas.query import SearchRequest
from services.query.service import QueryService
from services.runtime import build_pipeline
from services.views import LiveViews
from tests.e2e import helpers
from tests.e2e.helpers import assert_same_views, make_pipeline, publish, sample_items, strip_positions
from tests.integration import servers

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

REPO = servers.REPO
QUESTION = "Where did they plan to travel?"


def lag(settings: Settings, end: dict[int, int], views=VIEW_NAMES) -> dict[str, int]:
    """Lag read from each view's own positions, in its own store."""
    live = LiveViews(Registry(settings))
    try:
        return {v: sum(max(0, off - live.store(v).positions().get(p, 0)) for p, off in end.items()) for v in views}
    except TransientError:  # e.g. an index the worker just created is still recovering its shard
        return {v: -1 for v in views}
    finally:
        live.close()


def until(predicate, what: str, worker: subprocess.Popen | None = None, log: Path | None = None):
    def alive():
        if worker is not None and worker.poll() is not None:
            return f"the worker exited ({worker.returncode}):\n{log.read_text()[-3000:] if log else ''}"

    return helpers.until(predicate, what, 300.0, alive=alive, interval=0.3)


OPS_TOKEN = "ops-token-" + uuid.uuid4().hex


def scrape(port: int) -> dict[tuple[str, str], float]:
    """(metric, projection) -> value summed over the other labels."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers={"Authorization": f"Bearer {OPS_TOKEN}"})
    text = urllib.request.urlopen(request, timeout=10).read().decode()
    out: dict[tuple[str, str], float] = {}
    for name, labels, value in helpers.metric_samples(text):
        key = (name, labels.get("projection", ""))
        out[key] = out.get(key, 0.0) + value
    return out


@pytest.fixture
def stack(kafka_bootstrap, opensearch_url, neo4j_uri, qdrant_url, tmp_path):
    servers.reset_neo4j_graph_view(neo4j_uri)
    prefix = f"e2e{uuid.uuid4().hex[:8]}"
    host = opensearch_url.removeprefix("http://")
    yield Settings.load(
        data_dir=tmp_path / "distributed",
        log=servers.kafka_log(kafka_bootstrap, topic=f"{prefix}.events", partitions=4),
        views={"hierarchy_url": f"opensearch://{host}?prefix={prefix}", "lexical_url": f"opensearch://{host}?prefix={prefix}",
               "dense_url": servers.qdrant_view_url(qdrant_url, prefix), **servers.neo4j_views(neo4j_uri)},
        keys={"url": f"opensearch://{host}?prefix={prefix}"},  # shared by the worker, the publishers and the query side
    )
    servers.drop_qdrant_prefix(qdrant_url, prefix)


def test_kafka_faust_workers_match_the_embedded_pipeline_and_replay_swaps_aliases(stack, models, tmp_path, kafka_bootstrap):
    settings = stack
    Path(settings.data_dir).mkdir(parents=True)
    items = sample_items()
    events = [decode_event(json.dumps(i).encode()) for i in items]
    metrics_port = servers.free_ports(1)[0]
    ready = tmp_path / "worker.ready"
    log_path = tmp_path / "worker.log"
    worker = servers.spawn_worker(settings, log_path, ready, "--metrics-port", str(metrics_port), MEMSTREAM_OPS_SAMPLE_SECONDS="0.3",
                                  MEMSTREAM_OPS_TOKEN=OPS_TOKEN)
    env = {**os.environ, **servers.memstream_env(settings)}
    try:
        until(ready.exists, "the worker to load its models", worker=worker, log=log_path)

        def publish_own(evs):
            return helpers.publish_events(settings, models, evs)

        asyncio.run(publish_own(events[:10]))
        # A foreign producer publishes plain events to the intake topic; memstream seals them onto the event topic.
        assert servers.kcat_publish(kafka_bootstrap, settings.log.topic + ".intake", events[10:]) == len(events) - 10
        # The worker's intake relay moves them (sealed) onto the event topic, then erases the intake.
        end = until(lambda: (e := asyncio.run(publish_own([])))  and sum(e.values()) == len(events) and e,
                    "the intake relay to seal the foreign events onto the event topic", worker=worker, log=log_path)
        until(lambda: all(v == 0 for v in lag(settings, end).values()), "the workers to project every event", worker=worker, log=log_path)

        # Pause one projection through the control topic (CLI); the others keep going.
        cli = [sys.executable, "-m", "services.cli"]
        subprocess.run([*cli, "pause", "lexical", "--reason", "test"], env=env, cwd=REPO, check=True, capture_output=True)
        time.sleep(1.0)  # the workers read the control topic before their next batch
        extra = [e.model_copy(update={"event_id": e.event_id + "-late", "turn_index": e.turn_index + 100}) for e in events[:2]]
        end = asyncio.run(publish_own(extra))
        until(lambda: (lg := lag(settings, end)) and lg["hierarchy"] == 0 and lg["graph"] == 0 and lg["dense"] == 0, "unpaused views",
              worker=worker, log=log_path)
        assert lag(settings, end)["lexical"] == 2
        m = until(lambda: (s := scrape(metrics_port)).get(("memstream_projection_lag_events", "lexical")) == 2
                  and s.get(("memstream_projection_lag_events", "graph")) == 0 and s, "worker /metrics lag")
        assert m.get(("memstream_projection_paused", "lexical")) == 1 and m.get(("memstream_projection_lag_events", "graph")) == 0, m
        assert m.get(("memstream_projection_records_total", "graph"), 0) == len(events) + 2, m
        subprocess.run([*cli, "resume", "lexical"], env=env, cwd=REPO, check=True, capture_output=True)
        until(lambda: lag(settings, end)["lexical"] == 0, "lexical to catch up after resume", worker=worker, log=log_path)
        until(lambda: scrape(metrics_port).get(("memstream_projection_lag_events", "lexical")) == 0, "worker /metrics lag 0")
        with pytest.raises(urllib.error.HTTPError) as refused:  # the worker's /metrics wants the ops token too
            urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10)
        assert refused.value.code == 401

        # Read-your-writes through the API of a query service that runs no projection (the
        # worker does): POST /v1/wait reads the positions from the views' stores.
        from fastapi.testclient import TestClient

        from services.api import create_app

        admin = helpers.make_key(settings)
        with TestClient(create_app(settings, process=False, registry=helpers.registry_with(settings, models)),
                        headers=helpers.bearer(admin)) as api:
            late = [e.model_copy(update={"event_id": e.event_id + "-api", "turn_index": e.turn_index + 200}) for e in events[:3]]
            published = api.post("/v1/events", json=[json.loads(e.model_dump_json()) for e in late])
            assert published.status_code == 200, published.text
            waited = api.post("/v1/wait", json={"positions": published.json()["positions"], "timeout_seconds": 120})
            assert waited.json().get("caught_up") is True, waited.text
            assert all(v == 0 for v in lag(settings, asyncio.run(publish_own([]))).values())
        extra += late
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            code = worker.wait(120)
        except subprocess.TimeoutExpired:
            worker.kill()
            code = "killed"
    assert code == 0, f"the worker did not shut down cleanly ({code}):\n{log_path.read_text()[-3000:]}"

    # Same events through the embedded pipeline: the views must hold the same thing.
    async def embedded_dumps():
        pipeline, _ = make_pipeline(tmp_path / "embedded", models)
        await pipeline.start()
        try:
            await publish(pipeline, [json.loads(e.model_dump_json()) for e in [*events, *extra]])
            await pipeline.process_until_caught_up()
            return {v: pipeline.store(v).canonical_dump() for v in VIEW_NAMES}
        finally:
            await pipeline.close()

    registry = helpers.registry_with(settings, models)
    live = LiveViews(registry, refresh_seconds=0.05)
    distributed = {v: live.store(v).canonical_dump() for v in VIEW_NAMES}
    assert_same_views(strip_positions(asyncio.run(embedded_dumps())), strip_positions(distributed), atol=1e-5)

    # Queries are served by the engines, and say so.
    service = QueryService(live, registry.encoder(), registry.extractor())
    service.start()
    tenant, conversation = events[0].tenant_id, events[0].conversation_id
    request = SearchRequest(question=QUESTION, tenant_id=tenant, conversation_id=conversation)
    first = service.search(request)
    assert first.evidence
    assert {first.backends[v] for v in ("lexical", "graph", "dense")} == {"opensearch", "neo4j", "qdrant"}

    # Replay every view on the servers while queries keep running: no query fails, and the
    # answers afterwards are the same (rebuilt views equal the incremental ones).
    stop, failures, done = threading.Event(), [], [0]

    def query_loop():
        while not stop.is_set():
            try:
                service.search(request)
                done[0] += 1
            except Exception as exc:  # noqa: BLE001 - counted
                failures.append(repr(exc))

    async def replay_all():
        pipeline = build_pipeline(settings, registry=registry)
        await pipeline.start_log()
        try:
            return {v: await pipeline.replay(v) for v in ("hierarchy", "lexical", "graph", "dense")}
        finally:
            await pipeline.close()

    thread = threading.Thread(target=query_loop)
    thread.start()
    try:
        generations = asyncio.run(replay_all())
    finally:
        stop.set()
        thread.join()
    assert failures == [] and done[0] > 0
    assert all(g == 2 for g in generations.values()), generations
    time.sleep(0.2)  # LiveViews re-reads the catalog every 50 ms
    rebuilt = {v: live.store(v).canonical_dump() for v in VIEW_NAMES}
    assert_same_views(strip_positions(distributed), strip_positions(rebuilt), atol=1e-5)
    # Same content, but not necessarily the same ranking: OpenSearch's BM25 statistics count
    # deleted documents until segments merge, and the incremental index upserted open windows.
    after = service.search(request)
    assert after.evidence and after.evidence[0].unit_id == first.evidence[0].unit_id
    live.close()

    # The query service in Kafka mode (`serve --no-process`): its dashboard and /metrics see the
    # views the workers wrote, and pause/resume go through the control topic.
    from fastapi.testclient import TestClient

    from services.api import create_app

    with TestClient(create_app(settings, process=False, registry=registry), headers=helpers.bearer(helpers.make_key(settings))) as client:
        snap = client.get("/v1/ops/snapshot").json()
        assert snap["mode"] == "kafka" and snap["log_backend"] == "kafka"
        by_name = {p["name"]: p for p in snap["projections"]}
        assert {by_name[v]["backend"] for v in ("hierarchy", "lexical", "graph", "dense")} == {"opensearch", "neo4j", "qdrant"}
        assert all(p["lag_events"] == 0 and p["generation"] == 2 for p in snap["projections"])
        text = client.get("/metrics").text
        assert re.search(r'memstream_projection_lag_events\{partition="0",projection="graph"\} 0\.0', text)
        assert client.post("/v1/admin/projections/graph/pause", json={"reason": "maintenance"}).json()["paused"] is True
        assert client.post("/v1/admin/projections/graph/resume").json()["paused"] is False
        assert client.get("/dashboard").status_code == 200
