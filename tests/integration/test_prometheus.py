"""Prometheus and Grafana for the distributed stack (infra/prometheus, infra/grafana).

- promtool accepts the scrape config and the alert rules, and the rules' unit tests
  (infra/prometheus/alerts.test.yml: STALLED and LAGGING fire on synthetic series, OK does not) pass;
- every PromQL expression of the Grafana dashboard and of the alerts names only metrics a real
  `memstream serve` exposes on /metrics;
- a real Prometheus scrapes a real `memstream serve`: after events are processed it holds the
  lag of all four projections with the values /metrics reports, the alert rules load and evaluate,
  and every dashboard expression is valid PromQL there.

Needs `prometheus` and `promtool` (Debian: apt-get install prometheus; scripts/test.sh installs
them). Without them the tests skip loudly; under CI=true tests/conftest.py makes that a failure.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from schemas.ports.views import VIEW_NAMES
from tests.e2e.helpers import sample_items
from tests.integration.servers import free_ports, memstream_serve

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
PROM_DIR = REPO / "infra/prometheus"
CONFIG = PROM_DIR / "prometheus.yml"
ALERTS = PROM_DIR / "alerts.yml"
ALERTS_TEST = PROM_DIR / "alerts.test.yml"
DASHBOARD = REPO / "infra/grafana/dashboards/memstream.json"
COMPOSE = REPO / "docker-compose.yml"


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"INTEGRATION NOT RUN: no `{name}` on PATH (apt-get install prometheus, which brings prometheus and "
                    f"promtool; scripts/test.sh installs it)")
    return path


def promtool(*args: str) -> str:
    out = subprocess.run([tool("promtool"), *args], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"promtool {' '.join(args)} failed:\n{out.stdout}\n{out.stderr}"
    return out.stdout + out.stderr


def wait_until(check, timeout: float, what: str, interval: float = 0.5):
    """Calls check() until it returns something truthy; fails with the last value/error."""
    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        try:
            last = check()
            if last:
                return last
        except (httpx.HTTPError, AssertionError, KeyError, ValueError) as exc:
            last = exc
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout}s waiting for {what}; last: {last!r}")


# -- PromQL: the metric names an expression reads --------------------------------------------
PROMQL_FUNCTIONS = {
    "sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk", "bottomk", "quantile", "count_values", "group",
    "rate", "irate", "increase", "delta", "idelta", "deriv", "predict_linear", "resets", "changes",
    "histogram_quantile", "abs", "absent", "absent_over_time", "ceil", "floor", "round", "clamp", "clamp_min", "clamp_max",
    "label_replace", "label_join", "sort", "sort_desc", "time", "timestamp", "vector", "scalar", "sgn", "exp", "ln",
    "log2", "log10", "sqrt", "avg_over_time", "min_over_time", "max_over_time", "sum_over_time", "count_over_time",
    "last_over_time", "quantile_over_time", "present_over_time", "stddev_over_time",
}
PROMQL_KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left", "group_right",
                   "inf", "nan"}


def promql_metric_names(expr: str) -> set[str]:
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    e = re.sub(r"\{[^}]*\}", "", e)  # label matchers (may hold $variables)
    e = re.sub(r"\[[^\]]*\]", "", e)  # range selectors ([5m], [$__rate_interval])
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)  # label lists
    names = set()
    for m in re.finditer(r"(?<![\w.$])[A-Za-z_:][A-Za-z0-9_:]*", e):
        token, rest = m.group(), e[m.end():].lstrip()
        if rest.startswith("("):
            assert token in PROMQL_FUNCTIONS or token in PROMQL_KEYWORDS, f"unknown PromQL function {token!r} in {expr!r}"
        elif token.lower() not in PROMQL_KEYWORDS:
            names.add(token)
    return names


def test_promql_metric_names_parser():
    assert promql_metric_names('histogram_quantile(0.95, sum by (le) (rate(a_bucket{job="x", l=~"$v"}[$__rate_interval])))') == {"a_bucket"}
    assert promql_metric_names("max by (projection) (a{s=\"STALLED\"}) == 1 unless on (projection) max by (projection) (b) == 1") == {"a", "b"}
    assert promql_metric_names("sum by (projection) (max by (projection, partition) (c)) > 1e3") == {"c"}


def exposed_sample_names(metrics_text: str) -> set[str]:
    """Every sample name the families of a /metrics page can produce (whether or not a labelled
    family has samples yet): counter X -> X_total, histogram X -> X_bucket/_sum/_count, ..."""
    suffixes = {"counter": ("_total", "_created"), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count", "_created"),
                "summary": ("", "_sum", "_count", "_created"), "untyped": ("",), "unknown": ("",), "info": ("_info",)}
    names = set()
    for fam in text_string_to_metric_families(metrics_text):
        names.update(fam.name + s for s in suffixes[fam.type])
        names.update(s.name for s in fam.samples)
    return names


def dashboard_exprs() -> list[tuple[str, str]]:
    dash = json.loads(DASHBOARD.read_text())
    exprs = [(p["title"], t["expr"]) for p in dash["panels"] for t in p.get("targets", [])]
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            exprs.append((f"variable {var['name']}", re.sub(r"label_values\((\w+),\s*\w+\)", r"\1", var["definition"])))
    return exprs


def alert_rules() -> dict[str, str]:
    """alert name -> expr of infra/prometheus/alerts.yml (block or one-line expressions)."""
    rules, text = {}, ALERTS.read_text()
    for m in re.finditer(r"- alert: (\w+)\n(?:\s+#.*\n)*\s+expr: (?:\|\n((?:\s{10,}.*\n)+)|(.*)\n)", text):
        rules[m.group(1)] = " ".join((m.group(2) or m.group(3)).split())
    return rules


def concrete(expr: str) -> str:
    """A dashboard expression with Grafana's variables filled in, as Prometheus receives it."""
    return expr.replace("$__rate_interval", "1m").replace("$projection", ".*")


