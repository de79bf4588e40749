"""Shared fixtures. Models are real (loaded once per session); stores are real embedded
adapters in per-test directories, so tests never see each other's data."""

from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def locomo_path() -> Path | None:
    """The LoCoMo dev split is read from ../shared (never copied into the repo)."""
    candidates = [os.environ.get("MEMSTREAM_LOCOMO_PATH"), REPO.parent / "shared/data/locomo/locomo-dev.json",
                  Path("/work/shared/data/locomo/locomo-dev.json")]
    for c in candidates:
        if c and Path(c).is_file():
            return Path(c)
    return None


@pytest.fixture
def locomo() -> Path:
    path = locomo_path()
    if path is None:
        pytest.skip("LoCoMo dev split not found (set MEMSTREAM_LOCOMO_PATH or provide ../shared/data/locomo)")
    return path


@pytest.fixture(scope="session")
def models():
    """The real default encoder and NER model, loaded once."""
    from infra.models.flagembedding import FlagEmbeddingEncoder
    from infra.models.spacy import SpacyEntityExtractor

    enc, ner = FlagEmbeddingEncoder(), SpacyEntityExtractor()
    enc.start()
    ner.start()
    return enc, ner


@pytest.fixture
def settings(tmp_path):
    from infra.settings import Settings

    return Settings.load(data_dir=tmp_path / "data")


@pytest.fixture
def registry(settings, models):
    from infra.registry import Registry

    return Registry(settings).use_models(*models)


T0 = datetime(2025, 1, 6, 9, 0, tzinfo=timezone.utc)


def turn(i: int, *, conv: str = "c1", session: str = "s1", tenant: str = "t1", text: str | None = None, speaker: str = "Alice",
         agent: str = "agent-a", minutes: float | None = None, event_id: str | None = None, **extra):
    from schemas.events import TurnRecorded

    return TurnRecorded(
        event_id=event_id or f"{conv}-{session}-{i}", tenant_id=tenant, agent_id=agent, conversation_id=conv, session_id=session,
        turn_index=i, speaker=speaker, text=text if text is not None else f"turn {i} about topic {i % 3}",
        occurred_at=T0 + timedelta(minutes=i if minutes is None else minutes), **extra,
    )


@pytest.fixture
def anyio_backend():
    return "asyncio"


# -- integration tier: real servers ------------------------------------------------------------
def _ci() -> bool:
    return os.environ.get("CI", "").lower() in ("true", "1")


def _server(name: str):
    """Yield a running server's address: $MEMSTREAM_TEST_<NAME> (scripts/test.sh exports it), else
    one started for this session by infra/servers/start.sh (tests/integration/servers.py)."""
    from tests.integration import servers

    try:
        with getattr(servers, name)() as address:
            yield address
    except servers.Unavailable as exc:
        pytest.skip(f"INTEGRATION NOT RUN: {exc}")


@pytest.fixture(scope="session")
def kafka_bootstrap():
    """A Kafka broker's host:port."""
    yield from _server("kafka")


@pytest.fixture(scope="session")
def opensearch_url():
    """An OpenSearch URL."""
    yield from _server("opensearch")


@pytest.fixture(scope="session")
def neo4j_uri():
    """A Neo4j + GDS Bolt URI."""
    yield from _server("neo4j")


@pytest.fixture(scope="session")
def qdrant_url():
    """A Qdrant server: http://host:port?grpc_port=N."""
    yield from _server("qdrant")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """Under CI=true an integration test that skipped (no Java, no kcat, …) fails: CI must
    exercise the real servers, never report green without them."""
    report = yield
    if _ci() and report.skipped and item.get_closest_marker("integration") and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"integration test skipped under CI=true, which is a failure: {reason}"
    return report


def pytest_terminal_summary(terminalreporter):
    skipped = [r for r in terminalreporter.stats.get("skipped", []) if "integration" in getattr(r, "keywords", {})]
    if skipped:
        terminalreporter.write_sep("!", f"{len(skipped)} integration tests SKIPPED: real servers or tools were missing "
                                        "(see the reasons above; CI=true makes this a failure)", red=True, bold=True)
