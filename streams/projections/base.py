"""What every projection shares: decoding records, dead-lettering what cannot be processed,
deduplicating by event id, splitting a batch at deletions, and turning a batch into steps.

A projection is plain logic over (records, its store): no broker, no runner. `handle()` reads
the store's committed state, computes change sets, and returns them with the positions they
complete; the runner applies them (store.apply writes the view and the positions together)
and then commits the consumer group. Tests call `handle()` + `store.apply()` directly.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Generic, Sequence, TypeVar

from schemas import faults
from schemas.events import ForgetRequested, TurnRecorded
from schemas.ports.event_log import LogRecord
from schemas.ports.views import ChangeSet, Forget, Positions, TurnRow, ViewName, ViewStore, content_hash
from schemas.units import turn_unit_id
from streams.sealing import Opener

log = logging.getLogger(__name__)

C = TypeVar("C", bound=ChangeSet)
SessionKey = tuple[str, str, str]


@dataclass(frozen=True)
class DeadLetter:
    record: LogRecord
    projection: str
    reason: str
    errors: list[dict] = field(default_factory=list)
    retryable: bool = True  # False: replaying cannot help (e.g. a conflicting duplicate event id)


@dataclass
class Step(Generic[C]):
    """One atomic unit of work: a change set, the positions it completes, and the records that
    could not be processed (they are dead-lettered before the positions move past them)."""

    change: C
    positions: Positions
    dead_letters: list[DeadLetter] = field(default_factory=list)


def turn_row(event: TurnRecorded, record: LogRecord) -> TurnRow:
    return TurnRow(
        turn_id=turn_unit_id(event.tenant_id, event.conversation_id, event.event_id),
        tenant_id=event.tenant_id,
        conversation_id=event.conversation_id,
        session_id=event.session_id,
        event_id=event.event_id,
        agent_id=event.agent_id,
        speaker=event.speaker,
        role=event.role,
        turn_index=event.turn_index,
        occurred_at=event.occurred_at,
        text=event.full_text,
        source_ref=event.source_ref,
        partition=record.partition,
        offset=record.offset,
        content_hash=content_hash(_hashed(event)),
        supersedes=event.supersedes,
    )


def _hashed(event: TurnRecorded) -> dict:
    """What the content hash covers: the whole event, with `supersedes` only when it is set, so
    that turns published before the field existed keep their hash (a redelivery is not a conflict)."""
    d = event.model_dump(mode="json")
    if d.get("supersedes") is None:
        d.pop("supersedes", None)
    return d


def _conflict(record: LogRecord, projection: str, event_id: str) -> DeadLetter:
    return DeadLetter(record, projection, f"event id {event_id!r} was already used for a different turn in this conversation; "
                      "the first one is kept (events are immutable: publish a new event id)", retryable=False)


def advance(positions: Positions, records: Sequence[LogRecord]) -> Positions:
    out = dict(positions)
    for r in records:
        out[r.partition] = max(out.get(r.partition, 0), r.offset + 1)
    return out


class Projection(Generic[C]):
    """Base for the four projections. Subclasses implement `new_change`, `prepare` and
    `session_change`; the base handles everything that is the same for all views."""

    name: ViewName

    def __init__(self, store: ViewStore):
        self.store = store
        # Opens sealed records (streams/sealing.py); the pipeline gives it the data key store.
        # Without one, only unsealed records can be read.
        self.opener = Opener(None)

    # -- hooks ---------------------------------------------------------------------------
    def new_change(self) -> C:
        raise NotImplementedError

    def prepare(self, new_turns: list[TurnRow]) -> None:
        """Batch-level model work (encoding, NER) over all new turns of a step."""

    def session_change(self, change: C, key: SessionKey, before: list[TurnRow], after: list[TurnRow], added: list[TurnRow]) -> None:
        """Add to `change` what moving the session from `before` to `after` means for this view."""
        raise NotImplementedError

    def finish(self, change: C) -> None:
        """Batch-level work after every session of a step was handled (e.g. encode new entities once)."""

    # -- the algorithm -------------------------------------------------------------------
    def handle(self, records: Sequence[LogRecord]) -> tuple[list[Step[C]], int]:
        """Steps for a prefix of `records`, and how many records that prefix holds.

        A deletion ends the prefix: what it removes (and the sessions it repairs) depends on
        the view *after* the preceding turns are applied, so the caller applies the returned
        steps and calls again with the rest."""
        run: list[tuple[LogRecord, TurnRecorded]] = []
        dead: list[DeadLetter] = []
        for i, (record, opened) in enumerate(zip(records, self.opener.open(records))):
            if opened.forgotten:  # its key was destroyed: forgotten memory, skipped (the position moves on)
                continue
            if opened.error is not None:
                dead.append(DeadLetter(record, self.name, str(opened.error), opened.error.errors))
                continue
            event = opened.event
            if isinstance(event, ForgetRequested):
                if i > 0:
                    return [Step(self._turns_change(run, dead), advance({}, records[:i]), dead)], i
                return [Step(self._forget_change(Forget(event.tenant_id, event.scope)), advance({}, records[:1]))], 1
            run.append((record, event))
        return [Step(self._turns_change(run, dead), advance({}, records), dead)], len(records)

    def handle_all(self, records: Sequence[LogRecord]) -> list[Step[C]]:
        """Convenience for tests and tools: handle and apply everything (store.apply per step)."""
        steps: list[Step[C]] = []
        positions = self.store.positions()
        while records:
            batch, n = self.handle(records)
            for step in batch:
                positions = {**positions, **step.positions}
                self.store.apply(step.change, positions)
            steps.extend(batch)
            records = records[n:]
        return steps

    def _turns_change(self, run: list[tuple[LogRecord, TurnRecorded]], dead: list[DeadLetter]) -> C:
        change = self.new_change()
        # First occurrence of an event id wins: the stored turn if there is one, else the first in
        # the batch. Every later record with that id is compared with the winner, not with the
        # batch's first (which may itself be a refused conflict): an exact duplicate of the stored
        # turn stays harmless whatever came between them.
        by_conv: dict[tuple[str, str], list[tuple[LogRecord, TurnRow]]] = defaultdict(list)
        for record, event in run:
            row = turn_row(event, record)
            by_conv[(row.tenant_id, row.conversation_id)].append((record, row))
        added: dict[SessionKey, list[TurnRow]] = defaultdict(list)
        redelivered: set[SessionKey] = set()
        for (tenant, conv), pairs in by_conv.items():
            stored = self.store.find_turns(tenant, conv, list(dict.fromkeys(row.event_id for _, row in pairs)))
            winners = dict(stored)
            for record, row in pairs:
                won = winners.get(row.event_id)
                if won is None:
                    winners[row.event_id] = row
                    added[row.session_key].append(row)
                elif won.content_hash != row.content_hash:
                    dead.append(_conflict(record, self.name, row.event_id))
                elif row.event_id in stored:
                    redelivered.add(row.session_key)
        # A turn the store holds, delivered again above the view's position: another writer of
        # this view (a worker that kept a batch through a rebalance) applied it, perhaps from an
        # older state of the session, and may have set the position back. The session's units are
        # rewritten from what the ledger holds now, so a stale write of a window cannot stay.
        repairs = sorted(redelivered - set(added))
        new_turns = [t for rows in added.values() for t in rows]
        if not new_turns and not repairs:
            return change
        if new_turns:
            faults.poisoned(self.name, [t.text for t in new_turns])  # fault injection (schemas/faults.py); off by default
            self.prepare(new_turns)
        for key in sorted(added):
            before = self.store.session_turns(*key)
            after = before + added[key]
            change.put_turns.extend(added[key])
            self.session_change(change, key, before, after, added[key])
        for key in repairs:
            self.session_change(change, key, [], self.store.session_turns(*key), [])
        self.finish(change)
        return change

    def _forget_change(self, forget: Forget) -> C:
        """The store drops everything inside the scope (`change.forgets`). A whole tenant,
        conversation or session goes with its units; a partial scope (a turn, an agent, turns
        before a time) leaves the sessions it touched, which are recomputed here from the turns
        left (their windows, episodes, adjacency)."""
        change = self.new_change()
        change.forgets.append(forget)
        if forget.scope.partial:
            by_session: dict[SessionKey, set[str]] = defaultdict(set)
            for turn in self.store.turns_in_scope(forget):
                by_session[turn.session_key].add(turn.turn_id)
            for key in sorted(by_session):
                before = self.store.session_turns(*key)
                after = [t for t in before if t.turn_id not in by_session[key]]
                self.session_change(change, key, before, after, [])
        self.finish(change)
        return change
