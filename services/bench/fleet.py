"""A deterministic, seeded synthetic fleet: the bulk that `memstream bench scale` grows a store
with (10k, 100k, 1M turns) around the measured tenants.

It is built to be a hard background, not an easy one: many tenants, agents and conversations with
LoCoMo-like turn lengths, recurring entities and dated sessions, and deliberately the measured
tenants' own speaker names, entity names and words (`Vocabulary.from_turns`), so that a boundary
leak or a score that drifts with the store's size shows up in the measured tenants' results.

Turn `i` is a pure function of (seed, i): a load that stops can resume at any index, and two runs
with one seed write the same events (their event ids too, so a resent turn is a harmless
duplicate). Python's `random.Random` seeded with a string is stable across runs and platforms
(it hashes the string with SHA-512, not with the per-process `hash()`).
"""

from __future__ import annotations

import bisect
import functools
import itertools
import random
import re
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Callable, Iterable, Iterator

from schemas.events import TurnRecorded

_WORD = re.compile(r"[A-Za-z]+(?:'[a-z]+)?")
_NAME = re.compile(r"(?<=[a-z,;:] )[A-Z][a-z]{2,}\b")  # capitalised inside a sentence, after a word
_STOP_NAMES = frozenset({"The", "This", "That", "What", "When", "Where", "Which", "Who", "Why", "How", "And", "But", "Yes",
                         "Wow", "Thanks", "Thank", "Hey", "Hi", "Hello", "Oh", "Sure", "Great", "Well", "Also", "Just", "Sounds"})
EPOCH = datetime(2019, 1, 1, tzinfo=timezone.utc)
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November", "December")


@dataclass(frozen=True)
class Vocabulary:
    """What the synthetic turns are made of, taken from the measured tenants' turns."""

    speakers: tuple[str, ...]
    names: tuple[str, ...]  # capitalised words inside sentences: people, places, titles
    words: tuple[str, ...]  # lower-case words, most frequent first
    lengths: tuple[int, ...]  # the turns' word counts, as observed

    @classmethod
    def from_turns(cls, turns: Iterable[TurnRecorded], max_words: int = 20_000) -> "Vocabulary":
        speakers: dict[str, None] = {}
        names: Counter[str] = Counter()
        words: Counter[str] = Counter()
        lengths: list[int] = []
        for t in turns:
            speakers.setdefault(t.speaker)
            tokens = _WORD.findall(t.text)
            if tokens:
                lengths.append(len(tokens))
            words.update(w for w in tokens if w.islower())
            names.update(n for n in _NAME.findall(t.text) if n not in _STOP_NAMES)
        if not speakers or not words or not lengths:
            raise ValueError("a vocabulary needs turns with text")
        return cls(speakers=tuple(speakers), names=tuple(n for n, _ in names.most_common()) or tuple(speakers),
                   words=tuple(w for w, _ in words.most_common(max_words)), lengths=tuple(sorted(lengths)))


@dataclass(frozen=True)
class FleetShape:
    seed: int = 7
    tenants: int = 40
    agents_per_tenant: int = 4
    turns_per_conversation: int = 400  # LoCoMo's dev conversations have 369-689
    turns_per_session: int = 20
    entities_per_conversation: int = 8
    tenant_prefix: str = "fleet"


