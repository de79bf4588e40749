"""The operations dashboard in a real browser (headless Chromium driven by playwright-core).

A `memstream serve` subprocess on a temporary data directory runs the four projections
in-process. With `lexical` paused, N events go in: the other projections catch up, /metrics
and `memstream status` report a lexical lag of N, and the dashboard (polling /v1/ops/snapshot)
shows the same lag with the state "paused". Resumed, lexical catches up and the dashboard,
/metrics and the CLI say 0 / "running".

Python does the HTTP and CLI steps; tests/browser/dashboard_check.mjs opens /dashboard, waits
until a projection's row shows a lag and a state, and prints what it saw as JSON. The browser is
the system Chromium (Debian `chromium`, $MEMSTREAM_CHROMIUM to override), never a Playwright
download; scripts/test.sh installs it and runs `npm ci` in tests/browser. Without node,
Chromium or tests/browser/node_modules the test skips loudly, and under CI=true (integration
marker, tests/conftest.py) that skip is a failure.

The screenshot of the paused state goes to test-artifacts/dashboard.png, and to
docs/dashboard.png (the picture in docs/operations.md) only with MEMSTREAM_UPDATE_SCREENSHOT=1.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import turn
from tests.e2e.helpers import metric_samples
from tests.integration.servers import embedded_env, memstream_serve

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

REPO = Path(__file__).resolve().parents[2]
BROWSER_DIR = REPO / "tests/browser"
SCRIPT = BROWSER_DIR / "dashboard_check.mjs"
BIN = Path(sys.executable).with_name("memstream")
CHROMIUM = os.environ.get("MEMSTREAM_CHROMIUM", "/usr/bin/chromium")
PROJECTIONS = ("hierarchy", "graph", "lexical", "dense")
PAUSED = "lexical"
N_EVENTS = 12
TIMEOUT = 60.0  # every wait; the machine may be small and shared (no timing assertions)
STARTUP_TIMEOUT = 180.0  # `memstream serve` loads the real models before /healthz answers


@pytest.fixture
def node() -> str:
    """The `node` binary, or a loud skip naming what is missing and how to get it (before any
    server starts)."""
    hint = "scripts/test.sh installs it (apt-get install chromium; npm ci in tests/browser)"
    node = shutil.which("node")
    if node is None:
        pytest.skip(f"BROWSER TEST NOT RUN: no `node` on PATH (Node.js >= 20); {hint}")
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        pytest.skip(f"BROWSER TEST NOT RUN: no Chromium at {CHROMIUM} (set MEMSTREAM_CHROMIUM); {hint}")
    if not (BROWSER_DIR / "node_modules/playwright-core/package.json").is_file():
        pytest.skip(f"BROWSER TEST NOT RUN: {BROWSER_DIR / 'node_modules'} is missing playwright-core "
                    f"(run `npm ci` in tests/browser); {hint}")
    return node


class Server:
    def __init__(self, base: str, data_dir: Path, proc: subprocess.Popen, log_path: Path, headers: dict, ops_token: str):
        self.base, self.data_dir, self.proc, self.log_path = base, data_dir, proc, log_path
        self.headers, self.ops_token = headers, ops_token

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def request(self, method: str, path: str, body=None) -> tuple[int, bytes]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers={**self.headers, **({"content-type": "application/json"} if data is not None else {})})
        try:
            with urllib.request.urlopen(req, timeout=TIMEOUT) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def json(self, method: str, path: str, body=None, expect: int = 200):
        status, raw = self.request(method, path, body)
        assert status == expect, f"{method} {path}: HTTP {status}: {raw[:2000]!r}"
        return json.loads(raw)

    def snapshot(self) -> dict[str, dict]:
        return {p["name"]: p for p in self.json("GET", "/v1/ops/snapshot")["projections"]}

    def metrics_lag(self) -> dict[str, float]:
        """Sum over partitions of memstream_projection_lag_events, per projection."""
        status, raw = self.request("GET", "/metrics")
        assert status == 200, f"/metrics: HTTP {status}"
        lag: dict[str, float] = {}
        for name, labels, value in metric_samples(raw.decode()):
            if name == "memstream_projection_lag_events":
                assert "partition" in labels, (name, labels)
                lag[labels["projection"]] = lag.get(labels["projection"], 0.0) + value
        return lag


@pytest.fixture
def server(tmp_path):
    with memstream_serve(tmp_path, STARTUP_TIMEOUT) as served:
        yield Server(served.url, served.data_dir, served.proc, served.log_path, served.headers, served.ops_token)


def wait_until(what: str, probe, timeout: float = TIMEOUT):
    """Poll `probe()` until it returns something truthy; fail with its last value otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        last = probe()
        if last:
            return last
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.25)


def cli_status(data_dir: Path) -> dict[str, dict]:
    proc = subprocess.run([str(BIN), "status", "--json", "--settle", "0"], env=embedded_env(data_dir), capture_output=True,
                          text=True, timeout=TIMEOUT * 3)
    assert proc.returncode == 0, f"memstream status failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return {p["name"]: p for p in json.loads(proc.stdout)["projections"]}