# -- (a) promtool ------------------------------------------------------------------------------
def test_prometheus_config_is_valid(tmp_path):
    """Fully checked (rule files, credentials files) as it is deployed: the ops-token secret that
    docker-compose.yml mounts at /run/secrets/ is a temporary file here."""
    text = CONFIG.read_text()
    assert text.count("credentials_file: /run/secrets/memstream_ops_token") == 2  # the query service and the workers
    assert "syntax" in promtool("check", "config", "--syntax-only", str(CONFIG))
    token = tmp_path / "memstream_ops_token"
    token.write_text("test-token")
    deployed = tmp_path / "prometheus.yml"
    deployed.write_text(text.replace("/run/secrets/memstream_ops_token", str(token)))
    (tmp_path / "alerts.yml").write_text(ALERTS.read_text())
    out = promtool("check", "config", str(deployed))
    assert "is valid prometheus config file syntax" in out and "1 rule files found" in out, out


def test_alert_rules_are_valid():
    out = promtool("check", "rules", str(ALERTS))
    assert f"SUCCESS: {len(alert_rules())} rules found" in out, out
    rules = alert_rules()
    assert {"MemstreamProjectionStalled", "MemstreamProjectionLagging", "MemstreamDeadLettersPending",
            "MemstreamProjectionLagHigh"} <= rules.keys()
    assert 'memstream_projection_status{status="STALLED"}' in rules["MemstreamProjectionStalled"]
    assert 'memstream_projection_status{status="LAGGING"}' in rules["MemstreamProjectionLagging"]


def test_alert_rules_unit_tests_pass():
    """STALLED fires after 1m and LAGGING after 5m on synthetic series; OK never alerts."""
    out = promtool("test", "rules", str(ALERTS_TEST))
    assert "SUCCESS" in out and "FAILED" not in out, out


def test_scrape_targets_match_the_compose_services():
    config, compose = CONFIG.read_text(), COMPOSE.read_text()
    assert '"memstream:8080"' in config and '"--port", "8080"' in compose
    assert 'MEMSTREAM_OPS_WORKER_METRICS_PORT: "9100"' in compose
    for view in VIEW_NAMES:
        assert f"- worker-{view}:9100" in config
        assert f'worker-{view}:\n    <<: *worker\n    command: ["memstream", "worker", "--projection", "{view}"]' in compose
    assert "./infra/prometheus:/etc/prometheus:ro" in compose
    assert "./infra/grafana/dashboards:/var/lib/grafana/dashboards:ro" in compose
    assert "path: /var/lib/grafana/dashboards" in (REPO / "infra/grafana/provisioning/dashboards/memstream.yml").read_text()


# -- a real memstream server -------------------------------------------------------------------
@pytest.fixture(scope="module")
def memstream_served(tmp_path_factory):
    """`memstream serve` (embedded log, projections in-process) on a free port, with an admin key
    and an ops token."""
    with memstream_serve(tmp_path_factory.mktemp("memstream-serve")) as served:
        yield served


def ops_headers(served) -> dict[str, str]:
    return {"Authorization": f"Bearer {served.ops_token}"}


def metrics_samples(served, name: str) -> dict[tuple, float]:
    """{sorted label items: value} of one sample name on /metrics."""
    text = httpx.get(f"{served.url}/metrics", headers=ops_headers(served), timeout=30).text
    return {tuple(sorted(s.labels.items())): s.value for fam in text_string_to_metric_families(text) for s in fam.samples
            if s.name == name}


