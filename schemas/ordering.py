"""The order of turns inside a conversation.

Several agents may write to one conversation and events may arrive late or out of order, so
the order is defined by the events' own fields, never by arrival or log offset:

1. turns are grouped into sessions by `session_id`;
2. inside a session, turns are sorted by `(occurred_at, turn_index, agent_id, event_id)`:
   time first, then the producer's index, then stable tie-breakers;
3. sessions are sorted by `(earliest occurred_at of their turns, session_id)`.

Windows and episodes never cross a session boundary. Because the order is a pure function of
the set of turns, replaying the log (or receiving the same turns in another order) yields the
same units.
"""

from __future__ import annotations

from datetime import datetime
from typing import Iterable, Protocol


class Orderable(Protocol):
    occurred_at: datetime
    turn_index: int
    agent_id: str
    event_id: str


def turn_order_key(turn: Orderable) -> tuple:
    return (turn.occurred_at, turn.turn_index, turn.agent_id, turn.event_id)


def order_turns(turns: Iterable[Orderable]) -> list:
    return sorted(turns, key=turn_order_key)


def session_order_key(session_id: str, turns: Iterable[Orderable]) -> tuple:
    return (min(t.occurred_at for t in turns), session_id)
