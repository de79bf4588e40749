"""Bad records from foreign producers and projection failures: dead-lettered with a reason,
processing continues, nothing is lost, and dead letters can be re-driven after a fix."""

from __future__ import annotations

import json

import pytest

from schemas import events as ev
from schemas.ports.event_log import NewRecord
from schemas.ports.views import Boundary
from streams.dlq import list_dead_letters, replay_dead_letters
from streams.projections.hierarchy import HierarchyProjection
from streams.runner import ProjectionRunner
from tests.conftest import turn
from tests.e2e.helpers import make_pipeline

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]


def raw(event) -> bytes:
    return event.model_dump_json().encode()


async def test_foreign_garbage_is_dead_lettered_and_replayed_after_a_fix(tmp_path, models, monkeypatch):
    p, settings = make_pipeline(tmp_path, models)
    await p.start()
    try:
        v0 = json.loads(turn(2).model_dump_json())
        v0["schema_version"] = 0
        v0["content"] = v0.pop("text")
        key = "t1/c1"
        await p.log.append(p.config.topic, [
            NewRecord(key, raw(turn(0))),
            NewRecord(key, b"\xff\xfe not utf-8"),
            NewRecord(key, b'{"type": "TurnRecorded", "event_id": '),
            NewRecord(key, json.dumps({**json.loads(turn(9).model_dump_json()), "speaker": None}).encode()),
            NewRecord(key, json.dumps(v0).encode()),
            NewRecord(key, raw(turn(1))),
            NewRecord(key, raw(turn(1, text="same id, other words"))),  # conflicting duplicate
        ])
        await p.process_until_caught_up()
        texts = [u.text for u in p.store("hierarchy").list_units(Boundary("t1", ("c1",)), "turn")]
        assert texts == [turn(0).text, turn(1).text]
        for s in await p.status():
            assert s.lag_events == 0
        entries = await list_dead_letters(p.log, settings.dlq_topic)
        reasons = {e.offset: e.reason for e in entries}
        assert set(reasons) == {1, 2, 3, 4, 6}
        assert "not valid UTF-8" in reasons[1] and "not valid JSON" in reasons[2]
        assert "speaker" in reasons[3] and "text" in reasons[4]
        assert "already used for a different turn" in reasons[6]
        assert all(set(e.projections) == {"hierarchy", "graph", "lexical", "dense"} for e in entries if e.offset != 6)
        assert entries[0].value == b"\xff\xfe not utf-8"  # the original bytes are kept

        # Nothing is fixed yet: replay refuses records that still fail and leaves them pending.
        report = await replay_dead_letters(p.log, settings.dlq_topic)
        assert report.replayed == [] and len(report.still_invalid) == 5

        # The fix: an upcaster for the old schema version. Replay re-drives that record once.
        def v0_to_v1(d):
            d["text"] = d.pop("content")
            d["schema_version"] = 1
            return d

        monkeypatch.setitem(ev.UPCASTERS, ("TurnRecorded", 0), v0_to_v1)
        report = await replay_dead_letters(p.log, settings.dlq_topic)
        assert [e.offset for e in report.replayed] == [4]
        await p.process_until_caught_up()
        texts = [u.text for u in p.store("hierarchy").list_units(Boundary("t1", ("c1",)), "turn")]
        assert turn(2).text in texts
        entries = await list_dead_letters(p.log, settings.dlq_topic)
        assert [e.offset for e in entries if e.replayed] == [4]
        assert (await replay_dead_letters(p.log, settings.dlq_topic)).replayed == []
    finally:
        await p.close()


class _Fragile(HierarchyProjection):
    """A projection with a bug that one particular turn triggers."""

    def session_change(self, change, key, before, after, added):
        if any("explode" in t.text for t in added):
            raise RuntimeError("cannot handle this turn")
        super().session_change(change, key, before, after, added)


