#!/usr/bin/env bash
# The whole test suite: installs everything into ./.venv, starts the real servers the
# integration tier needs (infra/servers: one broker for the whole run, on free ports, state in a
# temporary directory outside the clone, stopped on exit), then runs unit, contract, end-to-end
# and integration tests. Extra arguments go to pytest (e.g. -m unit, -k replay).
#
# A server address already in the environment (MEMSTREAM_TEST_KAFKA=host:port) is used as is.
# Locally, a missing tool (Java, Maven, kcat) only makes the tests that need it skip, loudly;
# under CI=true it fails the run (here, and in tests/conftest.py for any skipped integration test).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
mkdir -p test-artifacts

ci=false
case "${CI:-}" in true|TRUE|True|1) ci=true;; esac
missing() {  # $1 = what is missing and why it matters
  if $ci; then echo "test.sh: ERROR: $1 (CI=true: every test tier must run)" >&2; exit 1; fi
  echo "test.sh: WARNING: $1; the tests that need it will be skipped" >&2
}

sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo -n"
apt_install() { $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null 2>&1; }  # apt_install [OPTION...] PACKAGE...

# kcat: a foreign (librdkafka) producer for the Kafka integration tests.
if ! command -v kcat >/dev/null 2>&1; then
  echo "test.sh: installing kcat with apt-get" >&2
  apt_install kcat || { $sudo apt-get update -qq >/dev/null 2>&1 && apt_install kcat; } || missing "could not install kcat with apt-get"
fi

# jq: the curl example of docs/agents.md picks the positions out with it (tests/e2e/test_agent_examples.py).
if ! command -v jq >/dev/null 2>&1; then
  echo "test.sh: installing jq with apt-get" >&2
  apt_install jq || { $sudo apt-get update -qq >/dev/null 2>&1 && apt_install jq; } || missing "could not install jq with apt-get"
fi

# prometheus + promtool: config/alert checks and a real scrape (tests/integration/test_prometheus.py).
# The tests start their own prometheus on a free port; a system service the package may start is not used
# (--no-install-recommends: no prometheus-node-exporter service either).
if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then
  echo "test.sh: installing prometheus (prometheus, promtool) with apt-get" >&2
  apt_install --no-install-recommends prometheus \
    || { $sudo apt-get update -qq >/dev/null 2>&1 && apt_install --no-install-recommends prometheus; } \
    || missing "could not install prometheus (prometheus, promtool) with apt-get"
fi

# Chromium (Debian's package, never a Playwright browser download) and playwright-core (npm,
# tests/browser/package-lock.json) for the dashboard browser test (tests/e2e/test_dashboard_browser.py).
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1
if [ ! -x "${MEMSTREAM_CHROMIUM:-/usr/bin/chromium}" ]; then
  echo "test.sh: installing chromium with apt-get" >&2
  apt_install chromium fonts-liberation || { $sudo apt-get update -qq >/dev/null 2>&1 && apt_install chromium fonts-liberation; } \
    || missing "could not install chromium with apt-get (the dashboard browser test needs it)"
fi
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  missing "no node/npm (Node.js >= 20) for the dashboard browser test"
elif [ ! -f tests/browser/node_modules/.package-lock.json ] \
     || [ tests/browser/package-lock.json -nt tests/browser/node_modules/.package-lock.json ]; then
  echo "test.sh: npm ci in tests/browser" >&2
  (cd tests/browser && npm ci --no-audit --no-fund --prefer-offline >&2) \
    || missing "npm ci in tests/browser failed (the dashboard browser test needs playwright-core)"
fi

# The TypeScript client (clients/typescript): typescript and openapi-typescript from npm, for its
# build and its tests against a live `memstream serve` (tests/e2e/test_clients.py).
if command -v npm >/dev/null 2>&1; then
  if [ ! -f clients/typescript/node_modules/.package-lock.json ] \
     || [ clients/typescript/package-lock.json -nt clients/typescript/node_modules/.package-lock.json ]; then
    echo "test.sh: npm ci in clients/typescript" >&2
    (cd clients/typescript && npm ci --no-audit --no-fund --prefer-offline >&2) \
      || missing "npm ci in clients/typescript failed (the TypeScript client's test needs it)"
  fi
fi

# mem0ai's release wheel (not installed: its source is read) for the Mem0-compatible surface's
# signature test (tests/unit/test_mem0_signatures.py), pinned by hash, kept in the wheel cache.
MEM0_WHEEL=${MEMSTREAM_CACHE:-$HOME/.cache/memstream}/wheels/mem0ai-2.2.1-py3-none-any.whl
if [ ! -f "$MEM0_WHEEL" ]; then
  .venv/bin/pip download -q --no-deps -d "$(dirname "$MEM0_WHEEL")" mem0ai==2.2.1 >&2 || missing "could not download mem0ai 2.2.1's wheel"
