"""Helpers for end-to-end tests: a pipeline on a temporary data directory with the shared
(real) models, the sample conversation, and canonical dumps of every view."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from infra.registry import Registry
from infra.settings import Settings
from schemas.ports.views import VIEW_NAMES
from services.runtime import build_pipeline
from streams.ingest import Publisher

SAMPLE = Path(__file__).resolve().parents[2] / "services/sample/conversation.jsonl"


def sample_items() -> list[dict]:
    return [json.loads(line) for line in SAMPLE.read_text().splitlines() if line.strip()]


def make_pipeline(data_dir: Path, models, **settings_overrides):
    settings = Settings.load(data_dir=data_dir, **settings_overrides)
    reg = Registry(settings)
    reg._encoder, reg._extractor = models
    return build_pipeline(settings, registry=reg), settings


async def publish(pipeline, items: list[dict]):
    return await Publisher(pipeline.log, pipeline.config.topic).publish_items(items)


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
