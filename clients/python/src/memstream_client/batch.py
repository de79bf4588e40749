"""Batching publishes: a buffer that sends when it holds `max_size` items or its oldest item
waited `max_delay` seconds, and on `flush()` and exit. Each send is one `add` (with the client's
retries); `positions` covers everything sent, for one `wait` at the end. A send that fails in
the background is raised by the next `add`, `flush` or exit, and its items stay buffered: a
later flush sends them again (their event ids make that safe)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from memstream_client._http import as_events, merge_positions
from memstream_client.errors import InvalidRequest
from memstream_client.models import AddResult, Positions


class _Buffer:
    def __init__(self, max_size: int, max_delay: float):
        if max_size < 1 or max_delay <= 0:
            raise InvalidRequest(f"batch() needs max_size >= 1 and max_delay > 0, not {max_size} and {max_delay}")
        self.max_size, self.max_delay = max_size, max_delay
        self.items: list[dict[str, Any]] = []
        self.positions: Positions = {}
        self.results: list[AddResult] = []
        self.error: BaseException | None = None

    def sent(self, result: AddResult, n: int) -> None:
        del self.items[:n]
        self.results.append(result)
        self.positions = merge_positions(self.positions, result.positions)

    def raise_error(self) -> None:
        if self.error is not None:
            error, self.error = self.error, None
            raise error


class Batch(_Buffer):
    """For `Client` (a timer thread sends on time)."""

    def __init__(self, client, max_size: int, max_delay: float):
        super().__init__(max_size, max_delay)
        self._client = client
        self._lock = threading.RLock()
        self._timer: threading.Timer | None = None

    def add(self, turns: Any) -> None:
        with self._lock:
            self.raise_error()
            self.items.extend(as_events(turns))
            if len(self.items) >= self.max_size:
                self._send()
            elif self._timer is None:
                self._timer = threading.Timer(self.max_delay, self._on_time)
                self._timer.daemon = True
                self._timer.start()

    def _on_time(self) -> None:
        with self._lock:
            self._timer = None
            try:
                self._send()
            except BaseException as exc:  # noqa: BLE001 - raised to the caller at its next call
                self.error = exc

    def _send(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while self.items:
            chunk = self.items[: self.max_size]
            self.sent(self._client.add(chunk), len(chunk))

    def flush(self) -> Positions:
        with self._lock:
            self.raise_error()
            self._send()
            return dict(self.positions)

    def __enter__(self) -> "Batch":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is None:
            self.flush()
        elif self._timer is not None:
            self._timer.cancel()


class AsyncBatch(_Buffer):
    """For `AsyncClient` (a task sends on time)."""

    def __init__(self, client, max_size: int, max_delay: float):
        super().__init__(max_size, max_delay)
        self._client = client
        self._lock = asyncio.Lock()
        self._timer: asyncio.Task | None = None

    async def add(self, turns: Any) -> None:
        async with self._lock:
            self.raise_error()
            self.items.extend(as_events(turns))
            if len(self.items) >= self.max_size:
                await self._send()
            elif self._timer is None:
                self._timer = asyncio.get_running_loop().create_task(self._on_time())

    async def _on_time(self) -> None:
        await asyncio.sleep(self.max_delay)
        async with self._lock:
            self._timer = None
            try:
                await self._send()
            except Exception as exc:  # noqa: BLE001 - raised to the caller at its next call
                self.error = exc

    async def _send(self) -> None:
        timer, self._timer = self._timer, None
        if timer is not None and timer is not asyncio.current_task():
            timer.cancel()
        while self.items:
            chunk = self.items[: self.max_size]
            self.sent(await self._client.add(chunk), len(chunk))

    async def flush(self) -> Positions:
        async with self._lock:
            self.raise_error()
            await self._send()
            return dict(self.positions)

    async def __aenter__(self) -> "AsyncBatch":
        return self

    async def __aexit__(self, exc_type, *exc) -> None:
        if exc_type is None:
            await self.flush()
        elif self._timer is not None:
            self._timer.cancel()
