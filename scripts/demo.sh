#!/usr/bin/env bash
# The main job on the embedded default: installs everything into ./.venv, then publishes the
# sample conversation through the event log into every view and shows what each view holds.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export MEMSTREAM_DATA_DIR=${MEMSTREAM_DATA_DIR:-.memstream/demo}
rm -rf "$MEMSTREAM_DATA_DIR"
exec .venv/bin/memstream demo "$@"
