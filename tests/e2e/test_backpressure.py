"""Ingest backpressure through the HTTP API: past MEMSTREAM_API_MAX_BACKLOG events that the views
have not processed, POST /v1/events answers 429 backlog_full with Retry-After and appends nothing;
past half of it a tenant above its fair share is refused first; forgets always pass; once the views
catch up, publishing works again. The API serves with --no-process so that the backlog only moves
when the test drains it."""

from __future__ import annotations

import asyncio
import time

import pytest

from infra.settings import Settings
from tests.conftest import turn
from tests.e2e.helpers import api_client, bearer, make_key, make_pipeline, metric_sum

pytestmark = pytest.mark.e2e

BOUND = 40
SAMPLE = 0.1  # the ops sample the admission reads is at most this old


def batch(tenant: str, start: int, n: int = 10) -> list[dict]:
    out = []
    for i in range(start, start + n):
        ev = turn(i).model_dump(mode="json")
        out.append({**ev, "tenant_id": tenant, "event_id": f"{tenant}-{i}"})
    return out


def test_backlog_bound_fair_across_tenants_and_forgets_pass(tmp_path, models):
    settings = Settings.load(data_dir=tmp_path / "bp", api={"max_backlog": BOUND}, ops={"sample_seconds": SAMPLE})
    writer_a, writer_b = make_key(settings, "writer", "a"), make_key(settings, "writer", "b")

    with api_client(settings, models, process=False) as client:
        def publish(key, events):
            time.sleep(2 * SAMPLE)  # let the sampler see the previous publish
            return client.post("/v1/events", json=events, headers=bearer(key))

        def end_offset() -> int:
            time.sleep(2 * SAMPLE)
            return sum(v["end_offset"] for p in client.get("/v1/ops/snapshot").json()["projections"][:1]
                       for v in p["partitions"])

        for start in (0, 10, 20):  # a alone: admitted up to and past half the bound
            assert publish(writer_a, batch("a", start)).status_code == 200
        assert publish(writer_b, batch("b", 0, 5)).status_code == 200  # b's share is small: admitted
        refused = publish(writer_a, batch("a", 30))  # a is above its fair share past half the bound
        assert refused.status_code == 429, refused.text
        err = refused.json()["error"]
        assert err["code"] == "backlog_full" and "fair share" in err["message"] and "'a'" in err["message"]
        assert 1 <= int(refused.headers["retry-after"]) <= 30
        assert publish(writer_b, batch("b", 5, 5)).status_code == 200  # the backlog is now at the bound (40)
        before = end_offset()
        full = publish(writer_b, batch("b", 10, 5))
        assert full.status_code == 429 and full.json()["error"]["code"] == "backlog_full"
        assert "at the bound" in full.json()["error"]["message"]
        assert end_offset() == before  # nothing of a refused publish was appended
        forget = {"type": "ForgetRequested", "event_id": "forget-a-0", "tenant_id": "a", "requested_at": "2025-02-01T00:00:00Z",
                  "scope": {"level": "turn", "conversation_id": "c1", "event_id": "a-0"}}
        assert publish(writer_a, [forget]).status_code == 200  # a forget is never held back

        metrics = client.get("/metrics").text
        assert metric_sum(metrics, "memstream_ingest_throttled_events_total", tenant="a") == 10
        assert metric_sum(metrics, "memstream_ingest_throttled_events_total", tenant="b") == 5
        assert metric_sum(metrics, "memstream_ingest_backlog_limit_events") == BOUND
        assert metric_sum(metrics, "memstream_ingest_backlog_events") >= BOUND

        pipeline, _ = make_pipeline(settings.data_dir, models)  # the projections catch up ...

        async def drain():
            await pipeline.start()
            try:
                await pipeline.process_until_caught_up()
            finally:
                await pipeline.close()

        asyncio.run(drain())
        assert publish(writer_b, batch("b", 10, 5)).status_code == 200  # ... and ingest is admitted again
        assert publish(writer_a, batch("a", 30)).status_code == 200
