"""Cursors for the API's listings (turns, keys, dead letters, the audit trail): the sort key of the
last item of a page, written out plainly (`1772442840000000:t_28b0…` for turns). Callers pass
`next_cursor` back unchanged; a cursor stays valid while items are added (the next page starts
strictly after that key).

A cursor only says where a listing of the caller's own data resumes, so it is not signed: it is
validated. Each listing's cursor has a pattern that the OpenAPI document states, and every
string that matches it is a position the listing can resume from (no number in it can overflow
a store), while anything else is a 400 saying what to send. So a forged cursor can do exactly
what a real one does, and nothing else."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Sequence, TypeVar

from schemas.errors import InvalidCursor, InvalidRequest

T = TypeVar("T")
MAX_LIMIT = 1000
INVALID = "cursor is not one this listing gives out: pass `next_cursor` of the previous page unchanged"

_OFFSET = "(0|[1-9][0-9]{0,15})"  # below 10^16: any log offset, and exact in every JSON parser
_MICROS = "(-?[1-9][0-9]{0,15}|0)"  # microseconds since 1970: years 1653-2286, inside every store's range
_TOPIC = "[A-Za-z0-9._-]{1,249}"    # Kafka's topic names (no ':')


@dataclass(frozen=True)
class Cursor:
    """A listing's cursor: its pattern (stated in the document) and the key it stands for."""

    pattern: str
    kinds: tuple[type, ...]  # each ':'-separated part: int or str

    def render(self, key: Sequence[object]) -> str:
        return ":".join(str(part) for part in key)

    def parse(self, cursor: str) -> tuple:
        if not re.fullmatch(self.pattern, cursor):
            raise InvalidCursor(INVALID)
        parts = cursor.split(":", len(self.kinds) - 1)
        return tuple(kind(part) for kind, part in zip(self.kinds, parts))


TURNS = Cursor(f"^{_MICROS}:t_[0-9a-f]{{20}}$", (int, str))
KEYS = Cursor("^[0-9a-f]{16}$", (str,))
DEAD_LETTERS = Cursor(f"^{_TOPIC}:(0|[1-9][0-9]{{0,8}}):{_OFFSET}$", (str, int, int))
AUDIT = Cursor(f"^{_OFFSET}$", (int,))


def page(items: Sequence[T], key: Callable[[T], tuple], cursor_format: Cursor, cursor: str | None,
         limit: int) -> tuple[list[T], str | None]:
    """One page of `items` in `key` order after `cursor`, and the cursor of the next (None: last page)."""
    if not 1 <= limit <= MAX_LIMIT:
        raise InvalidRequest(f"limit must be in 1..{MAX_LIMIT}")
    ordered = sorted(items, key=key)
    if cursor:
        after = cursor_format.parse(cursor)
        ordered = [i for i in ordered if key(i) > after]
    chunk = ordered[:limit]
    return chunk, cursor_format.render(key(chunk[-1])) if len(ordered) > limit else None
