"""The write path: ingest into the event log, projections that fan events out into views,
the runner that drives them, dead letters and replay."""
