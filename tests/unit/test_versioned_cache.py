"""schemas/versioned_cache.py: served while the version holds, rebuilt when it moves, bounded,
one build per key and version however many queries miss at once, and a failed build retried."""

from __future__ import annotations

import threading
import time

import pytest

from schemas.versioned_cache import VersionedCache

pytestmark = pytest.mark.unit


def test_version_bound_and_lru():
    cache = VersionedCache(size=2)
    assert cache.get("a", 1, lambda: "a1") == "a1"
    assert cache.get("a", 1, lambda: "never") == "a1"
    assert cache.get("a", 2, lambda: "a2") == "a2"  # the version moved
    cache.get("b", 1, lambda: "b1")
    cache.get("a", 2, lambda: "never")  # a is now the most recent
    cache.get("c", 1, lambda: "c1")  # evicts b
    assert len(cache) == 2 and cache.get("b", 1, lambda: "b1 again") == "b1 again"


def test_concurrent_misses_build_once():
    cache, started, calls = VersionedCache(size=4), threading.Event(), []

    def build():
        calls.append(1)
        started.set()
        time.sleep(0.2)
        return object()

    results = []
    threads = [threading.Thread(target=lambda: results.append(cache.get("hot", 7, build))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert len(calls) == 1 and len(results) == 8 and all(r is results[0] for r in results)


def test_a_failed_build_is_retried_by_a_waiter():
    cache, gate = VersionedCache(size=4), threading.Event()
    outcomes = []

    def failing():
        gate.wait(2)
        raise RuntimeError("store away")

    def first():
        try:
            cache.get("k", 1, failing)
        except RuntimeError as exc:
            outcomes.append(str(exc))

    t1 = threading.Thread(target=first)
    t1.start()
    time.sleep(0.05)
    t2 = threading.Thread(target=lambda: outcomes.append(cache.get("k", 1, lambda: "built by the waiter")))
    t2.start()
    time.sleep(0.05)
    gate.set()
    t1.join(5)
    t2.join(5)
    assert sorted(outcomes) == ["built by the waiter", "store away"]
