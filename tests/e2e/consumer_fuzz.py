"""The log consumers fuzzed: what tests/e2e/test_consumer_fuzz.py (embedded SQLite log) and
tests/integration/test_kafka_consumer_fuzz.py (Kafka) share.

One hypothesis example is a batch: valid turns (and the odd valid forget of a conversation
nobody uses) interleaved with hostile records (tests/hostile.py) that are written straight to
the event log, with no validation on the way — a foreign producer; conflicting and exact
duplicates of valid turns; hostile records written to the control topic, which every process
reads for keys and pause/resume; and hostile items posted to POST /v1/events next to valid ones
(items the edge guard refuses as a whole go in a request of their own). A `memstream serve` app
with its in-process runner and projections does the rest. Afterwards:

- no processor crashed or got stuck: POST /v1/wait on the log's end offsets answers 200, the
  runner task is alive, and every view's lag is 0;
- every rejected record is accounted for: each hostile record on the log has a dead letter from
  every projection whose reason is the decoder's own, each conflicting duplicate a non-retryable
  one, each hostile API item an item error (or its request a 400 with nothing appended);
- nothing accepted is lost: every valid turn — written straight to the log or accepted by the
  API — is in every view (hierarchy, graph, lexical, dense) with its first text, and none is
  dead-lettered; exact duplicates are neither dead-lettered nor stored twice;
- `memstream dlq replay` (dry run) goes through every dead letter without raising and replays
  none of them: none decodes.
"""

from __future__ import annotations

import base64
import itertools
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from hypothesis import HealthCheck, Phase, given, settings, strategies as st

from schemas.control import control_topic
from schemas.errors import InvalidEvent
from schemas.events import (
    MAX_ENCODED_BYTES,
    ForgetRequested,
    ForgetScope,
    TurnRecorded,
    decode_event,
    encode_event,
    partition_key,
    validate_event,
)
from schemas.ports.event_log import NewRecord
from schemas.ports.views import VIEW_NAMES
from services.http_guard import UnsafeJSON, loads
from streams.dlq import KEPT_PREFIX, MAX_REASON_CHARS, DeadLetterEntry, list_dead_letters, replay_dead_letters
from tests.e2e.helpers import bearer
from tests.hostile import json_values, mutated_events, records

TENANT = "fz"
CONVERSATIONS = ("c1", "c2", "c3")
WORDS = ("Alice", "Bob", "pottery", "Lisbon", "kayak", "class", "on", "Monday", "the", "trip", "met", "Carol", "in", "Paris")
MAX_RECORD = 900_000  # under Kafka's default message.max.bytes (1 MB): the broker itself refuses bigger records


def _reason(value: bytes) -> str | None:
    """The decoder's reason for refusing a record; None if it decodes."""
    try:
        decode_event(value)
    except InvalidEvent as exc:
        return str(exc)
    return None


def _invalid_item(raw) -> bool:
    """Refused by POST /v1/events with TENANT's writer key (which fills in a missing tenant_id)."""
    if isinstance(raw, dict) and "tenant_id" not in raw:
        raw = {**raw, "tenant_id": TENANT}
    try:
        validate_event(raw)
    except InvalidEvent:
        return True
    return False


def _edge_safe(raw) -> bool:
    try:
        loads(json.dumps(raw))
    except (UnsafeJSON, ValueError):
        return False
    return True


# Records near Kafka's message limit: their dead letters (base64, 4/3 of the size) must still fit.
near_the_limit = st.sampled_from([b"x" * 800_000, b'{"type": "TurnRecorded", "text": "' + b"y" * 780_000 + b'"}'])
hostile_records = st.one_of(records.filter(lambda v: len(v) < MAX_RECORD and _reason(v) is not None), near_the_limit)
hostile_items = st.one_of(mutated_events(), json_values).filter(lambda v: len(json.dumps(v)) < MAX_RECORD and _invalid_item(v))
turn_specs = st.fixed_dictionaries({
    "conversation": st.sampled_from(CONVERSATIONS), "session": st.sampled_from(["s1", "s2"]), "minute": st.integers(0, 10_000),
    "words": st.lists(st.sampled_from(WORDS), min_size=1, max_size=12), "speaker": st.sampled_from(["Alice", "Bob"]),
})
garbage_keys = st.one_of(st.just(""), st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=24),
                         st.sampled_from([f"{TENANT}/{c}" for c in CONVERSATIONS]))


