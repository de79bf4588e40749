"""A bounded LRU of values derived from versioned data, shared by the query side's caches (the
corpus per boundary, the embedded graph snapshots and dense matrices).

An entry serves while its version is current. While a conversation is being written its version
moves with every batch, so several queries can miss on the same key at once: one of them builds,
the others wait for its result instead of building the same thing again beside it (they would
only share the cores and the interpreter lock with it). If that build fails, a waiter builds."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable, Generic, Hashable, TypeVar

V = TypeVar("V")


class VersionedCache(Generic[V]):
    def __init__(self, size: int):
        self.size = size
        self.builds = 0  # values built (tests)
        self._items: OrderedDict[Hashable, tuple[Hashable, V]] = OrderedDict()
        self._building: dict[Hashable, tuple[Hashable, threading.Event]] = {}
        self._lock = threading.Lock()

    def get(self, key: Hashable, version: Hashable, build: Callable[[], V]) -> V:
        while True:
            with self._lock:
                hit = self._items.get(key)
                if hit is not None and hit[0] == version:
                    self._items.move_to_end(key)
                    return hit[1]
                pending = self._building.get(key)
                if pending is None or pending[0] != version:
                    done = threading.Event()
                    self._building[key] = (version, done)
                    break
            pending[1].wait()  # the same version is being built: take its result (or build, if it failed)
        try:
            value = build()
            with self._lock:
                self.builds += 1
                self._items[key] = (version, value)
                self._items.move_to_end(key)
                while len(self._items) > self.size:
                    self._items.popitem(last=False)
            return value
        finally:
            with self._lock:
                if self._building.get(key, (None, None))[1] is done:
                    del self._building[key]
            done.set()

    def clear(self) -> None:
        with self._lock:
            self._items.clear()

    def __len__(self) -> int:
        return len(self._items)


class Lru:
    """A bounded map, least recently used first out, safe across threads: for values kept by an id
    whose value never changes (get_many answers the hits and names the misses)."""

    def __init__(self, size: int):
        self.size = size
        self._items: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def get_many(self, keys) -> tuple[dict, list]:
        found, missing = {}, []
        with self._lock:
            for k in keys:
                hit = self._items.get(k)
                if hit is None:
                    missing.append(k)
                else:
                    self._items.move_to_end(k)
                    found[k] = hit
        return found, missing

    def put_many(self, items: dict) -> None:
        with self._lock:
            self._items.update(items)
            for k in items:
                self._items.move_to_end(k)
            while len(self._items) > self.size:
                self._items.popitem(last=False)

    def drop(self, keys) -> None:
        with self._lock:
            for k in keys:
                self._items.pop(k, None)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
REACH_ENTITIES = 32  # activated entities through which a bounded walk reaches contexts beyond the candidates