class SyntheticFleet:
    """`turn(i)` / `turns(start, stop)`: the fleet's i-th turn (module docstring)."""

    def __init__(self, vocabulary: Vocabulary, shape: FleetShape = FleetShape()):
        if shape.tenants < 1 or shape.agents_per_tenant < 2 or shape.turns_per_conversation < 1 or shape.turns_per_session < 1:
            raise ValueError(f"a fleet needs ≥ 1 tenant, ≥ 2 agents per tenant and ≥ 1 turn per conversation and session: {shape}")
        self.vocabulary, self.shape = vocabulary, shape
        # Zipf-like word frequencies (rank r drawn ∝ 1/(r+1)), the shape natural text has.
        self._cumulative = list(itertools.accumulate(1.0 / (r + 1) for r in range(len(vocabulary.words))))
        # Turns are generated in order: a conversation's parameters are drawn once, not per turn.
        self._conversation = functools.lru_cache(maxsize=4)(self._draw_conversation)

    def tenant_id(self, conversation: int) -> str:
        return f"{self.shape.tenant_prefix}-{conversation % self.shape.tenants:05d}"

    def _draw_conversation(self, c: int) -> tuple[str, str, int, int, list[str], datetime, int]:
        s, v = self.shape, self.vocabulary
        rng = random.Random(f"{s.seed}:conversation:{c}")
        a, b = rng.sample(range(s.agents_per_tenant), 2)
        speakers = rng.sample(v.speakers, 2) if len(v.speakers) >= 2 else [v.speakers[0], v.speakers[0] + " B"]
        entities = rng.sample(v.names, min(s.entities_per_conversation, len(v.names)))
        start = EPOCH + timedelta(days=rng.randrange(5 * 365))
        return speakers[0], speakers[1], a, b, entities, start, rng.randrange(1, 15)

    def turn(self, i: int) -> TurnRecorded:
        s = self.shape
        c, j = divmod(i, s.turns_per_conversation)
        speaker_a, speaker_b, agent_a, agent_b, entities, start, gap_days = self._conversation(c)
        session, k = divmod(j, s.turns_per_session)
        rng = random.Random(f"{s.seed}:turn:{i}")
        mine = k % 2 == 0
        speaker, other = (speaker_a, speaker_b) if mine else (speaker_b, speaker_a)
        day = start + timedelta(days=session * gap_days)
        tenant = c % s.tenants
        return TurnRecorded(
            event_id=f"syn-{c}:{j}", tenant_id=self.tenant_id(c), agent_id=f"agent-{tenant}-{agent_a if mine else agent_b}",
            conversation_id=f"syn-{c:07d}", session_id=f"session_{session + 1}", turn_index=k + 1, speaker=speaker,
            text=self._text(rng, other, entities, day), occurred_at=day + timedelta(minutes=k),
        )

    def turns(self, start: int, stop: int) -> Iterator[TurnRecorded]:
        return (self.turn(i) for i in range(start, stop))

    def _text(self, rng: random.Random, other: str, entities: list[str], day: datetime) -> str:
        v = self.vocabulary
        n = max(1, v.lengths[rng.randrange(len(v.lengths))])
        words = [v.words[bisect.bisect_left(self._cumulative, rng.random() * self._cumulative[-1])] for _ in range(n)]
        # Recurring entities, the other speaker's name and dates: what the graph view and
        # temporal questions key on, in the measured tenants' own names.
        if entities and rng.random() < 0.6:
            words.insert(rng.randrange(len(words) + 1), rng.choice(entities))
        if rng.random() < 0.2:
            words.insert(0, other + ",")
        if rng.random() < 0.1:
            when = day - timedelta(days=rng.randrange(30))
            words += ["on", f"{when.day} {MONTHS[when.month - 1]} {when.year}"]
        text = " ".join(words)
        return text[0].upper() + text[1:] + rng.choice((".", ".", ".", "!", "?"))


class ConversationFiller:
    """Filler sessions of one existing conversation (`memstream bench grow`'s haystack): the
    fleet's text, spoken by that conversation's own speakers in sessions of their own, session `s`
    dated by `day_of(s)`, so that the conversation's real sessions sit among them.

    Turn `i` is a pure function of (the fleet's seed, `event_prefix`, i), like the fleet's: a load
    that stops resumes at any index and a resent turn repeats its event id. The recurring entities
    change every `entity_block` sessions, so the haystack drifts between topics as a long
    conversation does."""

    def __init__(self, fleet: SyntheticFleet, *, tenant_id: str, conversation_id: str, speakers: tuple[str, str],
                 day_of: Callable[[int], datetime], event_prefix: str, entity_block: int = 20):
        if entity_block < 1:
            raise ValueError("entity_block: at least one session")
        self.fleet, self.tenant_id, self.conversation_id, self.speakers = fleet, tenant_id, conversation_id, speakers
        self.day_of, self.event_prefix, self.entity_block = day_of, event_prefix, entity_block
        self._entities = functools.lru_cache(maxsize=4)(self._draw_entities)

    def _draw_entities(self, block: int) -> list[str]:
        s, v = self.fleet.shape, self.fleet.vocabulary
        rng = random.Random(f"{s.seed}:{self.event_prefix}:entities:{block}")
        return rng.sample(v.names, min(s.entities_per_conversation, len(v.names)))

    def session_of(self, i: int) -> int:
        return i // self.fleet.shape.turns_per_session

    def turn(self, i: int) -> TurnRecorded:
        session, k = divmod(i, self.fleet.shape.turns_per_session)
        rng = random.Random(f"{self.fleet.shape.seed}:{self.event_prefix}:turn:{i}")
        speaker, other = self.speakers if k % 2 == 0 else self.speakers[::-1]
        day = self.day_of(session)
        return TurnRecorded(
            event_id=f"{self.event_prefix}:{i}", tenant_id=self.tenant_id, agent_id=speaker,
            conversation_id=self.conversation_id, session_id=f"filler_{session + 1}", turn_index=k + 1, speaker=speaker,
            text=self.fleet._text(rng, other, self._entities(session // self.entity_block), day),
            occurred_at=day + timedelta(minutes=k),
        )

    def turns(self, start: int, stop: int) -> Iterator[TurnRecorded]:
        return (self.turn(i) for i in range(start, stop))
