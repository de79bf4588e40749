"""Helpers for end-to-end tests: a pipeline on a temporary data directory with the shared
(real) models, the sample conversation, and canonical dumps of every view."""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from infra.registry import Registry
from infra.settings import Settings
from schemas.ports.views import VIEW_NAMES
from services.runtime import build_pipeline

SAMPLE = Path(__file__).resolve().parents[2] / "services/sample/conversation.jsonl"


def sample_items() -> list[dict]:
    return [json.loads(line) for line in SAMPLE.read_text().splitlines() if line.strip()]


def registry_with(settings: Settings, models) -> Registry:
    """A registry that hands out the session's already loaded models."""
    return Registry(settings).use_models(*models)


def make_key(settings: Settings, role: str = "admin", tenant: str | None = None, name: str = "test") -> dict:
    """A key made the way `memstream keys create` makes it (straight onto the control topic):
    the KeyChange as a dict, with `key` (the secret) and `control_offset`."""
    import asyncio

    from services import keys
    from streams.keys import KeyRing

    async def make():
        pipeline = build_pipeline(settings, views=())
        await pipeline.start_log()
        try:
            ring = KeyRing(pipeline.log, settings.log.topic)
            await ring.ensure_topic()
            await ring.refresh(force=True)
            return (await keys.create(ring, role, tenant, name)).as_dict()
        finally:
            await pipeline.close()

    return asyncio.run(make())


def bearer(key: dict | str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key['key'] if isinstance(key, dict) else key}"}


@contextmanager
def api_client(settings: Settings, models, *, key: str | dict | None = "admin", process: bool = True):
    """The HTTP API through its ASGI app, lifespan (and in-process projections) running. Its
    requests carry an admin key made for it (`key="admin"`), the given key, or none (`key=None`);
    `client.admin_key` is the admin key either way."""
    from fastapi.testclient import TestClient

    from services.api import create_app

    admin = make_key(settings, "admin", name="api_client admin")
    given = admin if key == "admin" else key
    with TestClient(create_app(settings, registry=registry_with(settings, models), process=process),
                    headers=bearer(given) if given else {}) as client:
        client.admin_key = admin
        yield client


def make_pipeline(data_dir: Path, models, **settings_overrides):
    settings = Settings.load(data_dir=data_dir, **settings_overrides)
    return build_pipeline(settings, registry=registry_with(settings, models)), settings


async def publish(pipeline, items: list[dict]):
    return await pipeline.publisher().publish_items(items)


def dumps(pipeline) -> dict:
    return {view: pipeline.store(view).canonical_dump() for view in VIEW_NAMES}


def strip_positions(obj):
    """Log positions legitimately differ between two logs holding the same events."""
    if isinstance(obj, dict):
        return {k: strip_positions(v) for k, v in obj.items() if k not in ("log_positions", "partition", "offset")}
    if isinstance(obj, list):
        return [strip_positions(v) for v in obj]
    return obj


def assert_same_views(a: dict, b: dict, atol: float = 1e-6) -> None:
    """Equal unit ids, texts, provenance, edges and weights; vectors within `atol`."""
    _compare(a, b, atol, "views")


def _compare(a, b, atol, path):
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), f"{path}: keys differ: {set(a) ^ set(b)}"
        for k in a:
            _compare(a[k], b[k], atol, f"{path}.{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), f"{path}: lengths differ ({len(a)} vs {len(b)})"
        if a and all(isinstance(x, float) for x in a):
            np.testing.assert_allclose(np.array(a), np.array(b), atol=atol, rtol=0, err_msg=path)
        else:
            for i, (x, y) in enumerate(zip(a, b)):
                _compare(x, y, atol, f"{path}[{i}]")
    elif isinstance(a, float):
        assert abs(a - b) <= atol, f"{path}: {a} != {b}"
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


async def publish_events(settings, models, events) -> dict[int, int]:
    """Append typed events to the log `settings` names (e.g. Kafka); returns its end offsets."""
    pipeline, _ = make_pipeline(settings.data_dir, models, log=settings.log.model_dump(), views=settings.views.model_dump(),
                                keys=settings.keys.model_dump())
    await pipeline.start_log()
    try:
        await pipeline.publisher().publish(events)
        return await pipeline.log.end_offsets(settings.log.topic)
    finally:
        await pipeline.close()


def until(predicate, what: str = "the condition", timeout: float = 60.0, *, alive=None, interval: float = 0.1):
    """Poll `predicate` until it returns something truthy and return that. `alive()` may return
    a reason to fail at once (e.g. a subprocess that exited)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if alive is not None and (reason := alive()):
            pytest.fail(f"{reason} (waiting for {what})")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(interval)


def metric_samples(text: str):
    """(sample name, labels, value) of a Prometheus exposition, parsed by prometheus-client."""
    return [(s.name, s.labels, s.value) for family in text_string_to_metric_families(text) for s in family.samples]


def metric_sum(text: str, name: str, **labels) -> float:
    """Sum of the samples of `name` whose labels include `labels`; fails if there is none."""
    values = [v for n, have, v in metric_samples(text) if n == name and all(have.get(k) == x for k, x in labels.items())]
    assert values, f"no {name}{labels} in /metrics"
    return sum(values)
