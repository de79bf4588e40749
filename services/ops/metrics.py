"""Prometheus metrics (prometheus-client), one registry per process.

Names are part of the operator contract (alerts and the Grafana dashboard under infra/
use them):

  memstream_log_end_offset{topic,partition}                  gauge
  memstream_projection_position{projection,partition}        gauge   committed position
  memstream_projection_lag_events{projection,partition}      gauge
  memstream_projection_lag_seconds{projection,partition}     gauge   append time of the oldest unprocessed record
  memstream_projection_processing_rate{projection}           gauge   records/s over the health window
  memstream_projection_paused{projection}                    gauge   1 while paused
  memstream_projection_status{projection,status}             gauge   1 for the current status (OK/LAGGING/STALLED/ERROR)
  memstream_projection_records_total{projection}             counter records applied by this process
  memstream_projection_errors_total{projection}              counter failed batches in this process
  memstream_projection_last_error_info{projection,reason}    gauge   1 for the reason of the last failed batch (until one succeeds)
  memstream_projection_dead_letters_total{projection}        counter records this process sent to the DLQ
  memstream_dead_letters_pending                             gauge   dead-lettered records not yet re-driven
  memstream_event_searchable_seconds                         histogram log append -> visible in every view
  memstream_query_latency_seconds{strategy}                  histogram
  memstream_query_stage_seconds{strategy,stage}              histogram
  memstream_http_requests_total{endpoint,method,code}        counter
  memstream_http_request_errors_total{endpoint}              counter 5xx answers
  memstream_forgets_pending                                  gauge   forget requests not yet complete (eraser and every view past them)
  memstream_forget_oldest_pending_seconds                    gauge   age (since requested_at) of the oldest pending forget; 0 when none
  memstream_forget_complete_seconds                          histogram requested_at -> complete (eraser and every view past it)
  memstream_tenant_retention_days{tenant}                    gauge   a tenant's retention setting (tenants without one: absent)
  memstream_retention_last_sweep_timestamp_seconds{tenant}   gauge   requested_at of the tenant's newest retention forget

Gauges about the log and positions are set by services/ops/monitor.py from the same sample the
dashboard and `memstream status` show, so the three always agree. The forget and retention
metrics come from the query service's sampler (services/ops/forgets.py), which sees every view;
a worker exports them at 0 / without tenants.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from services.ops.health import STATUSES

LATENCY_BUCKETS = (0.002, 0.005, 0.01, 0.015, 0.025, 0.04, 0.06, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
FRESHNESS_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0)
FORGET_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0, 3600.0, 6 * 3600.0, 86400.0)


class Metrics:
    """Implements streams.runner.RunnerMetrics and records queries and HTTP requests."""

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.end_offset = Gauge("memstream_log_end_offset", "Offset the next appended record gets", ["topic", "partition"], registry=r)
        self.position = Gauge("memstream_projection_position", "Committed position of the projection", ["projection", "partition"], registry=r)
        self.lag_events = Gauge("memstream_projection_lag_events", "Records appended but not yet in the view", ["projection", "partition"], registry=r)
        self.lag_seconds = Gauge("memstream_projection_lag_seconds", "Age (log append time) of the oldest record not yet in the view",
                                 ["projection", "partition"], registry=r)
        self.rate = Gauge("memstream_projection_processing_rate", "Records per second over the health window", ["projection"], registry=r)
        self.paused = Gauge("memstream_projection_paused", "1 while an operator has paused the projection", ["projection"], registry=r)
        self.status = Gauge("memstream_projection_status", "1 for the projection's current health status", ["projection", "status"], registry=r)
        self.records = Counter("memstream_projection_records", "Records applied to the view by this process", ["projection"], registry=r)
        self.errors = Counter("memstream_projection_errors", "Failed batches in this process (retried)", ["projection"], registry=r)
        self.last_error = Gauge("memstream_projection_last_error_info", "1 for the reason of a projection's last failed batch in this process "
                                "(the error's kind and its first words; cleared when a batch succeeds)", ["projection", "reason"], registry=r)
        self._last_reason: dict[str, str] = {}
        self.dead_letters = Counter("memstream_projection_dead_letters", "Records this process sent to the dead-letter topic",
                                    ["projection"], registry=r)
        self.dlq_pending = Gauge("memstream_dead_letters_pending", "Dead-lettered records not yet re-driven (memstream dlq replay)", registry=r)
        self.freshness = Histogram("memstream_event_searchable_seconds", "From log append until the record is visible in every view",
                                   buckets=FRESHNESS_BUCKETS, registry=r)
        self.query_latency = Histogram("memstream_query_latency_seconds", "Search latency", ["strategy"], buckets=LATENCY_BUCKETS, registry=r)
        self.stage_latency = Histogram("memstream_query_stage_seconds", "Search latency per stage", ["strategy", "stage"],
                                       buckets=LATENCY_BUCKETS, registry=r)
        self.requests = Counter("memstream_http_requests", "HTTP requests", ["endpoint", "method", "code"], registry=r)
        self.request_errors = Counter("memstream_http_request_errors", "HTTP requests answered with a 5xx", ["endpoint"], registry=r)
        self.ingest_backlog = Gauge("memstream_ingest_backlog_events", "Events the furthest-behind unpaused view has not processed, "
                                    "as seen by the last publish", registry=r)
        self.ingest_backlog_limit = Gauge("memstream_ingest_backlog_limit_events", "MEMSTREAM_API_MAX_BACKLOG (0: no bound)", registry=r)
        self.ingest_throttled = Counter("memstream_ingest_throttled_events", "Events refused with 429 backlog_full (backpressure; "
                                        "a key's rate limit is counted in memstream_http_requests)", ["tenant"], registry=r)
        self.forgets_pending = Gauge("memstream_forgets_pending", "Forget requests not yet complete (the eraser or a view is not past them)",
                                     registry=r)
        self.forget_oldest_pending = Gauge("memstream_forget_oldest_pending_seconds", "Age (since requested_at) of the oldest pending forget",
                                           registry=r)
        self.forget_complete = Histogram("memstream_forget_complete_seconds", "From a forget's requested_at until the eraser and every view "
                                         "are past it", buckets=FORGET_BUCKETS, registry=r)
        self.retention_days = Gauge("memstream_tenant_retention_days", "A tenant's retention: turns older than this are forgotten",
                                    ["tenant"], registry=r)
        self.retention_last_sweep = Gauge("memstream_retention_last_sweep_timestamp_seconds", "requested_at of the tenant's newest "
                                          "retention forget", ["tenant"], registry=r)

    # -- streams.runner.RunnerMetrics ----------------------------------------------------
    def batch_done(self, view: str, records: int, dead_letters: int, seconds: float, append_times: list[float]) -> None:
        self.records.labels(view).inc(records)
        if records and self._last_reason.get(view):
            self.last_error.remove(view, self._last_reason.pop(view))
        if dead_letters:
            self.dead_letters.labels(view).inc(dead_letters)

    def batch_failed(self, view: str, error: BaseException) -> None:
        self.errors.labels(view).inc()
        reason = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:160]
        previous = self._last_reason.get(view)
        if previous != reason:
            if previous is not None:
                self.last_error.remove(view, previous)
            self.last_error.labels(view, reason).set(1)
            self._last_reason[view] = reason

    def last_error_reason(self, view: str) -> str | None:
        return self._last_reason.get(view)

    def error_count(self, view: str) -> int:
        return int(self.errors.labels(view)._value.get())

    # -- queries -------------------------------------------------------------------------
    def query_done(self, strategy: str, total_ms: float, stages_ms: dict[str, float]) -> None:
        self.query_latency.labels(strategy).observe(total_ms / 1000)
        for stage, ms in stages_ms.items():
            if stage != "total":
                self.stage_latency.labels(strategy, stage).observe(ms / 1000)

    def render(self) -> bytes:
        return generate_latest(self.registry)


STATUS_NAMES = STATUSES
