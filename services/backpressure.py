"""Ingest backpressure: bounded lag instead of unbounded lag.

Agents never stop talking; when they talk faster than the projections can index, the backlog (events
on the log not yet in a view) would grow without end and every answer would go stale. Past a
configured bound, `POST /v1/events` answers 429 with a Retry-After estimated from the views' drain
rate, so well-behaved producers (memstream-client retries on 429) slow down to what the views hold.

Fair across tenants: past half the bound, a tenant sending more than its fair share of this replica's
recent intake (1 / tenants sending) is refused first, so one flooding tenant cannot starve the rest;
past the bound, every publish is refused. Forgets are never refused (a privacy request must not wait
behind memory). Paused views do not count: an operator pausing a view has chosen its lag.

The backlog is read from the ops monitor's sample (refreshed at most every `sample_seconds`), so
admission costs no store round trip per request. Producers that bypass the API (Kafka clients, the
intake topic) are not throttled here: Kafka's own quotas are the tool there.
"""

from __future__ import annotations

import math
import time
from collections import Counter, deque
from dataclasses import dataclass

from schemas.errors import RateLimited

RECENT_SECONDS = 10.0  # the window of intake that tenant shares are measured on


class Overloaded(RateLimited):
    """429 for ingest past the backlog bound; a different code from a key's rate limit so that callers
    and dashboards can tell "slow down, the views are behind" from "this key sends too often"."""

    code = "backlog_full"


@dataclass(frozen=True)
class Backlog:
    events: int          # most events any unpaused view has not yet processed
    drain_rate: float    # events/s of the slowest unpaused view over the health window (0: unknown)


class Backpressure:
    def __init__(self, max_backlog: int, metrics=None):
        self.max_backlog = max_backlog
        self.metrics = metrics
        self._recent: deque[tuple[float, str, int]] = deque()  # (time, tenant, events) accepted on this replica
        self._by_tenant: Counter = Counter()
        if metrics is not None:
            metrics.ingest_backlog_limit.set(max_backlog)

    @staticmethod
    def backlog(sample: dict) -> Backlog:
        live = [p for p in sample.get("projections", []) if not p.get("paused")]
        if not live:
            return Backlog(0, 0.0)
        return Backlog(max(p["lag_events"] for p in live), min(float(p.get("rate") or 0.0) for p in live))

    def admit(self, backlog: Backlog, tenants: Counter) -> None:
        """Raise Overloaded if a publish of `tenants` (tenant -> events) may not go in now."""
        if self.metrics is not None:
            self.metrics.ingest_backlog.set(backlog.events)
        if self.max_backlog <= 0 or not tenants:
            return
        now = time.monotonic()
        self._expire(now)
        soft = self.max_backlog // 2
        if backlog.events <= soft:
            return
        if backlog.events < self.max_backlog:
            senders = set(self._by_tenant) | set(tenants)
            total = sum(self._by_tenant.values()) + sum(tenants.values())
            heavy = [t for t in tenants if (self._by_tenant[t] + tenants[t]) / total > 1.0 / len(senders)]
            if not heavy:
                return
            reason = (f"the views are {backlog.events} events behind (bound {self.max_backlog}) and tenant "
                      f"{heavy[0]!r} sent more than its fair share of recent events")
        else:
            reason = f"the views are {backlog.events} events behind, at the bound of {self.max_backlog}"
        retry = self._retry_after(backlog, soft)
        if self.metrics is not None:
            for tenant, n in tenants.items():
                self.metrics.ingest_throttled.labels(tenant).inc(n)
        raise Overloaded(f"{reason}; nothing was appended; retry after {retry} s", retry_after=retry)

    def accepted(self, tenants: Counter) -> None:
        now = time.monotonic()
        for tenant, n in tenants.items():
            self._recent.append((now, tenant, n))
            self._by_tenant[tenant] += n
        self._expire(now)

    def _expire(self, now: float) -> None:
        while self._recent and now - self._recent[0][0] > RECENT_SECONDS:
            _, tenant, n = self._recent.popleft()
            self._by_tenant[tenant] -= n
            if self._by_tenant[tenant] <= 0:
                del self._by_tenant[tenant]

    @staticmethod
    def _retry_after(backlog: Backlog, soft: int) -> int:
        """Seconds until the backlog is back under half the bound at the current drain rate, 1..30."""
        if backlog.drain_rate <= 0:
            return 5
        return max(1, min(30, math.ceil((backlog.events - soft) / backlog.drain_rate)))
