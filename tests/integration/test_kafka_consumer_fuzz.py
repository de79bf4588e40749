"""The log consumers fuzzed on Kafka: hostile records written straight to the running broker
(through the log adapter, which validates nothing), interleaved with valid events, consumed by
the runner over infra/log/kafka.py inside a `memstream serve` app; the checks are the embedded
test's (tests/e2e/consumer_fuzz.py): no crashed or stuck processor, every rejected record
accounted for, nothing accepted lost. Views are the embedded ones: the consumer is under test."""

from __future__ import annotations

import uuid

import pytest

from infra.settings import Settings
from tests.e2e.consumer_fuzz import TENANT, Scenario
from tests.e2e.helpers import api_client, make_key
from tests.e2e.test_consumer_fuzz import report
from tests.integration import servers

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

EXAMPLES = 40


def test_hostile_records_written_straight_to_kafka_are_accounted_for_and_nothing_accepted_is_lost(kafka_bootstrap, tmp_path, models,
                                                                                                    request):
    topic = f"fuzz{uuid.uuid4().hex[:8]}.events"
    settings = Settings.load(data_dir=tmp_path / "kafka-fuzz", log=servers.kafka_log(kafka_bootstrap, topic=topic, partitions=4),
                             api={"rate_limit_per_second": 0})
    with api_client(settings, models, process=True) as client:
        assert client.app.state.memstream.pipeline.log.backend == "kafka"
        scenario = Scenario(client, settings, make_key(settings, "writer", TENANT, "kafka consumer fuzz"), EXAMPLES)
        scenario.run()
    report(request, f"consumer fuzz, Kafka ({kafka_bootstrap}, topic {topic})", scenario)
