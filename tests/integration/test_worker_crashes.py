"""Crash safety on Kafka and the real servers: a `memstream worker` (four faust agents on Kafka,
OpenSearch, Qdrant and Neo4j/GDS, the fast model path) SIGKILLs itself at a named fault point
(MEMSTREAM_FAULT, schemas/faults.py) while it projects the ~300-event subset with forgets inside;
a new worker then catches up, and the canonical dumps of all four views equal an uninterrupted
embedded run's — nothing lost, nothing duplicated. Each kill is shown to have landed mid-work
(the views had not reached the log's end)."""

from __future__ import annotations

import asyncio
import signal
import subprocess

import pytest

from infra.registry import Registry
from infra.settings import Settings
from schemas.errors import NotFound
from schemas.ports.views import VIEW_NAMES
from tests.e2e import helpers
from tests.e2e.fast_processes import FAST, subset
from tests.e2e.helpers import assert_same_views, strip_positions
from tests.integration import servers
from tests.integration.fault_stack import distributed, stack, stop_worker, uninterrupted  # noqa: F401 (stack: the fixture)
from tests.integration.test_distributed_pipeline import lag

pytestmark = [pytest.mark.integration, pytest.mark.e2e]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    return strip_positions(uninterrupted(tmp_path_factory.mktemp("worker-crash") / "reference", subset()))


# forget-view-written: the subset's first forget (one turn) has rewritten its sessions' windows
# and episodes in a server view but not yet removed the turn from the ledger.
@pytest.mark.parametrize("point, visit", [("view-written", 5), ("forget-view-written", 1), ("position-written", 3), ("mid-batch", 1)])
def test_a_worker_killed_at_each_point_loses_and_duplicates_nothing(stack, reference, tmp_path, point, visit):  # noqa: F811
    settings = stack
    end = asyncio.run(_publish(settings, subset()))
    log_path, ready = tmp_path / "killed.log", tmp_path / "killed.ready"
    worker = servers.spawn_worker(settings, log_path, ready, MEMSTREAM_FAULT=f"{point}:{visit}", **FAST)
    try:
        code = worker.wait(300)
    except subprocess.TimeoutExpired:
        worker.kill()
        pytest.fail(f"the worker never reached {point} (visit {visit}):\n{log_path.read_text()[-3000:]}")
    text = log_path.read_text(errors="replace")
    assert code == -signal.SIGKILL and "MEMSTREAM_FAULT: killing process" in text and point in text, (code, text[-3000:])
    behind = lag(settings, end)
    assert any(v > 0 for v in behind.values()), f"the kill at {point} landed after the work was done: {behind}"

    ready = tmp_path / "restarted.ready"
    worker = servers.spawn_worker(settings, tmp_path / "restarted.log", ready, **FAST)
    try:
        helpers.until(lambda: all(v == 0 for v in lag(settings, end).values()), f"every view to catch up after the kill at {point}", 300,
                      alive=lambda: worker.poll() is not None and (tmp_path / "restarted.log").read_text()[-3000:])
    finally:
        stop_worker(worker)
    assert_same_views(reference, strip_positions(distributed(Registry(settings))), atol=1e-5)
    print(f"worker killed at {point} (visit {visit}) with views behind by {behind}; restarted, caught up, views equal")


async def _publish(settings: Settings, items: list[dict]) -> dict[int, int]:
    from services.runtime import build_pipeline

    pipeline = build_pipeline(settings, views=())
    await pipeline.start_log()
    try:
        results = await helpers.publish(pipeline, items)
        assert all(r.status == "accepted" for r in results)
        return await pipeline.log.end_offsets(settings.log.topic)
    finally:
        await pipeline.close()



def behind(settings, end: dict[int, int]) -> dict[str, int]:
    """Each view's lag; the whole log for views no worker has created yet."""
    try:
        return lag(settings, end)
    except NotFound:
        return {v: sum(end.values()) for v in VIEW_NAMES}


def doubled() -> list[dict]:
    """The subset twice over (the copy in conversations and ids of its own), so that a worker is
    busy long enough for several kills."""
    out = subset()
    for e in subset():
        e = {**e, "event_id": e["event_id"] + "-b"}
        if "conversation_id" in e:
            e["conversation_id"] += "-b"
        if "scope" in e:
            e["scope"] = {**e["scope"], **{k: v + ("-b" if k in ("conversation_id", "event_id") else "") for k, v in e["scope"].items()
                                          if k in ("conversation_id", "event_id")}}
        out.append(e)
    return out


def test_seeded_random_worker_kills_land_mid_work_and_change_nothing(stack, tmp_path):  # noqa: F811
    import random
    import time

    settings, items = stack, doubled()
    end = asyncio.run(_publish(settings, items))
    rng, kills, runs = random.Random(20261203), 0, 0
    while kills < 5:
        start = behind(settings, end)
        assert any(v > 0 for v in start.values()), f"the work was done after {kills} kills in {runs} runs; the test needs more work"
        log_path = tmp_path / f"run-{runs}.log"
        worker = servers.spawn_worker(settings, log_path, tmp_path / f"run-{runs}.ready", **FAST)
        runs += 1
        deadline = time.monotonic() + 300
        while worker.poll() is None and behind(settings, end) == start and time.monotonic() < deadline:
            time.sleep(0.2)  # until work starts (a position moves) ...
        time.sleep(rng.uniform(0.0, 1.5))  # ... then a random moment of it
        assert worker.poll() is None, log_path.read_text()[-3000:]
        worker.send_signal(signal.SIGKILL)
        worker.wait(30)
        after = behind(settings, end)
        if any(after[v] < start[v] for v in after) and any(v > 0 for v in after.values()):
            kills += 1  # moved during the run and not finished: landed mid-work
    worker = servers.spawn_worker(settings, tmp_path / "final.log", tmp_path / "final.ready", **FAST)
    try:
        helpers.until(lambda: all(v == 0 for v in behind(settings, end).values()), "every view to catch up after the kills", 300,
                      alive=lambda: worker.poll() is not None and (tmp_path / "final.log").read_text()[-3000:])
    finally:
        stop_worker(worker)
    reference = strip_positions(uninterrupted(tmp_path / "reference", items))
    assert_same_views(reference, strip_positions(distributed(Registry(settings))), atol=1e-5)
    print(f"random worker kills on Kafka: {kills} landed mid-work in {runs} runs")
