"""The log consumers fuzzed on the embedded SQLite log with the real runner and projections
(tests/e2e/consumer_fuzz.py says what is written and what is checked), and the same checks shown
to fail on a consumer that loses a turn or drops a record without a dead letter."""

from __future__ import annotations

import pytest

from infra.settings import Settings
from tests.e2e.consumer_fuzz import TENANT, Scenario
from tests.e2e.helpers import api_client, make_key

pytestmark = pytest.mark.e2e

EXAMPLES = 50


def test_hostile_records_on_the_log_are_accounted_for_and_nothing_accepted_is_lost(tmp_path, models, request):
    settings = Settings.load(data_dir=tmp_path / "fuzz", api={"rate_limit_per_second": 0})
    with api_client(settings, models, process=True) as client:
        scenario = Scenario(client, settings, make_key(settings, "writer", TENANT, "consumer fuzz"), EXAMPLES)
        scenario.run()
    report(request, "consumer fuzz, embedded log", scenario)


def test_the_checks_fail_on_a_consumer_that_loses_turns_or_swallows_records(tmp_path, models, monkeypatch):
    import streams.runner
    from streams.projections.hierarchy import HierarchyProjection

    settings = Settings.load(data_dir=tmp_path / "doubles", api={"rate_limit_per_second": 0})
    with api_client(settings, models, process=True) as client:
        writer = make_key(settings, "writer", TENANT, "consumer fuzz doubles")

        # Hostile records skipped without a dead letter (the runner writes none): unaccounted.
        with monkeypatch.context() as m:
            m.setattr(streams.runner, "dead_letter_records", lambda dead: [])
            with pytest.raises(AssertionError, match="has no dead letter"):
                Scenario(client, settings, writer, 5).run(shrink=False)

        # The hierarchy view silently drops turns that mention a kayak: lost.
        handle = HierarchyProjection.handle

        def lossy(self, records):
            steps, consumed = handle(self, records)
            for step in steps:
                step.change.put_turns[:] = [t for t in step.change.put_turns if "kayak" not in t.text]
            return steps, consumed

        with monkeypatch.context() as m:
            m.setattr(HierarchyProjection, "handle", lossy)
            with pytest.raises(AssertionError, match="hierarchy lost"):
                Scenario(client, settings, writer, 20).run(shrink=False)


def report(request, title: str, scenario: Scenario) -> None:
    terminal = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if terminal is not None:
        with capture.global_and_fixture_disabled():
            terminal.write_line("")
            terminal.write_sep("-", title)
            for line in scenario.tally.lines():
                terminal.write_line(line)
