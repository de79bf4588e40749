"""Opaque cursors for the API's listings (turns, keys, dead letters): the sort key of the last
item of a page, as base64url JSON. Callers pass `next_cursor` back unchanged; a cursor stays
valid while items are added (the next page starts strictly after that key)."""

from __future__ import annotations

import base64
import json
from typing import Any, Callable, Sequence, TypeVar

from schemas.errors import InvalidRequest

T = TypeVar("T")
MAX_LIMIT = 1000


def encode_cursor(key: Sequence[Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(list(key), separators=(",", ":")).encode()).decode().rstrip("=")


def decode_cursor(cursor: str, shape: Sequence[type]) -> tuple:
    """The key a cursor carries, checked against `shape` (the type of each part)."""
    try:
        raw = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        if not isinstance(raw, list) or len(raw) != len(shape):
            raise ValueError
        for value, kind in zip(raw, shape):
            if not isinstance(value, kind) or isinstance(value, bool):
                raise ValueError
        return tuple(raw)
    except (ValueError, TypeError, UnicodeDecodeError):
        raise InvalidRequest("cursor is not one this API gave out (pass `next_cursor` of the previous page unchanged)") from None


def page(items: Sequence[T], key: Callable[[T], tuple], shape: Sequence[type], cursor: str | None, limit: int) -> tuple[list[T], str | None]:
    """One page of `items` in `key` order after `cursor`, and the cursor of the next (None: last page)."""
    if not 1 <= limit <= MAX_LIMIT:
        raise InvalidRequest(f"limit must be in 1..{MAX_LIMIT}")
    ordered = sorted(items, key=key)
    if cursor:
        after = decode_cursor(cursor, shape)
        ordered = [i for i in ordered if key(i) > after]
    chunk = ordered[:limit]
    return chunk, encode_cursor(key(chunk[-1])) if len(ordered) > limit else None
