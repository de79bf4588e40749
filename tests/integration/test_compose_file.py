"""docker-compose.yml is valid: checked with compose-go (the parser behind `docker compose
config`), built from infra/compose-check with Go, since no Docker client runs here."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def test_compose_file_is_valid(tmp_path):
    if shutil.which("go") is None:
        pytest.skip("INTEGRATION NOT RUN: no `go` on PATH to build infra/compose-check")
    binary = tmp_path / "compose-check"
    build = subprocess.run(["go", "build", "-o", str(binary), "."], cwd=REPO / "infra/compose-check", capture_output=True, text=True, timeout=900)
    assert build.returncode == 0, build.stderr
    unset = subprocess.run([str(binary), str(REPO / "docker-compose.yml")], capture_output=True, text=True, timeout=60,
                           env={k: v for k, v in os.environ.items() if k != "MEMSTREAM_OPS_TOKEN"})
    assert unset.returncode != 0 and "MEMSTREAM_OPS_TOKEN" in unset.stderr + unset.stdout  # no token, no stack
    out = subprocess.run([str(binary), str(REPO / "docker-compose.yml")], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "MEMSTREAM_OPS_TOKEN": "compose-check-token"})
    assert out.returncode == 0, out.stderr
    for service in ("kafka", "neo4j", "qdrant", "opensearch", "keys-init", "memstream", "worker-dense"):
        assert f"  {service}:" in out.stdout
    assert "healthcheck" in out.stdout
