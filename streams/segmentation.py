"""The temporal hierarchy: a session's ordered turns -> turn, window and episode units.

A pure function of the session's set of turns (see schemas.ordering), so every projection
that needs units (hierarchy, lexical, dense) computes identical ones without talking to the
others, and a replay reproduces them exactly.

Windows: one level per configured size; `size` consecutive turns every `stride` turns, named
by (size, first turn's position). A window exists at start s once it covers a turn the previous
window does not (s < n - size + stride); a session shorter than `size` has one short ("open")
window, which grows, keeping its id, as turns arrive.

Episodes: a session is cut into runs of turns where the conversation moves on, TextTiling
style (Hearst, 1997): at candidate cut points (window starts) compare the content words of
the `block` turns before and after; cut where that cosine similarity is below
`min_similarity`, or where the time between two turns exceeds `max_gap`. Cuts keep at least
`min_turns` turns on each side. Lexical cohesion is used instead of dense similarity so that
the lexical and hierarchy projections can compute episodes without an encoder; a short session
is one episode.
"""

from __future__ import annotations

import math
from collections import Counter

from spacy.lang.en.stop_words import STOP_WORDS

from schemas.ordering import order_turns
from schemas.ports.views import TurnRow
from schemas.text import words
from schemas.units import HierarchyPolicy, LogPosition, Provenance, TraceUnit, episode_unit_id, window_unit_id


def window_starts(n: int, size: int, stride: int) -> list[int]:
    if n <= 0:
        return []
    return [s for s in range(0, n, stride) if s == 0 or s < n - size + stride]


def episode_ranges(turns: list[TurnRow], policy: HierarchyPolicy) -> list[tuple[int, int]]:
    n = len(turns)
    if n == 0:
        return []
    bags = [Counter(w for w in words(t.text) if w not in STOP_WORDS and len(w) > 1) for t in turns]
    cuts: list[int] = []
    last = 0
    for b in range(1, n):
        if turns[b].occurred_at - turns[b - 1].occurred_at > policy.episode_max_gap:
            cuts.append(b)  # a pause always ends an episode
            last = b
            continue
        if b - last < policy.episode_min_turns or n - b < policy.episode_min_turns:
            continue
        if b % policy.window_stride:
            continue  # episodes are runs of windows: cut only where a window starts
        left = _merge(bags[max(last, b - policy.episode_block):b])
        right = _merge(bags[b:b + policy.episode_block])
        if _cosine(left, right) < policy.episode_min_similarity:
            cuts.append(b)
            last = b
    bounds = [0, *cuts, n]
    return [(bounds[i], bounds[i + 1]) for i in range(len(bounds) - 1)]


def _merge(bags: list[Counter]) -> Counter:
    out: Counter = Counter()
    for b in bags:
        out.update(b)
    return out


def _cosine(a: Counter, b: Counter) -> float:
    if not a or not b:
        return 0.0
    dot = sum(v * b.get(k, 0) for k, v in a.items())
    return dot / (math.sqrt(sum(v * v for v in a.values())) * math.sqrt(sum(v * v for v in b.values())))


def unit_text(turns: list[TurnRow]) -> str:
    """Windows and episodes show each turn as 'Speaker: text', one per line."""
    return "\n".join(f"{t.speaker}: {t.text}" for t in turns)


def _provenance(turns: list[TurnRow], start: int) -> Provenance:
    first = turns[0]
    return Provenance(
        tenant_id=first.tenant_id,
        conversation_id=first.conversation_id,
        session_id=first.session_id,
        turn_start=start,
        turn_end=start + len(turns) - 1,
        event_ids=tuple(t.event_id for t in turns),
        log_positions=tuple(LogPosition(partition=t.partition, offset=t.offset) for t in turns),
        agent_ids=tuple(sorted({t.agent_id for t in turns})),
        speakers=tuple(dict.fromkeys(t.speaker for t in turns)),
        source_refs=tuple(t.source_ref for t in turns if t.source_ref),
        occurred_from=min(t.occurred_at for t in turns),
        occurred_to=max(t.occurred_at for t in turns),
    )


def session_units(turns: list[TurnRow], policy: HierarchyPolicy) -> list[TraceUnit]:
    """All units of one session: its turns, windows and episodes."""
    ordered = order_turns(turns)
    if not ordered:
        return []
    tenant, conv, session = ordered[0].session_key
    units: list[TraceUnit] = []
    for i, t in enumerate(ordered):
        units.append(TraceUnit(unit_id=t.turn_id, kind="turn", text=t.text, provenance=_provenance([t], i), turn_ids=(t.turn_id,)))
    for size in policy.window_sizes:
        for s in window_starts(len(ordered), size, policy.window_stride):
            members = ordered[s:s + size]
            units.append(
                TraceUnit(
                    unit_id=window_unit_id(tenant, conv, session, size, s),
                    kind="window",
                    level=size,
                    text=unit_text(members),
                    provenance=_provenance(members, s),
                    turn_ids=tuple(t.turn_id for t in members),
                )
            )
    for index, (a, b) in enumerate(episode_ranges(ordered, policy)):
        members = ordered[a:b]
        units.append(
            TraceUnit(
                unit_id=episode_unit_id(tenant, conv, session, index),
                kind="episode",
                text=unit_text(members),
                provenance=_provenance(members, a),
                turn_ids=tuple(t.turn_id for t in members),
            )
        )
    return units


def diff_units(before: list[TraceUnit], after: list[TraceUnit]) -> tuple[list[TraceUnit], list[str]]:
    """Units to upsert (new or changed) and ids to delete, going from `before` to `after`."""
    old = {u.unit_id: u for u in before}
    new_ids = {u.unit_id for u in after}
    upserts = [u for u in after if old.get(u.unit_id) != u]
    deletes = [uid for uid in old if uid not in new_ids]
    return upserts, deletes