async def test_one_record_that_breaks_a_projection_is_isolated(tmp_path, models):
    p, settings = make_pipeline(tmp_path, models)
    await p.start_log()
    store = p.backends.open_view("hierarchy", 1)
    runner = ProjectionRunner(log_=p.log, topic=p.config.topic, dlq_topic=p.config.dlq_topic,
                              projection=_Fragile(store, p.config.policy), group="test", batch_size=100)
    try:
        events = [turn(i, text="please explode now" if i == 5 else None) for i in range(12)]
        await p.log.append(p.config.topic, [NewRecord("t1/c1", raw(e)) for e in events])
        while (await runner.step()).records:
            pass
        kept = [u.provenance.turn_start for u in store.list_units(Boundary("t1"), "turn")]
        assert len(kept) == 11
        entries = await list_dead_letters(p.log, settings.dlq_topic)
        assert [(e.offset, e.projections) for e in entries] == [(5, ["hierarchy"])]
        assert "RuntimeError: cannot handle this turn" in entries[0].reason
        assert store.positions() == {next(iter(store.positions())): 12}
    finally:
        store.close()
        await p.close()


async def test_an_exact_duplicate_after_a_conflict_is_harmless(tmp_path, models):
    """Found by fuzzing the consumers: with the original already stored, a batch holding a
    conflicting version and then an exact copy of the original dead-lettered the copy too (it
    was compared with the batch's first record, the refused conflict, not with the stored turn)."""
    p, settings = make_pipeline(tmp_path, models)
    await p.start()
    try:
        original = turn(0)
        await p.log.append(p.config.topic, [NewRecord("t1/c1", raw(original))])
        await p.process_until_caught_up()
        await p.log.append(p.config.topic, [NewRecord("t1/c1", raw(turn(0, text="another text, same id"))),
                                            NewRecord("t1/c1", raw(original))])
        await p.process_until_caught_up()
        entries = await list_dead_letters(p.log, settings.dlq_topic)
        assert [(e.offset, e.retryable) for e in entries] == [(1, False)]  # the conflict only, not the copy at offset 2
        assert [u.text for u in p.store("hierarchy").list_units(Boundary("t1", ("c1",)), "turn")] == [original.text]
    finally:
        await p.close()


async def test_a_dead_letter_fits_where_its_record_came_from(tmp_path, models):
    """Found by fuzzing the consumers on Kafka: a record of 800 kB (Kafka takes up to 1 MB) made
    a dead letter of over 1 MB (base64), which Kafka refused, so the projection could never move
    past the record. Dead letters are bounded: of a record over the size limit a prefix is kept,
    with its length and SHA-256, and it is not replayable, even forced."""
    import hashlib

    from schemas.events import MAX_ENCODED_BYTES
    from schemas.ports.event_log import LogRecord
    from streams.dlq import KEPT_PREFIX, dead_letter_records
    from streams.projections.base import DeadLetter

    huge = b'{"type": "TurnRecorded", "text": "' + b"y" * 900_000 + b'"}'
    record = LogRecord("t", 0, 7, "k" * 5000, huge, 0.0, (("h", b"v" * 100_000),))
    errors = [{"loc": ["x" * 100_000, i], "msg": "m" * 10_000, "type": "value_error"} for i in range(100)]
    [letter] = dead_letter_records([DeadLetter(record, "hierarchy", "r" * 100_000, errors)])
    assert len(letter.value) + len(letter.key) + sum(len(k) + len(v) for k, v in letter.headers) < 800_000
    body = json.loads(letter.value)
    assert body["truncated"] and body["value_bytes"] == len(huge) and body["value_sha256"] == hashlib.sha256(huge).hexdigest()
    assert not body["retryable"] and len(body["reason"]) <= 2000 and len(body["key"]) <= 1024

    p, settings = make_pipeline(tmp_path, models)
    await p.start()
    try:
        await p.log.append(p.config.topic, [NewRecord("t1/c1", huge), NewRecord("t1/c1", b" " * (MAX_ENCODED_BYTES + 1)),
                                            NewRecord("t1/c1", raw(turn(0)))])
        await p.process_until_caught_up()
        entries = await list_dead_letters(p.log, settings.dlq_topic)
        assert [(e.offset, e.truncated, len(e.value)) for e in entries] == [(0, True, KEPT_PREFIX), (1, True, KEPT_PREFIX)]
        report = await replay_dead_letters(p.log, settings.dlq_topic, force=True)
        assert report.replayed == [] and len(report.still_invalid) == 2
        assert len(p.store("hierarchy").list_units(Boundary("t1", ("c1",)), "turn")) == 1
    finally:
        await p.close()
