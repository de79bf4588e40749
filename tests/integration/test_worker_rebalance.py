"""Rebalances on real Kafka: two `memstream worker --projection VIEW` processes share one
consumer group while events keep arriving; one joins mid-stream and the other leaves mid-stream.
The view — lexical on OpenSearch, dense on the Qdrant server, whose writers then share one
generation — must end up exactly as the embedded pipeline builds it from the same events
(nothing lost, nothing applied twice), with every partition's position at the log's end."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time
import uuid

import pytest

from infra.registry import Registry
from infra.settings import Settings
from schemas.errors import TransientError
from services.views import LiveViews
from tests.conftest import turn
from tests.e2e.helpers import assert_same_views, make_pipeline, publish, publish_events, strip_positions
from tests.integration import servers

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

def events(start: int, stop: int):
    # Four conversations (so four partitions in play), turns interleaved.
    return [turn(i // 4, conv=f"c{i % 4}", text=f"turn {i // 4} of conversation {i % 4} about topic {i % 7} and kayak {i % 5}")
            for i in range(start, stop)]


def view_lag(settings: Settings, view: str, end: dict[int, int]) -> int:
    live = LiveViews(Registry(settings))
    try:
        positions = live.store(view).positions()
    except TransientError:
        return -1
    finally:
        live.close()
    return sum(max(0, off - positions.get(p, 0)) for p, off in end.items())


@pytest.fixture(params=["lexical", "dense"])
def view_settings(request, kafka_bootstrap, tmp_path):
    """(view, settings): the view on its server, the log on Kafka; the server's data is dropped after."""
    prefix = f"rb{uuid.uuid4().hex[:8]}"
    log = servers.kafka_log(kafka_bootstrap, topic=f"{prefix}.events", partitions=4)
    if request.param == "lexical":
        host = request.getfixturevalue("opensearch_url").removeprefix("http://")
        yield "lexical", Settings.load(data_dir=tmp_path / "dist", log=log, views={"lexical_url": f"opensearch://{host}?prefix={prefix}"})
    else:
        qdrant_url = request.getfixturevalue("qdrant_url")
        yield "dense", Settings.load(data_dir=tmp_path / "dist", log=log, views={"dense_url": servers.qdrant_view_url(qdrant_url, prefix)})
        servers.drop_qdrant_prefix(qdrant_url, prefix)


def test_workers_joining_and_leaving_the_group_neither_lose_nor_duplicate(view_settings, tmp_path, models):
    view, settings = view_settings
    workers: dict[str, subprocess.Popen] = {}

    def start(name: str) -> None:
        ready = tmp_path / f"{name}.ready"
        workers[name] = servers.spawn_worker(settings, tmp_path / f"{name}.log", ready, "--projection", view,
                                             MEMSTREAM_RUNNER_BATCH_SIZE="5")
        deadline = time.monotonic() + 180
        while not ready.exists():
            assert workers[name].poll() is None, (tmp_path / f"{name}.log").read_text()[-3000:]
            assert time.monotonic() < deadline, f"worker {name} did not start"
            time.sleep(0.2)

    def stop(name: str) -> None:
        w = workers.pop(name)
        w.send_signal(signal.SIGTERM)
        assert w.wait(120) == 0, (tmp_path / f"{name}.log").read_text()[-3000:]

    def append(evs):
        return publish_events(settings, models, evs)

    all_events = events(0, 120)
    try:
        start("a")
        asyncio.run(append(all_events[:40]))
        time.sleep(2)
        start("b")  # joins: the group rebalances while records flow
        for chunk in (all_events[40:60], all_events[60:80]):
            asyncio.run(append(chunk))
            time.sleep(1)
        stop("a")  # leaves: b takes over a's partitions
        end = asyncio.run(append(all_events[80:]))
        deadline = time.monotonic() + 300
        while view_lag(settings, view, end) != 0:
            assert workers["b"].poll() is None, (tmp_path / "b.log").read_text()[-3000:]
            assert time.monotonic() < deadline, f"the {view} view did not catch up"
            time.sleep(0.5)
    finally:
        for name in list(workers):
            stop(name)

    async def embedded():
        pipeline, _ = make_pipeline(tmp_path / "embedded", models)
        await pipeline.start()
        try:
            await publish(pipeline, [json.loads(e.model_dump_json()) for e in all_events])
            await pipeline.process_until_caught_up()
            return pipeline.store(view).canonical_dump()
        finally:
            await pipeline.close()

    live = LiveViews(Registry(settings))
    try:
        store = live.store(view)
        assert {p: o for p, o in store.positions().items() if o} == {p: o for p, o in end.items() if o}
        distributed = store.canonical_dump()
    finally:
        live.close()
    assert_same_views(strip_positions({view: asyncio.run(embedded())}), strip_positions({view: distributed}), atol=1e-5)
