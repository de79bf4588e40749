"""Search and answer over HTTP, and the run-time proof of zero LLM tokens outside the reader:
the reader is a local counting server, every other outbound connection is refused; ingest and
every strategy make 0 requests to it, /v1/answer exactly one."""

from __future__ import annotations


import pytest

from infra.settings import Settings
from schemas.query import STRATEGIES
from services.eval.zero_tokens import CountingReader, refuse_outbound
from tests.e2e.helpers import api_client, sample_items

pytestmark = pytest.mark.e2e


@pytest.fixture
def reader():
    r = CountingReader().start()
    yield r
    r.close()


@pytest.fixture
def client(tmp_path, models, reader):
    settings = Settings.load(data_dir=tmp_path / "q", reader={"url": reader.url, "model": "counting"})
    with refuse_outbound({reader.address}) as refused:
        with api_client(settings, models) as c:
            c.refused = refused
            yield c


def ingest(client) -> None:
    r = client.post("/v1/events", json=sample_items())
    assert r.status_code == 200
    assert client.post("/v1/wait", json={"positions": r.json()["positions"], "timeout_seconds": 120}).status_code == 200


def search(client, question, **kw):
    return client.post("/v1/search", json={"question": question, "tenant_id": "demo", "conversation_id": "lisbon-trip", **kw})


def test_every_strategy_answers_with_provenance_and_zero_tokens(client, reader):
    ingest(client)
    for strategy in STRATEGIES:
        r = search(client, "Which museum will Maya visit on Sunday?", strategy=strategy, max_turns=6)
        if r.status_code == 400 and "not available" in r.text:
            pytest.fail(f"strategy {strategy} is not implemented")
        assert r.status_code == 200, (strategy, r.text)
        body = r.json()
        assert body["llm_tokens"] == 0 and body["strategy"] == strategy
        turns = [t for e in body["evidence"] for t in e["turns"]]
        assert len({t["turn_id"] for t in turns}) == 6  # the budget is filled exactly
        assert all(t["event_id"].startswith("lisbon-trip-") and t["offset"] >= 0 for t in turns)
        assert body["timings_ms"]["total"] > 0 and body["backends"]["hierarchy"]
    assert reader.counter.snapshot()["requests"] == 0  # ingest + every strategy: no LLM call
    a = client.post("/v1/answer", json={"question": "Which museum will Maya visit on Sunday?", "tenant_id": "demo",
                                         "conversation_id": "lisbon-trip", "max_turns": 6})
    assert a.status_code == 200, a.text
    assert reader.counter.snapshot()["requests"] == 1  # exactly one: the reader
    body = a.json()
    assert body["answer"] and body["llm_tokens"] == reader.counter.snapshot()["tokens"]
    assert client.refused == []


def test_bad_search_requests_get_clear_4xx(client):
    ingest(client)
    fresh = client.post("/v1/search", json={"question": "x", "tenant_id": "nobody"})  # a new tenant's first recall: empty, not an error
    assert fresh.status_code == 200 and fresh.json()["evidence"] == [] and "holds no memory yet" in fresh.json()["notes"][0]
    for bad in ({"question": "", "tenant_id": "demo"}, {"question": "   ", "tenant_id": "demo"},
                {"question": "x", "tenant_id": "demo", "strategy": "magic"}, {"question": "x", "tenant_id": "demo", "k": 10_000},
                {"question": "x", "tenant_id": "demo", "max_turns": 0}, {"tenant_id": "demo"}):
        r = client.post("/v1/search", json=bad)
        assert r.status_code == 422, (bad, r.text)
        assert r.json()["error"]["code"] == "invalid_request"
    r = search(client, "x", since="2030-01-01T00:00:00Z", until="2020-01-01T00:00:00Z")  # an empty range: no evidence
    assert r.status_code == 200 and r.json()["evidence"] == [] and "since" in r.json()["notes"][0]


def test_empty_memory_returns_empty_evidence(client):
    ingest(client)
    r = client.post("/v1/search", json={"question": "anything?", "tenant_id": "demo", "conversation_id": "no-such-conversation"})
    assert r.status_code == 200 and r.json()["evidence"] == []


def test_answer_without_reader_is_a_clear_error(tmp_path, models):
    settings = Settings.load(data_dir=tmp_path / "noreader")
    with api_client(settings, models) as c:
        ingest(c)
        r = c.post("/v1/answer", json={"question": "Where?", "tenant_id": "demo"})
        assert r.status_code == 400 and "MEMSTREAM_READER_URL" in r.json()["error"]["message"]
