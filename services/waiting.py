"""Read-your-writes by positions, whoever runs the projections: every view's live generation
and the eraser (its positions live in the data key store) past the target."""

from __future__ import annotations

import asyncio
import time

from schemas.ports.views import VIEW_NAMES, Positions


def _readers(views, keystore) -> list:
    return [lambda v=view: views.store(v).positions() for view in VIEW_NAMES] + [keystore.positions]


def _reached(snapshot: list[Positions | None], target: Positions) -> bool:
    # A reader that failed (a view with no data yet, a store briefly away) has not reached it.
    return all(p is not None and all(p.get(part, 0) >= off for part, off in target.items()) for p in snapshot)


class PositionWatch:
    """Read-your-writes for a server (POST /v1/wait) and for a CLI command alike. Many waiters, one reader. While anyone waits, every view's positions and the eraser's are
    read once per `interval` and the snapshot is shared: N clients waiting on their publishes
    cost what one does. (Each waiter used to poll every store itself — under a steady stream of
    publishes, each followed by a `POST /v1/wait`, thousands of reads a second on the serving
    process, slowing the very projections and searches they waited for.) Positions only grow, so
    any snapshot that shows a target reached is a valid answer for it."""

    def __init__(self, views, keystore, interval: float = 0.05):
        self._readers = _readers(views, keystore)
        self.interval = interval
        self.reads = 0  # snapshots taken (tests)
        self._snapshot: list[Positions | None] | None = None
        self._changed = asyncio.Condition()
        self._waiters = 0
        self._task: asyncio.Task | None = None

    async def wait(self, target: Positions, timeout: float) -> bool:
        if not target:
            return True
        deadline = time.monotonic() + timeout
        self._waiters += 1
        if self._task is None:
            self._task = asyncio.create_task(self._poll())
        try:
            async with self._changed:
                while not (self._snapshot is not None and _reached(self._snapshot, target)):
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return False
                    try:
                        await asyncio.wait_for(self._changed.wait(), remaining)
                    except asyncio.TimeoutError:
                        return self._snapshot is not None and _reached(self._snapshot, target)
                return True
        finally:
            self._waiters -= 1

    async def _poll(self) -> None:
        try:
            while self._waiters > 0:
                snapshot: list[Positions | None] = []
                for read in self._readers:
                    try:
                        snapshot.append(await asyncio.to_thread(read))
                    except Exception:  # noqa: BLE001 - see _reached
                        snapshot.append(None)
                self.reads += 1
                async with self._changed:
                    self._snapshot = snapshot
                    self._changed.notify_all()
                await asyncio.sleep(self.interval)
        finally:
            self._task = None
            self._snapshot = None  # the next waiter starts from a fresh read
