"""POST /v1/wait's shared position watch (services/waiting.py): many waiters cost one reader; each
waiter returns once every view and the eraser reach its target, or False at its timeout; a view
that cannot be read has not reached anything."""

from __future__ import annotations

import asyncio

import pytest

from schemas.ports.views import VIEW_NAMES
from services.waiting import PositionWatch

pytestmark = pytest.mark.unit


class Store:
    def __init__(self, shared):
        self.shared = shared

    def positions(self):
        self.shared["reads"] += 1
        if self.shared.get("down"):
            raise OSError("store away")
        return dict(self.shared["at"])


class Views:
    def __init__(self, shared):
        self.shared = shared

    def store(self, view):
        return Store(self.shared)


def test_many_waiters_share_one_reader_and_each_returns_when_reached():
    shared = {"reads": 0, "at": {0: 0, 1: 0}}

    async def run():
        watch = PositionWatch(Views(shared), Store(shared), interval=0.01)
        waiters = [asyncio.create_task(watch.wait({0: i % 10, 1: 1}, timeout=5)) for i in range(100)]
        await asyncio.sleep(0.1)
        assert not any(w.done() for w in waiters)  # partition 1 is not there yet
        shared["at"] = {0: 4, 1: 1}
        await asyncio.sleep(0.1)
        assert sum(w.done() for w in waiters) == 50  # targets 0..4 of partition 0
        shared["at"] = {0: 9, 1: 1}
        assert all(await asyncio.gather(*waiters))
        rounds = watch.reads
        assert shared["reads"] == rounds * (len(VIEW_NAMES) + 1)  # one read per store per round, whatever the waiters
        assert rounds < 100  # 100 waiters polling by themselves would have made >= 100 rounds in the first 0.1 s alone
        await asyncio.sleep(0.05)
        assert watch._task is None  # nobody waits: nobody reads

    asyncio.run(run())


def test_timeout_and_an_unreadable_store():
    shared = {"reads": 0, "at": {0: 100}, "down": True}

    async def run():
        watch = PositionWatch(Views(shared), Store(shared), interval=0.01)
        assert await watch.wait({0: 1}, timeout=0.2) is False  # a store that cannot be read has not reached it
        shared["down"] = False
        assert await watch.wait({0: 1}, timeout=2) is True
        assert await watch.wait({}, timeout=0) is True

    asyncio.run(run())
