"""Read-your-writes by positions, whoever runs the projections: every view's live generation
and the eraser (its positions live in the data key store) past the target."""

from __future__ import annotations

import asyncio
import time

from schemas.ports.views import VIEW_NAMES, Positions


async def positions_reached(views, keystore, target: Positions, timeout: float, interval: float = 0.05) -> bool:
    if not target:
        return True
    deadline = time.monotonic() + timeout
    readers = [lambda v=view: views.store(v).positions() for view in VIEW_NAMES] + [keystore.positions]
    while True:
        reached = True
        for read in readers:
            try:
                positions = await asyncio.to_thread(read)
            except Exception:  # noqa: BLE001 - a view with no data yet, or a store briefly away, has not reached it
                reached = False
                break
            if any(positions.get(p, 0) < off for p, off in target.items()):
                reached = False
                break
        if reached:
            return True
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(interval)