def browser_check(node: str, server: Server, projection: str, lag: int, state: str, screenshot: Path | None = None) -> dict:
    """Run tests/browser/dashboard_check.mjs; its JSON result (it also prints it, for -s runs)."""
    args = [node, str(SCRIPT), "--url", server.base, "--projection", projection, "--lag", str(lag), "--state", state,
            "--timeout", str(int(TIMEOUT * 1000)), "--chromium", CHROMIUM]
    if screenshot is not None:
        args += ["--screenshot", str(screenshot)]
    proc = subprocess.run(args, cwd=BROWSER_DIR, capture_output=True, text=True, timeout=TIMEOUT * 4,
                          env={**os.environ, "MEMSTREAM_OPS_TOKEN": server.ops_token})
    lines = proc.stdout.strip().splitlines()
    try:
        result = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        pytest.fail(f"dashboard_check.mjs printed no JSON (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    print(f"\ndashboard_check {projection} lag={lag} {state}: {json.dumps(result)}")
    assert proc.returncode == 0 and result["ok"], f"browser check failed (exit {proc.returncode}): {result}\n{proc.stderr}"
    return result


def assert_clean_page(result: dict) -> None:
    """Every request the page made succeeded and no script error was thrown. Chromium's own
    /favicon.ico request is not a page request: its 404 shows only as a console message
    without a URL, tolerated while no page request failed."""
    assert result["http_status"] == 200
    assert result["failed_requests"] == [], result["failed_requests"]
    unexpected = [e for e in result["console_errors"]
                  if not e.startswith("Failed to load resource: the server responded with a status of 404")]
    assert unexpected == [], unexpected


def test_dashboard_shows_a_paused_projection_lag_and_its_recovery(node, server):
    artifacts = REPO / "test-artifacts"
    artifacts.mkdir(exist_ok=True)
    shot = artifacts / "dashboard.png"
    shot.unlink(missing_ok=True)

    # 1. lexical paused; the others keep running.
    paused = server.json("POST", f"/v1/admin/projections/{PAUSED}/pause", {"reason": "dashboard browser test"})
    assert paused["name"] == PAUSED and paused["paused"] is True, paused
    wait_until(f"{PAUSED} to show as paused in /v1/ops/snapshot", lambda: server.snapshot()[PAUSED]["paused"])

    # 2. N events in; everything but lexical catches up.
    events = [json.loads(turn(i, conv="dashboard", text=f"dashboard check {i}: the lexical index is paused").model_dump_json())
              for i in range(N_EVENTS)]
    published = server.json("POST", "/v1/events", events)
    assert published["accepted"] == N_EVENTS and published["rejected"] == 0, published

    def caught_up_but_lexical():
        snap = server.snapshot()
        assert set(snap) == set(PROJECTIONS), snap.keys()
        others = all(p["lag_events"] == 0 for name, p in snap.items() if name != PAUSED)
        return snap if others and snap[PAUSED]["lag_events"] == N_EVENTS else None

    snap = wait_until(f"every projection but {PAUSED} to catch up", caught_up_but_lexical, timeout=TIMEOUT * 2)
    assert snap[PAUSED]["paused"] and all(not p["paused"] for name, p in snap.items() if name != PAUSED)

    # 3. The same lag on /metrics (summed over partitions) and in `memstream status`.
    metrics = server.metrics_lag()
    assert set(metrics) == set(PROJECTIONS), metrics
    lexical_lag = int(metrics[PAUSED])
    assert metrics[PAUSED] == lexical_lag == N_EVENTS, metrics
    assert all(v == 0 for name, v in metrics.items() if name != PAUSED), metrics
    status = cli_status(server.data_dir)
    assert status[PAUSED]["lag_events"] == lexical_lag and status[PAUSED]["paused"] is True, status[PAUSED]
    assert all(p["lag_events"] == 0 and not p["paused"] for name, p in status.items() if name != PAUSED), status

    # 4. The dashboard shows it: lag N, paused; the lag chart has a lexical line.
    seen = browser_check(node, server, PAUSED, lexical_lag, "paused", screenshot=shot)
    assert seen["signed_in"]  # the page asked for the ops token first
    assert_clean_page(seen)
    assert seen["projections"] == list(PROJECTIONS)
    assert seen["forgets_pending"] == "0" and seen["retention"] == [], "the forgetting panel renders (no forget, no retention here)"
    assert seen["lag_events"] == str(lexical_lag) and seen["state"] == "paused"
    assert float(seen["lag_seconds"]) > 0
    assert PAUSED in seen["charts"]["chart-lag-events"], seen["charts"]
    assert shot.is_file() and shot.stat().st_size > 10_000 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if os.environ.get("MEMSTREAM_UPDATE_SCREENSHOT") == "1":
        (REPO / "docs").mkdir(exist_ok=True)
        shutil.copyfile(shot, REPO / "docs/dashboard.png")

    # 5. Resumed: lexical catches up, and the dashboard, /metrics and the CLI say so.
    resumed = server.json("POST", f"/v1/admin/projections/{PAUSED}/resume", {"reason": "dashboard browser test"})
    assert resumed["name"] == PAUSED and resumed["paused"] is False, resumed
    seen = browser_check(node, server, PAUSED, 0, "running")
    assert_clean_page(seen)
    assert seen["lag_events"] == "0" and seen["state"] == "running" and seen["status"] == "OK"
    assert f"over {N_EVENTS} events" in seen["freshness"], seen["freshness"]  # now visible in every view
    metrics = server.metrics_lag()
    assert metrics[PAUSED] == 0 and all(v == 0 for v in metrics.values()), metrics
    status = cli_status(server.data_dir)
    assert all(p["lag_events"] == 0 and not p["paused"] for p in status.values()), status