# -- (b) the dashboard and the alerts only read metrics memstream exposes --------------------
def test_grafana_dashboard_is_well_formed():
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] and dash["title"] and dash["schemaVersion"] >= 36
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    types = {p["type"] for p in dash["panels"]}
    assert {"timeseries", "stat", "state-timeline"} <= types
    for p in dash["panels"]:
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["targets"] and all(t["expr"].strip() and t["refId"] for t in p["targets"]), p["title"]
        assert set(p["gridPos"]) == {"x", "y", "w", "h"} and p["gridPos"]["x"] + p["gridPos"]["w"] <= 24, p["title"]
    exprs = " ".join(e for _, e in dashboard_exprs())
    # the panels of /dashboard: lag (events, seconds), throughput, freshness p95, query p50/p95, dead letters, status, paused
    for needed in ("memstream_projection_lag_events", "memstream_projection_lag_seconds", "memstream_projection_processing_rate",
                   "histogram_quantile(0.95, sum by (le) (rate(memstream_event_searchable_seconds_bucket",
                   "histogram_quantile(0.5, sum by (strategy, le) (rate(memstream_query_latency_seconds_bucket",
                   "histogram_quantile(0.95, sum by (strategy, le) (rate(memstream_query_latency_seconds_bucket",
                   "memstream_dead_letters_pending", "memstream_projection_status", "memstream_projection_paused",
                   # forgetting: pending forgets, the oldest one's age, request -> complete, retention per tenant and its last sweep
                   "memstream_forgets_pending", "memstream_forget_oldest_pending_seconds",
                   "histogram_quantile(0.95, sum by (le) (rate(memstream_forget_complete_seconds_bucket",
                   "memstream_tenant_retention_days", "memstream_retention_last_sweep_timestamp_seconds"):
        assert needed in exprs, needed
    datasources = (REPO / "infra/grafana/provisioning/datasources/prometheus.yml").read_text()
    assert "type: prometheus" in datasources and "url: http://prometheus:9090" in datasources


def test_metrics_need_the_ops_token_or_an_admin_key(memstream_served):
    url = memstream_served.url
    assert httpx.get(f"{url}/metrics", timeout=30).status_code == 401
    assert httpx.get(f"{url}/metrics", headers={"Authorization": "Bearer wrong"}, timeout=30).status_code == 401
    assert httpx.get(f"{url}/metrics", headers=ops_headers(memstream_served), timeout=30).status_code == 200
    assert httpx.get(f"{url}/metrics", headers=memstream_served.headers, timeout=30).status_code == 200


def test_dashboard_and_alerts_only_use_metrics_memstream_exposes(memstream_served):
    exposed = exposed_sample_names(httpx.get(f"{memstream_served.url}/metrics", headers=ops_headers(memstream_served), timeout=30).text)
    assert "memstream_projection_lag_events" in exposed and "memstream_query_latency_seconds_bucket" in exposed
    assert "memstream_projection_records_total" in exposed and "memstream_projection_records" not in exposed
    exprs = dashboard_exprs() + [(f"alert {name}", expr) for name, expr in alert_rules().items()]
    assert len(exprs) > 10
    unknown = {}
    for where, expr in exprs:
        names = promql_metric_names(expr)
        assert names, f"{where}: no metric in {expr!r}"
        missing = names - exposed - {"up"}  # `up` is Prometheus' own, per target
        if missing:
            unknown[where] = sorted(missing)
    assert not unknown, f"expressions read metrics /metrics does not expose: {unknown}"


