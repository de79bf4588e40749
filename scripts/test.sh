#!/usr/bin/env bash
# The whole test suite: installs everything into ./.venv, then runs unit, contract and
# end-to-end tests. Extra arguments go to pytest (e.g. -m unit, -k replay).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
mkdir -p test-artifacts
exec .venv/bin/python -m pytest "$@"