fi
if [ -f "$MEM0_WHEEL" ]; then export MEMSTREAM_MEM0_WHEEL=$MEM0_WHEEL; fi

# Real servers: Kafka, OpenSearch, Neo4j + GDS and Qdrant (start.sh prints KAFKA_BOOTSTRAP=... /
# OPENSEARCH_URL=... / NEO4J_URI=... / QDRANT_URL=..., exported below as MEMSTREAM_TEST_*; neo4j needs
# a JDK >= 21, which start.sh finds beside the default JDK; qdrant is the native binary at
# ../shared/bin/qdrant or $MEMSTREAM_QDRANT_BIN).
SERVERS=${MEMSTREAM_TEST_SERVERS-kafka opensearch neo4j qdrant}
[ -n "${MEMSTREAM_TEST_KAFKA:-}" ] && SERVERS=${SERVERS//kafka/}
[ -n "${MEMSTREAM_TEST_OPENSEARCH:-}" ] && SERVERS=${SERVERS//opensearch/}
[ -n "${MEMSTREAM_TEST_NEO4J:-}" ] && SERVERS=${SERVERS//neo4j/}
[ -n "${MEMSTREAM_TEST_QDRANT:-}" ] && SERVERS=${SERVERS//qdrant/}
export MEMSTREAM_PYTHON=$PWD/.venv/bin/python
state=$(mktemp -d "${TMPDIR:-/tmp}/memstream-test-servers.XXXXXX")
export MEMSTREAM_TEST_SERVERS_STATE=$state  # <state>/<server>/: the erasure tests scan the servers' data files
rc=1
cleanup() {  # every server of the list, also one whose start was interrupted (its JVM runs detached)
  for server in $SERVERS; do infra/servers/stop.sh "$server" --data "$state" || true; done
  if [ "$rc" = 0 ]; then rm -rf "$state"; else echo "test.sh: server state and logs kept in $state" >&2; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM   # run the EXIT trap (stop the servers) on Ctrl-C / kill too
# Authentication on: Kafka with SASL/SCRAM (user memstream), Neo4j with a password (user neo4j),
# fresh random secrets per run, handed to the tests as MEMSTREAM_TEST_*_USERNAME/_PASSWORD (a
# server given from outside brings its own, in the same variables).
secret() { .venv/bin/python -c "import secrets; print(secrets.token_urlsafe(24))"; }
case " $SERVERS " in *" kafka "*)
  export KAFKA_SASL_PASSWORD=$(secret) MEMSTREAM_TEST_KAFKA_USERNAME=memstream
  export MEMSTREAM_TEST_KAFKA_PASSWORD=$KAFKA_SASL_PASSWORD;; esac
case " $SERVERS " in *" neo4j "*)
  export NEO4J_PASSWORD=$(secret) MEMSTREAM_TEST_NEO4J_USERNAME=neo4j
  export MEMSTREAM_TEST_NEO4J_PASSWORD=$NEO4J_PASSWORD;; esac
read -r KAFKA_PORT KAFKA_CONTROLLER_PORT NEO4J_BOLT_PORT OPENSEARCH_PORT OPENSEARCH_TRANSPORT_PORT QDRANT_HTTP_PORT QDRANT_GRPC_PORT \
  < <(.venv/bin/python -c "from tests.integration.servers import free_ports; print(*free_ports(7))")
export KAFKA_PORT KAFKA_CONTROLLER_PORT NEO4J_BOLT_PORT OPENSEARCH_PORT OPENSEARCH_TRANSPORT_PORT QDRANT_HTTP_PORT QDRANT_GRPC_PORT
for server in $SERVERS; do
  if [ "$server" != qdrant ] && ! command -v java >/dev/null 2>&1; then missing "no java on PATH to run $server"; continue; fi
  infra/servers/fetch.sh "$server" || { missing "could not fetch the $server jars (or find the qdrant binary)"; continue; }
  out=$(infra/servers/start.sh "$server" --data "$state") || { missing "$server did not start"; continue; }
  case $out in
    KAFKA_BOOTSTRAP=*) export MEMSTREAM_TEST_KAFKA=${out#*=};;
    NEO4J_URI=*) export MEMSTREAM_TEST_NEO4J=${out#*=};;
    OPENSEARCH_URL=*) export MEMSTREAM_TEST_OPENSEARCH=${out#*=};;
    QDRANT_URL=*) export MEMSTREAM_TEST_QDRANT=${out#*=};;
  esac
done

# junit.xml: every test's duration, for the time each part of the suite costs. Faulthandler: a
# native crash of the test process (one SIGABRT seen in a long run) prints every thread's stack.
PYTHONFAULTHANDLER=1 .venv/bin/python -m pytest --junitxml=test-artifacts/junit.xml "$@" && rc=0 || rc=$?
exit "$rc"
