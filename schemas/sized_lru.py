"""A least-recently-used map bounded by the summed size (`len`) of its values, not their count.

The embedded views keep one in-memory structure per searched scope (a conversation, or a tenant
searched across conversations) and maintain it from their change tables; scopes differ in size by
orders of magnitude, so the bound that protects memory is on what they hold in all. A value is
made on its first use; past the bound the least recently used ones go, and are made again on
their next use. The one just used always stays, however large.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable, Generic, Hashable, Sized, TypeVar

V = TypeVar("V", bound=Sized)


class SizedLRU(Generic[V]):
    def __init__(self, limit: int):
        self.limit = limit
        self._items: OrderedDict[Hashable, V] = OrderedDict()
        # Re-entrant: the stores hold it across a read of a value and its maintenance, and a
        # `get` inside that section must not deadlock.
        self.lock = threading.RLock()

    def get(self, key: Hashable, make: Callable[[], V]) -> V:
        """The value of `key`, made by `make` if it is not held (under the lock: one build per key)."""
        with self.lock:
            value = self._items.get(key)
            if value is None:
                value = make()
                self._items[key] = value
            self._items.move_to_end(key)
            total = sum(len(v) for v in self._items.values())
            while total > self.limit and len(self._items) > 1:
                _, dropped = self._items.popitem(last=False)
                total -= len(dropped)
            return value

    def loaded(self) -> list[tuple[Hashable, V]]:
        with self.lock:
            return list(self._items.items())

    def clear(self) -> None:
        with self.lock:
            self._items.clear()
