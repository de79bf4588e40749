"""Read access to the live generation of every view, following the catalog.

Readers never take writer locks. When a replay switches a view to a new generation, the next
`store(view)` call opens the new generation (the catalog is re-read at most every
`refresh_seconds`), so queries keep working during and after a rebuild.
"""

from __future__ import annotations

import threading
import time

from schemas.errors import NotFound
from schemas.ports.views import ViewName


class LiveViews:
    def __init__(self, backends, refresh_seconds: float = 0.2):
        self.backends = backends
        self.catalog = backends.catalog()
        self.refresh_seconds = refresh_seconds
        self._open: dict[ViewName, tuple[int, object]] = {}
        self._checked: dict[ViewName, float] = {}
        self._retired: list[object] = []
        self._models: dict[tuple[ViewName, int], str | None] = {}
        self._lock = threading.Lock()

    def generation(self, view: ViewName) -> int | None:
        now = time.monotonic()
        with self._lock:
            cached = self._open.get(view)
            if cached is not None and now - self._checked.get(view, 0.0) < self.refresh_seconds:
                return cached[0]
        gen = self.catalog.current(view)
        with self._lock:
            self._checked[view] = now
        return gen

    def model(self, view: ViewName, generation: int | None = None) -> str | None:
        """The encoder a generation of the view (default: the live one) was built with (None: not
        recorded — the configured one; or no generation yet)."""
        gen = self.generation(view) if generation is None else generation
        if gen is None:
            return None
        if (view, gen) not in self._models:
            self._models[(view, gen)] = self.catalog.model(view, gen)
        return self._models[(view, gen)]

    def store(self, view: ViewName):
        if self._retired:
            with self._lock:
                self._close_retired()
        gen = self.generation(view)
        if gen is None:
            raise NotFound(f"view {view!r} has no data yet: ingest events and run the projections")
        with self._lock:
            cached = self._open.get(view)
            if cached is not None and cached[0] == gen:
                return cached[1]
            store = self.backends.open_view(view, gen)
            if cached is not None:
                self._retired.append((time.monotonic(), cached[1]))  # closed later: a query may still be using it
            self._open[view] = (gen, store)
            self._close_retired()
            return store

    def _close_retired(self, after: float = 2.0) -> None:
        """Close the stores of replaced generations no query can still be using (their files can
        then really go when the replay drops them)."""
        now, keep = time.monotonic(), []
        for since, store in self._retired:
            if now - since > after:
                store.close()
            else:
                keep.append((since, store))
        self._retired = keep

    def close(self) -> None:
        with self._lock:
            for _, store in self._open.values():
                store.close()
            for _, store in self._retired:
                store.close()
            self._open.clear()
            self._retired.clear()
