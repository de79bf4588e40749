"""Reading and writing the control topic (schemas/control.py): which projections are paused.

`ControlState.refresh()` reads only what is new since its last call, so runners can call it
before every step; it touches the log at most every `min_interval` seconds.
"""

from __future__ import annotations

import time

from schemas.control import ProjectionControl, control_topic, decode_control, encode_control
from schemas.ports.event_log import EventLog, NewRecord


class ControlState:
    def __init__(self, log_: EventLog, topic: str, *, min_interval: float = 0.25):
        self.log = log_
        self.topic = control_topic(topic)
        self.min_interval = min_interval
        self._offset = 0
        self._last_refresh = float("-inf")
        self._paused: dict[str, ProjectionControl] = {}

    async def ensure_topic(self) -> None:
        await self.log.ensure_topic(self.topic, 1)

    async def refresh(self, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_refresh < self.min_interval:
            return
        self._last_refresh = now
        while True:
            records = await self.log.read(self.topic, 0, self._offset, max_records=500)
            if not records:
                return
            for rec in records:
                control = decode_control(rec.value)
                if control is not None:
                    if control.paused:
                        self._paused[control.projection] = control
                    else:
                        self._paused.pop(control.projection, None)
                self._offset = rec.offset + 1

    def paused(self, view: str) -> bool:
        return view in self._paused

    def pause_record(self, view: str) -> ProjectionControl | None:
        return self._paused.get(view)

    async def request(self, control: ProjectionControl) -> None:
        await self.log.append(self.topic, [NewRecord(key=control.projection, value=encode_control(control), partition=0)])
        await self.refresh(force=True)