@st.composite
def batches(draw):
    """Log entries in the order they are appended: ("turn", spec) | ("forget", None) |
    ("hostile", bytes, key) | ("conflict", i) | ("duplicate", i), where i names an earlier turn;
    plus the control-topic records and the API's items."""
    entries: list[tuple] = []
    turns = 0
    for _ in range(draw(st.integers(2, 20))):
        kind = draw(st.sampled_from(["turn", "turn", "hostile", "hostile", "hostile", "conflict", "duplicate", "forget"]))
        if kind == "turn":
            entries.append(("turn", draw(turn_specs)))
            turns += 1
        elif kind == "hostile":
            entries.append(("hostile", draw(hostile_records), draw(garbage_keys)))
        elif kind == "forget":
            entries.append(("forget", None))
        elif turns:
            entries.append((kind, draw(st.integers(0, turns - 1))))
    control = draw(st.lists(hostile_records, max_size=3))
    api_turns = draw(st.lists(turn_specs, max_size=3))
    api_hostile = draw(st.lists(hostile_items, max_size=6))
    return entries, control, api_turns, api_hostile


@dataclass
class Tally:
    """How every fuzzed record and item was accounted for."""

    examples: int = 0
    records: Counter = field(default_factory=Counter)   # by kind and outcome
    reasons: Counter = field(default_factory=Counter)   # dead-letter reasons, by their first words
    seconds: float = 0.0

    def lines(self) -> list[str]:
        out = [f"{self.examples} batches, {sum(self.records.values())} records and items in {self.seconds:.1f} s"]
        out += [f"  {n:>5}  {what}" for what, n in sorted(self.records.items())]
        out.append("  dead-letter reasons of the hostile records:")
        out += [f"  {n:>5}  {why}" for why, n in self.reasons.most_common()]
        return out


REASON_CLASSES = ("record is not valid UTF-8", "record is not valid JSON", "record is not JSON memstream accepts: the document is nested",
                  "record is not JSON memstream accepts: an integer literal", "record is not JSON memstream accepts: a string holds a lone surrogate",
                  "record is not JSON memstream accepts", "unknown event type", "an event must be a JSON object")


def _reason_class(reason: str) -> str:
    for prefix in REASON_CLASSES:
        if reason.startswith(prefix):
            return prefix
    if reason.startswith("record is ") and "bytes; the limit" in reason:
        return "record over the size limit"
    return "field errors (" + reason.split(":")[0][:40] + ": ...)"


