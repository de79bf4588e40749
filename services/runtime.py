"""Composition root: settings -> registry -> pipeline. The only place entry points get their
objects from, so the CLI, the HTTP server and the eval harness are wired identically."""

from __future__ import annotations

import asyncio
import gc
import logging
import os

from infra.registry import Registry
from infra.settings import Settings
from schemas.ports.views import VIEW_NAMES, ViewName
from streams.pipeline import Pipeline, PipelineConfig


def pipeline_config(settings: Settings) -> PipelineConfig:
    return PipelineConfig(
        topic=settings.log.topic,
        dlq_topic=settings.dlq_topic,
        partitions=settings.log.partitions,
        batch_size=settings.runner.batch_size,
        idle_poll=settings.runner.idle_poll_seconds,
        policy=settings.hierarchy.policy(),
        speaker_prefix=settings.hierarchy.speaker_prefix,
        speaker_as_entity=settings.runner.speaker_as_entity,
        intake_retention_seconds=settings.log.intake_retention_seconds,
        retire_grace_seconds=settings.runner.retire_grace_seconds,
        retention_sweep_seconds=settings.retention.sweep_seconds,
    )


def build_pipeline(settings: Settings, views: tuple[ViewName, ...] = VIEW_NAMES, registry: Registry | None = None, metrics=None) -> Pipeline:
    return Pipeline(registry or Registry(settings), pipeline_config(settings), views=views, metrics=metrics)


def settle_heap() -> None:
    """Call once a long-running process has loaded its models and opened its stores. The objects
    made so far (models, vocabularies, libraries: millions) move to the collector's permanent
    generation: without that every full collection walks them all — 0.4–0.7 s pauses of a serving
    process under ingest, measured with `memstream bench load`, each one a search's p99."""
    gc.collect()
    gc.freeze()


async def keep_heap_settled(stop: asyncio.Event, every: float = 30.0) -> None:
    """A serving process's query caches (corpora, graph snapshots, matrices: millions of objects
    as conversations multiply) made full collections of up to 1 s under ingest. What has survived
    the young collections since the last call joins the permanent generation, so a full collection
    walks only what is newer. Objects left there are still freed by reference counting when a
    cache drops them (the caches hold no cycles); only cyclic garbage that already reached the old
    generation would stay, and the young collection made first removes what is cyclic among the
    new objects."""
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), every)
        except asyncio.TimeoutError:
            gc.collect(1)
            gc.freeze()


def configure_logging(verbose: bool = False) -> None:
    level = logging.DEBUG if verbose else getattr(logging, os.environ.get("MEMSTREAM_LOG_LEVEL", "WARNING").upper(), logging.WARNING)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    for noisy in ("httpx", "urllib3", "transformers", "FlagEmbedding", "filelock"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    quiet_credential_loggers()


def quiet_credential_loggers() -> None:
    """Never below INFO, whatever the level: at DEBUG aiokafka prints every request it sends,
    SASL/PLAIN's (user, password) bytes included (tests/integration/test_secrets_never_logged.py).
    A filter rather than a level, so that a framework that resets levels (faust) cannot undo it."""
    logger = logging.getLogger("aiokafka.conn")
    if not any(getattr(f, "memstream", False) for f in logger.filters):
        class _AtLeastInfo(logging.Filter):
            memstream = True

            def filter(self, record: logging.LogRecord) -> bool:
                return record.levelno >= logging.INFO

        logger.addFilter(_AtLeastInfo())
