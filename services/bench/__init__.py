"""`memstream bench …`: benchmarks that run against a live deployment (not tests: no assertions)."""
