"""The operator's view of the pipeline, sampled on one clock.

`OpsMonitor.sample()` reads each projection's positions and the log's end offsets once
(Pipeline.status), evaluates health over a sliding window (services/ops/health.py), sets the
Prometheus gauges, and appends a point to a short history for the dashboard's charts. `/metrics`,
`/v1/ops/snapshot` (the dashboard) and `memstream status` all read a sample taken this way, so
their lag figures agree.

It works whoever runs the projections: positions come from the views' own stores, so in Kafka
mode (faust workers elsewhere) the query service still sees every view's lag and rate.

Forgetting (services/ops/forgets.py): the forget requests not yet complete (the eraser and every
view past them), the request -> complete time, and each tenant's retention with its last sweep
(the audit trail's records on the control topic, streams/audit.py).

Freshness (log append -> visible in every view): when the minimum position over all views
moves on a partition, the records it passed are read back from the log and each is observed
as (sample time - append time). Resolution is therefore the sampling interval (1 s default);
at most `freshness_cap` records per partition are read per sample (the rest are not observed).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from datetime import datetime, timezone

from services.ops.health import STATUSES, HealthWindow, Sample
from services.audit import tenant_rows
from services.ops.forgets import ForgetTracker
from services.ops.metrics import Metrics
from streams.audit import AuditTrail
from streams.dlq import list_dead_letters
from streams.pipeline import Pipeline

log = logging.getLogger(__name__)


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


class OpsMonitor:
    def __init__(self, pipeline: Pipeline, metrics: Metrics, *, interval: float = 1.0, window_seconds: float = 30.0,
                 history_seconds: float = 600.0, freshness_cap: int = 2000, mode: str = "embedded",
                 observe_freshness: bool = True, observe_forgets: bool | None = None, audit: AuditTrail | None = None):
        self.pipeline = pipeline
        self.metrics = metrics
        self.interval = interval
        self.window_seconds = window_seconds
        self.freshness_cap = freshness_cap
        self.mode = mode
        self.observe_freshness = observe_freshness
        # Like freshness, pending forgets need every view's positions: the query service's sampler
        # sees them all, a worker's may run one projection.
        observe_forgets = observe_freshness if observe_forgets is None else observe_forgets
        self.audit = audit or AuditTrail(pipeline.log, pipeline.config.topic)
        self.forgets = ForgetTracker(pipeline.log, pipeline.config.topic, pipeline.keystore, metrics) if observe_forgets else None
        self._retention_tenants: set[str] = set()
        self._health = {v: HealthWindow(window_seconds) for v in pipeline.views}
        self._history: deque[dict] = deque(maxlen=max(10, int(history_seconds / interval)))
        self._visible: dict[int, int] | None = None  # min position over views, per partition
        self._freshness: deque[tuple[float, float]] = deque(maxlen=5000)  # (at, seconds)
        self._queries: deque[tuple[float, str, float]] = deque(maxlen=5000)  # (at, strategy, ms)
        self._dlq_end: dict[int, int] | None = None
        self._dead_letters: list = []
        self._last: dict | None = None
        self._lock = asyncio.Lock()

    # -- inputs ----------------------------------------------------------------------------
    def query_done(self, strategy: str, total_ms: float, stages_ms: dict[str, float]) -> None:
        self.metrics.query_done(strategy, total_ms, stages_ms)
        self._queries.append((time.time(), strategy, total_ms))

    # -- sampling --------------------------------------------------------------------------
    async def sample(self, max_age: float = 0.0) -> dict:
        """A fresh snapshot (or the last one if it is younger than `max_age` seconds)."""
        async with self._lock:
            if self._last is None or time.time() - self._last["time"] > max_age:
                self._last = await self._sample()
            # Query latency is recorded as queries happen: never serve it from a cached sample.
            return {**self._last, "queries": self._query_summary(time.time())}

    async def _sample(self) -> dict:
        now = time.time()
        statuses = await self.pipeline.status()
        m = self.metrics
        projections = []
        for st in statuses:
            for p, off in st.end_offsets.items():
                m.end_offset.labels(self.pipeline.config.topic, str(p)).set(off)
            errors = m.error_count(st.view)
            window = self._health[st.view]
            window.add(Sample(now, sum(st.positions.values()), st.lag_events, errors))
            status = "ERROR" if st.unavailable else window.status()
            rate = window.rate()
            partitions = []
            for p, off in sorted(st.end_offsets.items()):
                pos = st.positions.get(p, 0)
                lag = max(0, off - pos)
                lag_s = st.partition_lag_seconds.get(p, 0.0)
                m.position.labels(st.view, str(p)).set(pos)
                m.lag_events.labels(st.view, str(p)).set(lag)
                m.lag_seconds.labels(st.view, str(p)).set(lag_s)
                partitions.append({"partition": p, "end_offset": off, "position": pos, "lag_events": lag, "lag_seconds": lag_s})
            m.rate.labels(st.view).set(rate)
            m.paused.labels(st.view).set(1 if st.paused else 0)
            for name in STATUSES:
                m.status.labels(st.view, name).set(1 if name == status else 0)
            projections.append({
                "name": st.view, "backend": st.backend, "generation": st.generation, "paused": st.paused, "status": status,
                "lag_events": st.lag_events, "lag_seconds": st.lag_seconds, "rate": round(rate, 2), "errors": errors,
                "last_error": st.unavailable or (m.last_error_reason(st.view) if status in ("ERROR", "STALLED") else None),
                "rebuilding": st.rebuilding, "partitions": partitions,
            })
        if self.observe_freshness:
            await self._observe_freshness(statuses, now)
        forgetting = await self._forgetting(statuses, now)
        dead = await self._dead_letter_summary()
        queries = self._query_summary(now)
        freshness = self._freshness_summary(now)
        point = {
            "time": now,
            "lag_events": {p["name"]: p["lag_events"] for p in projections},
            "lag_seconds": {p["name"]: p["lag_seconds"] for p in projections},
            "rate": {p["name"]: p["rate"] for p in projections},
            "freshness_p95": freshness["p95_seconds"],
            "query_p50_ms": queries["all"]["p50_ms"],
            "query_p95_ms": queries["all"]["p95_ms"],
            "forgets_pending": forgetting["pending"],
        }
        self._history.append(point)
        return {
            "time": now, "mode": self.mode, "log_backend": self.pipeline.log.backend, "topic": self.pipeline.config.topic,
            "window_seconds": self.window_seconds, "projections": projections,
            "freshness": freshness, "queries": queries, "dead_letters": dead, "forgetting": forgetting,
        }

    async def _observe_freshness(self, statuses, now: float) -> None:
        end = statuses[0].end_offsets if statuses else {}
        visible = {p: min(st.positions.get(p, 0) for st in statuses) for p in end}
        if self._visible is None:  # the first sample only sets the baseline
            self._visible = visible
            return
        for p, new in visible.items():
            old = self._visible.get(p, 0)
            if new <= old:
                continue
            records = await self.pipeline.log.read(self.pipeline.config.topic, p, old, max_records=min(new - old, self.freshness_cap))
            for rec in records:
                if rec.offset >= new:
                    break
                seconds = max(0.0, now - rec.append_time)
                self.metrics.freshness.observe(seconds)
                self._freshness.append((now, seconds))
        self._visible = visible

    async def _forgetting(self, statuses, now: float) -> dict:
        await self.audit.refresh()
        if self.forgets is not None:
            out = await self.forgets.sample(statuses, now)
        else:
            out = {"pending": None, "oldest_pending_seconds": None, "pending_requests": [], "completed": None}
        out["retention"] = self._retention(datetime.fromtimestamp(now, timezone.utc))
        return out

    def _retention(self, now: datetime) -> list[dict]:
        """Tenants with a retention setting, each with its last sweep: the newest retention forget
        the audit trail has (the eraser completed it somewhere) or the tracker saw requested."""
        rows = [r for r in tenant_rows(self.audit, now) if r["retain_days"]]
        pending = self.forgets.pending_ids() if self.forgets is not None else set()
        for r in rows:
            sweep, tenant = r["last_sweep"], r["tenant_id"]
            seen = self.forgets.last_retention_request(tenant) if self.forgets is not None else None
            if seen is not None and (sweep is None or (sweep["forget_id"] != seen.event_id
                                                       and datetime.fromisoformat(sweep["requested_at"]) < seen.requested_at)):
                sweep = r["last_sweep"] = {"forget_id": seen.event_id, "requested_at": seen.requested_at.isoformat(),
                                           "occurred_before": seen.scope.occurred_before.isoformat() if seen.scope.occurred_before else None,
                                           "complete": True, "completed_at": None, "keys_destroyed": None}
            if sweep is not None:
                sweep["complete"] = sweep["complete"] and sweep["forget_id"] not in pending
                self.metrics.retention_last_sweep.labels(tenant).set(datetime.fromisoformat(sweep["requested_at"]).timestamp())
            self.metrics.retention_days.labels(tenant).set(r["retain_days"])
        now_set = {r["tenant_id"] for r in rows}
        for gone in self._retention_tenants - now_set:  # a cleared setting leaves the metrics
            for gauge in (self.metrics.retention_days, self.metrics.retention_last_sweep):
                try:
                    gauge.remove(gone)
                except KeyError:
                    pass
        self._retention_tenants = now_set
        return rows

    def _freshness_summary(self, now: float) -> dict:
        recent = [s for at, s in self._freshness if now - at <= 300]
        return {"window_seconds": 300, "count": len(recent), "p50_seconds": round(_quantile(recent, 0.5), 3),
                "p95_seconds": round(_quantile(recent, 0.95), 3)}

    def _query_summary(self, now: float) -> dict:
        recent = [(s, ms) for at, s, ms in self._queries if now - at <= 300]
        out = {"all": {"count": len(recent), "p50_ms": round(_quantile([ms for _, ms in recent], 0.5), 2),
                       "p95_ms": round(_quantile([ms for _, ms in recent], 0.95), 2)}}
        for strategy in sorted({s for s, _ in recent}):
            values = [ms for s, ms in recent if s == strategy]
            out[strategy] = {"count": len(values), "p50_ms": round(_quantile(values, 0.5), 2), "p95_ms": round(_quantile(values, 0.95), 2)}
        return out

    async def _dead_letter_summary(self) -> dict:
        topic = self.pipeline.config.dlq_topic
        end = await self.pipeline.log.end_offsets(topic)
        if end != self._dlq_end:  # re-read the topic only when it grew
            self._dead_letters = await list_dead_letters(self.pipeline.log, topic)
            self._dlq_end = end
        pending = [e for e in self._dead_letters if not e.replayed]
        self.metrics.dlq_pending.set(len(pending))
        recent = [{"origin": e.origin, "projections": e.projections, "reason": e.reason, "replayed": e.replayed}
                  for e in self._dead_letters[-20:]]
        return {"pending": len(pending), "total": len(self._dead_letters), "recent": recent}

    def history(self) -> list[dict]:
        return list(self._history)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.sample()
            except Exception:  # noqa: BLE001 - a failed sample (e.g. a store restarting) must not end monitoring
                log.exception("ops sample failed")
            try:
                await asyncio.wait_for(stop.wait(), timeout=self.interval)
            except asyncio.TimeoutError:
                pass
