"""Changing the encoder is a replay into new views, end to end through the HTTP API.

Memory built with the default encoder (all-MiniLM-L6-v2, 384 dimensions); `memstream serve` then
restarted with the configuration naming the hashing encoder (128 dimensions, the declared fast path).
Until a replay, the dense and graph views' live generations keep their own model — new events are
projected and questions encoded with it, and answers equal those of the original deployment — and
the process says so. A replay of both views, while the API answers queries, builds generations with
the hashing encoder; after the switch every answer equals that of a deployment built with the
hashing encoder from the start, and the replaced generations' files are gone. No query fails
throughout."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from infra.models.fast import HashingEncoder
from infra.settings import Settings
from schemas.ports.views import ENCODED_VIEWS
from tests.conftest import turn
from tests.e2e.helpers import api_client, make_pipeline, publish, registry_with, sample_items

pytestmark = pytest.mark.e2e

DEFAULT = "all-MiniLM-L6-v2"
QUESTIONS = ["When does the flight to Lisbon leave?", "What does Maya eat now?", "Where did Ada take a day trip?"]
STRATEGIES = ("dense", "zero-mem")


def answers(client) -> dict:
    out = {}
    for q in QUESTIONS:
        for strategy in STRATEGIES:
            r = client.post("/v1/search", json={"tenant_id": "demo", "question": q, "strategy": strategy, "max_turns": 5})
            assert r.status_code == 200, r.text
            out[(q, strategy)] = [(e["unit_id"], {k: round(v, 4) for k, v in sorted(e["scores"].items())}) for e in r.json()["evidence"]]
    return out


def build(data_dir, models, chunks, model_overrides=None) -> None:
    """Publish and process `chunks` one after another (encoder batches follow them, and a vector's
    last digits depend on its batch, so the deployments compared are fed alike)."""
    async def go():
        pipeline, _ = make_pipeline(data_dir, models, **(model_overrides or {}))
        await pipeline.start()
        try:
            for chunk in chunks:
                await publish(pipeline, chunk)
                await pipeline.process_until_caught_up()
        finally:
            await pipeline.close()
    asyncio.run(go())


def test_switching_the_encoder_by_configuration_and_replay(tmp_path, models, capsys, monkeypatch):
    last = turn(100, tenant="demo", conv="lisbon-trip", session="s2", speaker="Ada", text="Maya found a tile museum near Alfama for Sunday")
    items = sample_items() + [last.model_dump(mode="json")]
    hashing = HashingEncoder(128)
    hashing.start()
    fast = (hashing, models[1])

    # The reference answers: the default encoder from the start, and the hashing one from the start.
    chunks = [items[:-1], items[-1:]]  # the last turn apart, as the deployment below gets it
    build(tmp_path / "default", models, chunks)
    with api_client(Settings.load(data_dir=tmp_path / "default"), models) as client:
        with_default = answers(client)
    build(tmp_path / "hashing", fast, chunks, {"encoder": {"model": "hashing-128"}})
    with api_client(Settings.load(data_dir=tmp_path / "hashing", encoder={"model": "hashing-128"}), fast) as client:
        with_hashing = answers(client)
    assert with_default != with_hashing  # else the test could not tell the models apart

    # The deployment: built with the default encoder, then restarted with the configuration changed.
    data = tmp_path / "data"
    build(data, models, chunks[:1])
    settings = Settings.load(data_dir=data, encoder={"model": "hashing-128"}, runner={"retire_grace_seconds": 0.5})
    registry = registry_with(settings, fast)
    registry._other_encoders[DEFAULT] = models[0]  # the session's loaded copy of the model the old generations name
    monkeypatch.setattr("tests.e2e.helpers.registry_with", lambda s, m: registry)
    capsys.readouterr()
    with api_client(settings, fast) as client:
        err = capsys.readouterr().err
        for view in ENCODED_VIEWS:
            assert (f"the {view} view's generation 1 was built with encoder {DEFAULT}; the configuration names hashing-128: "
                    f"it keeps {DEFAULT} until `memstream replay --projection {view}`") in err
        published = client.post("/v1/events", json=[items[-1]])  # projected with the generation's own model
        assert published.status_code == 200
        assert client.post("/v1/wait", json={"positions": published.json()["positions"], "timeout_seconds": 120}).json()["caught_up"] is True
        assert answers(client) == with_default

        failures: list[str] = []
        stop = threading.Event()

        def query_while_replaying():
            while not stop.is_set():
                for q in QUESTIONS:
                    r = client.post("/v1/search", json={"tenant_id": "demo", "question": q, "strategy": "zero-mem", "max_turns": 5})
                    if r.status_code != 200:
                        failures.append(r.text)

        reader = threading.Thread(target=query_while_replaying)
        reader.start()
        try:
            async def replay():
                pipeline, _ = make_pipeline(data, fast, encoder={"model": "hashing-128"}, runner={"retire_grace_seconds": 0.5})
                pipeline.backends._other_encoders[DEFAULT] = models[0]
                await pipeline.start_log()
                try:
                    return {view: await pipeline.replay(view) for view in ENCODED_VIEWS}
                finally:
                    await pipeline.close()
            generations = asyncio.run(replay())
        finally:
            stop.set()
            reader.join()
        assert failures == []
        assert generations == {"dense": 2, "graph": 2}
        assert {view: registry.catalog().model(view, 2) for view in ENCODED_VIEWS} == {"dense": "hashing-128", "graph": "hashing-128"}
        assert {view: registry.catalog().model(view, 1) for view in ENCODED_VIEWS} == {"dense": DEFAULT, "graph": DEFAULT}
        time.sleep(1.0)  # the readers' catalog refresh (0.2 s)
        assert answers(client) == with_hashing
        assert not any((data / "views" / view / "gen-1").exists() for view in ENCODED_VIEWS)
