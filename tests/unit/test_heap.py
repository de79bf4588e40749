"""The serving process's heap (services/runtime.py): what has survived the young collections goes
to the permanent generation (full collections then walk only what is newer), cyclic garbage among
the new objects is collected first, and the settling task stops with its server."""

from __future__ import annotations

import asyncio
import gc
import weakref

import pytest

from services.runtime import keep_heap_settled, settle_heap

pytestmark = pytest.mark.unit


class Node:
    def __init__(self):
        self.me = self  # a cycle: only the collector frees it


def test_settling_freezes_survivors_and_collects_young_cycles_first():
    gc.unfreeze()
    try:
        settle_heap()
        frozen = gc.get_freeze_count()
        assert frozen > 0
        kept = [[i] for i in range(1000)]  # lists are always tracked by the collector
        garbage = Node()
        gone = weakref.ref(garbage)
        del garbage

        async def run():
            stop = asyncio.Event()
            task = asyncio.create_task(keep_heap_settled(stop, every=0.05))
            await asyncio.sleep(0.2)
            stop.set()
            await asyncio.wait_for(task, 2)  # stops with its server

        asyncio.run(run())
        assert gone() is None, "a cycle made since the last settling was frozen instead of collected"
        assert gc.get_freeze_count() >= frozen + 1000  # the survivors joined the permanent generation
        assert kept
    finally:
        gc.unfreeze()