class Scenario:
    """Drives one app (a TestClient on `create_app(..., process=True)`) with a writer key of TENANT."""

    runs = itertools.count(1)  # event ids of several scenarios on one app never meet

    def __init__(self, client, settings, writer_key: dict, examples: int):
        self.run_id = next(self.runs)
        self.client = client
        self.settings = settings
        self.writer = bearer(writer_key)
        self.examples = examples
        self.tally = Tally()
        self.accepted: dict[str, TurnRecorded] = {}   # every valid turn the log holds, by event id
        self.positions: dict[tuple[int, int], str] = {}  # (partition, offset) -> what was written there
        self.dead_letters: dict[tuple[int, int], DeadLetterEntry] = {}  # every one seen so far, by origin
        self._dlq_read: dict[int, int] = {}
        self._n = 0

    @property
    def state(self):
        return self.client.app.state.memstream

    def _call(self, fn, *args):
        return self.client.portal.call(fn, *args)

    def _turn(self, spec: dict, tag: str) -> TurnRecorded:
        self._n += 1
        return TurnRecorded(
            event_id=f"{tag}{self.run_id}-{self._n}", tenant_id=TENANT, agent_id="fuzzer", conversation_id=spec["conversation"],
            session_id=spec["session"], turn_index=self._n, speaker=spec["speaker"], text=" ".join(spec["words"]),
            occurred_at=datetime(2026, 1, 1, tzinfo=timezone.utc) + timedelta(minutes=spec["minute"]),
        )

    def run(self, *, shrink: bool = True) -> None:
        t0 = time.perf_counter()
        phases = list(Phase) if shrink else [Phase.explicit, Phase.generate]
        fuzz = settings(max_examples=self.examples, derandomize=True, database=None, deadline=None, print_blob=False,
                        suppress_health_check=list(HealthCheck), phases=phases)
        fuzz(given(batch=batches())(self.one_batch))()
        self.tally.seconds = time.perf_counter() - t0
        self.check_replay()

    # -- one example ----------------------------------------------------------------------------
    def one_batch(self, batch) -> None:
        entries, control, api_turns, api_hostile = batch
        self.tally.examples += 1
        log, topic = self.state.pipeline.log, self.settings.log.topic
        written: list[tuple[NewRecord, tuple]] = []
        turns: list[TurnRecorded] = []
        for entry in entries:
            kind = entry[0]
            if kind == "turn":
                turns.append(self._turn(entry[1], "log"))
                e = turns[-1]
                written.append((NewRecord(partition_key(TENANT, e.conversation_id), encode_event(e)), ("turn", e)))
            elif kind == "hostile":
                written.append((NewRecord(entry[2], entry[1]), ("hostile", entry[1])))
            elif kind == "forget":
                self._n += 1
                forget = ForgetRequested(event_id=f"forget{self.run_id}-{self._n}", tenant_id=TENANT, requested_at=datetime(2026, 6, 1, tzinfo=timezone.utc),
                                         scope=ForgetScope(level="conversation", conversation_id="nobody-uses-this"))
                written.append((NewRecord(partition_key(TENANT, "nobody-uses-this"), encode_event(forget)), ("forget", forget)))
            else:
                original = turns[entry[1]]
                copy = original if kind == "duplicate" else original.model_copy(update={"text": original.text + " (rewritten)"})
                written.append((NewRecord(partition_key(TENANT, copy.conversation_id), encode_event(copy)), (kind, copy)))
        appended = self._call(log.append, topic, [r for r, _ in written])
        for a, (_, what) in zip(appended, written):
            self.positions[(a.partition, a.offset)] = what[0]
        if control:
            self._call(log.append, control_topic(topic), [NewRecord("fuzz", v, partition=0) for v in control])
            self.tally.records["control topic: hostile record, ignored"] += len(control)
            self._call(log.append, self.settings.dlq_topic, [NewRecord("fuzz", v) for v in control])
            self.tally.records["dead-letter topic: hostile record, skipped by the listing"] += len(control)

        api_accepted = self.post_items(api_turns, api_hostile)

        end = self._call(log.end_offsets, topic)
        waited = self.client.post("/v1/wait", json={"positions": {str(p): o for p, o in end.items()}, "timeout_seconds": 120},
                                  headers=self.writer)  # also proves the key ring survived the control-topic records
        assert waited.json().get("caught_up") is True, f"the projections did not reach the log's end: {waited.text}"
        assert self.state.runner_task is not None and not self.state.runner_task.done(), "the runner task ended"
        status = self.client.get("/v1/status", headers=self.writer).json()["views"]
        assert all(v["lag_events"] == 0 for v in status), status

        dead = self._call(self.new_dead_letters)
        for a, (record, what) in zip(appended, written):
            kind, pos = what[0], (a.partition, a.offset)
            if kind == "hostile":
                letter = dead.get(pos)
                assert letter is not None, f"hostile record at {pos} has no dead letter: {record.value[:200]!r}"
                assert set(letter.projections) == set(VIEW_NAMES), letter.projections
                reason = _reason(record.value)
                assert letter.reason == reason or (len(reason) > MAX_REASON_CHARS and letter.reason[:-1] == reason[:len(letter.reason) - 1])
                if len(record.value) <= MAX_ENCODED_BYTES:
                    assert letter.value == record.value and not letter.truncated
                else:  # kept: a prefix (a dead letter must fit where the record came from)
                    assert letter.truncated and letter.value == record.value[:KEPT_PREFIX]
                self.tally.records["log: hostile record, dead-lettered by all 4 projections with the decoder's reason"] += 1
                self.tally.reasons[_reason_class(letter.reason)] += 1
            elif kind == "conflict":
                letter = dead.get(pos)
                assert letter is not None and "already used for a different turn" in letter.reason and not letter.retryable, letter
                assert set(letter.projections) == set(VIEW_NAMES)
                self.tally.records["log: conflicting duplicate (same id, other text), dead-lettered, not retryable"] += 1
            else:
                assert pos not in dead, f"a valid {kind} was dead-lettered: {dead[pos].reason}"
                self.tally.records[{"turn": "log: valid turn, in every view", "duplicate": "log: exact duplicate, stored once",
                                    "forget": "log: valid forget (of an unused conversation), applied"}[kind]] += 1
        for e in turns + api_accepted:
            self.accepted[e.event_id] = e
        self.check_views()

    async def new_dead_letters(self) -> dict[tuple[int, int], DeadLetterEntry]:
        """The dead letters appended since the last call, by origin (partition, offset) on the
        source topic — what list_dead_letters gives, read incrementally (it reads the whole topic,
        which grows with every example); the run ends by comparing the two."""
        log, dlq = self.state.pipeline.log, self.settings.dlq_topic
        out: dict[tuple[int, int], DeadLetterEntry] = {}
        for p, end in (await log.end_offsets(dlq)).items():
            offset = self._dlq_read.get(p, 0)
            while offset < end:
                batch = await log.read(dlq, p, offset, max_records=100)
                if not batch:
                    break
                for rec in batch:
                    try:
                        body = json.loads(rec.value)
                        origin = (body["source_topic"], body["partition"], body["offset"])
                    except (ValueError, KeyError, TypeError, RecursionError):
                        continue  # one of the hostile records this run wrote to the dead-letter topic itself
                    if origin[0] != self.settings.log.topic:
                        continue
                    e = out.setdefault(origin[1:], DeadLetterEntry(*origin, body.get("key"), body["reason"], body.get("errors", []), [],
                                                                   base64.b64decode(body["value_b64"]), [], False, body.get("retryable", True),
                                                                   body.get("truncated", False)))
                    e.projections.append(body["projection"])
                offset = batch[-1].offset + 1
            self._dlq_read[p] = offset
        self.dead_letters.update(out)
        return out

    def post_items(self, api_turns: list[dict], api_hostile: list) -> list[TurnRecorded]:
        """Valid turns and hostile items in one batch (the edge-safe ones), the rest in a request of
        its own; returns the turns the API accepted."""
        valid = [self._turn(spec, "api") for spec in api_turns]
        safe = [h for h in api_hostile if _edge_safe(h)]
        unsafe = [h for h in api_hostile if not _edge_safe(h)]
        items = [json.loads(e.model_dump_json()) for e in valid] + safe
        accepted: list[TurnRecorded] = []
        if items:
            r = self.client.post("/v1/events", json=items, headers=self.writer)
            assert r.status_code in (200, 207, 422), r.text
            body = r.json()
            results = body["items"] if "items" in body else body["error"]["details"]
            assert [i["index"] for i in results] == list(range(len(items)))
            for i, result in enumerate(results):
                if i < len(valid):
                    assert result["status"] == "accepted", result
                    assert self.positions.setdefault((result["partition"], result["offset"]), "turn") == "turn"
                    accepted.append(valid[i])
                    self.tally.records["API: valid turn, accepted, in every view"] += 1
                else:
                    assert result["status"] == "rejected" and result["code"] in (403, 422) and result["errors"], result
                    self.tally.records[f"API: hostile item, rejected with an item error ({result['code']})"] += 1
        if unsafe:
            before = self._call(self.state.pipeline.log.end_offsets, self.settings.log.topic)
            body = "\n".join(json.dumps(h) for h in unsafe).encode()
            r = self.client.post("/v1/events", content=body, headers={**self.writer, "content-type": "application/x-ndjson"})
            assert r.status_code == 400 and r.json()["error"]["code"] == "bad_request", r.text
            assert self._call(self.state.pipeline.log.end_offsets, self.settings.log.topic) == before  # nothing appended
            self.tally.records["API: hostile item the edge refuses (NaN, deep, long integers, lone surrogates): 400, nothing appended"] += len(unsafe)
        return accepted

    def check_views(self) -> None:
        """Every accepted turn, in every view, with its first text."""
        by_conv: dict[str, list[TurnRecorded]] = {}
        for e in self.accepted.values():
            by_conv.setdefault(e.conversation_id, []).append(e)
        for view in VIEW_NAMES:
            store = self.state.views.store(view)
            for conv, evs in by_conv.items():
                found = store.find_turns(TENANT, conv, [e.event_id for e in evs])
                missing = [e.event_id for e in evs if e.event_id not in found]
                assert not missing, f"{view} lost {len(missing)} accepted turns of {conv}: {missing[:5]}"
                assert all(found[e.event_id].text == e.full_text for e in evs), view

    def check_replay(self) -> None:
        """`memstream dlq replay --dry-run` and GET /v1/dead-letters over everything the run left on
        the dead-letter topic, foreign records included."""
        report = self._call(lambda log, topic: replay_dead_letters(log, topic, dry_run=True), self.state.pipeline.log, self.settings.dlq_topic)
        assert report.replayed == [], [e.origin for e in report.replayed]
        pending = self._call(list_dead_letters, self.state.pipeline.log, self.settings.dlq_topic)
        assert len(report.still_invalid) == len(pending) > 0
        listed = {(e.partition, e.offset): sorted(e.projections) for e in pending if e.source_topic == self.settings.log.topic}
        assert listed == {origin: sorted(set(e.projections)) for origin, e in self.dead_letters.items()}
        origins, cursor = [], None
        while True:  # the admin's view (the app's default key), page by page
            listed = self.client.get("/v1/dead-letters", params={"limit": 50, **({"cursor": cursor} if cursor else {})})
            assert listed.status_code == 200, listed.text
            origins += [d["origin"] for d in listed.json()["dead_letters"]]
            cursor = listed.json()["next_cursor"]
            if cursor is None:
                break
        assert sorted(origins) == sorted(e.origin for e in pending) and len(origins) == len(set(map(tuple, origins)))