# -- (c) a real Prometheus scraping the real server -------------------------------------------
@pytest.fixture
def prometheus(tmp_path, memstream_served):
    """Our own Prometheus on a free port (never a system service the package may have started),
    scraping the memstream server every second with the ops token from a credentials file, as
    infra/prometheus/prometheus.yml does, with infra/prometheus/alerts.yml loaded."""
    binary = tool("prometheus")
    [port] = free_ports(1)
    target = memstream_served.url.removeprefix("http://")
    token_file = tmp_path / "memstream_ops_token"
    token_file.write_text(memstream_served.ops_token)
    token_file.chmod(0o600)
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"rule_files: [{json.dumps(str(ALERTS))}]\n"
        "scrape_configs:\n"
        "  - job_name: memstream\n"
        f"    authorization: {{type: Bearer, credentials_file: {json.dumps(str(token_file))}}}\n"
        f"    static_configs: [{{targets: [{json.dumps(target)}]}}]\n"
    )
    promtool("check", "config", str(config))
    log = open(tmp_path / "prometheus.log", "w")
    proc = subprocess.Popen([binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}"], cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        def ready():
            assert proc.poll() is None, f"prometheus exited with {proc.returncode}:\n{(tmp_path / 'prometheus.log').read_text()[-4000:]}"
            return httpx.get(f"{url}/-/ready", timeout=5).status_code == 200

        wait_until(ready, 60, "prometheus /-/ready")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
        log.close()


def prom_query(url: str, expr: str) -> list[dict]:
    r = httpx.get(f"{url}/api/v1/query", params={"query": expr}, timeout=30)
    body = r.json()
    assert r.status_code == 200 and body["status"] == "success", f"{expr!r}: {r.status_code} {body}"
    return body["data"]["result"]


def by_labels(result: list[dict], *labels: str) -> dict[tuple, float]:
    return {tuple(s["metric"].get(label) for label in labels): float(s["value"][1]) for s in result}


def test_prometheus_scrapes_projection_lag_and_loads_the_alerts(memstream_served, prometheus):
    items = sample_items()
    url, admin = memstream_served.url, memstream_served.headers
    r = httpx.post(f"{url}/v1/events", json={"events": items}, headers=admin, timeout=60)
    assert r.status_code == 200, r.text
    positions = r.json()["positions"]
    w = httpx.post(f"{url}/v1/wait", json={"positions": positions, "timeout_seconds": 120}, headers=admin, timeout=150)
    assert w.json().get("caught_up") is True, w.text
    s = httpx.post(f"{url}/v1/search", json={"question": "Where are Ada and Maya going?", "tenant_id": "demo"}, headers=admin,
                   timeout=120)
    assert s.status_code == 200, s.text
    total = sum(positions.values())
    assert total == len(items)

    # Prometheus has a scrape taken after the events were processed: every view at the log's end.
    def processed():
        pos = by_labels(prom_query(prometheus, "sum by (projection) (memstream_projection_position)"), "projection")
        return pos if pos == {(v,): float(total) for v in VIEW_NAMES} else None

    wait_until(processed, 60, f"prometheus to scrape every projection at position {total}")

    lag = by_labels(prom_query(prometheus, "memstream_projection_lag_events"), "projection", "partition")
    assert {p for p, _ in lag} == set(VIEW_NAMES), lag
    direct = {(dict(k)["projection"], dict(k)["partition"]): v
              for k, v in metrics_samples(memstream_served, "memstream_projection_lag_events").items()}
    assert lag == direct, "Prometheus and /metrics disagree on lag_events"
    assert set(lag.values()) == {0.0}, lag
    pos = by_labels(prom_query(prometheus, "memstream_projection_position"), "projection", "partition")
    direct_pos = {(dict(k)["projection"], dict(k)["partition"]): v
                  for k, v in metrics_samples(memstream_served, "memstream_projection_position").items()}
    assert pos == direct_pos and sum(pos.values()) == total * len(VIEW_NAMES)
    lag_s = by_labels(prom_query(prometheus, "memstream_projection_lag_seconds"), "projection", "partition")
    assert {p for p, _ in lag_s} == set(VIEW_NAMES) and set(lag_s.values()) == {0.0}, lag_s

    # The query service's own counters and histograms arrive too.
    wait_until(lambda: prom_query(prometheus, "memstream_query_latency_seconds_count >= 1"), 30, "a scraped query latency")
    wait_until(lambda: prom_query(prometheus, "memstream_event_searchable_seconds_count > 0"), 30, "a scraped freshness observation")

    # Every dashboard expression is valid PromQL for this Prometheus; the key panels have data.
    for where, expr in dashboard_exprs():
        prom_query(prometheus, concrete(expr))
    panels = {p["title"]: p["targets"][0]["expr"] for p in json.loads(DASHBOARD.read_text())["panels"]}
    assert by_labels(prom_query(prometheus, concrete(panels["Lag (events)"])), "projection") == {(v,): 0.0 for v in VIEW_NAMES}
    assert by_labels(prom_query(prometheus, concrete(panels["Status per projection"])), "projection") == \
        {(v,): 0.0 for v in VIEW_NAMES}, "every projection should be OK (0) after catching up"
    assert by_labels(prom_query(prometheus, concrete(panels["Paused"])), "projection") == {(v,): 0.0 for v in VIEW_NAMES}
    assert by_labels(prom_query(prometheus, concrete(panels["Forgets pending"]))) == {(): 0.0}, "no forget was requested"

    # The alert rules are loaded and evaluate without error; none fires on a healthy pipeline.
    expected = set(alert_rules())

    def rules_evaluated():
        body = httpx.get(f"{prometheus}/api/v1/rules", timeout=30).json()
        assert body["status"] == "success", body
        rules = {r["name"]: r for g in body["data"]["groups"] for r in g["rules"] if r["type"] == "alerting"}
        assert set(rules) == expected, f"loaded {sorted(rules)}, expected {sorted(expected)}"
        return rules if all(r["health"] == "ok" for r in rules.values()) else None

    rules = wait_until(rules_evaluated, 30, "the alert rules to be evaluated")
    assert all(not r.get("lastError") for r in rules.values()), rules
    firing = [a for r in rules.values() for a in r.get("alerts", []) if a["state"] == "firing"]
    assert not firing, firing
