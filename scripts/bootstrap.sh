#!/usr/bin/env bash
# Creates ./.venv with everything memstream needs (Python packages and the package itself).
#
# Fast paths, all optional (a fresh machine builds everything from the package index):
# - .venv is reused when requirements.lock and pyproject.toml are unchanged;
# - a template virtualenv per lock hash is kept outside the clone
#   (~/.cache/memstream/venvs/<hash>) and hard-linked into a new clone's .venv in seconds;
# - downloaded wheels are kept in ~/.cache/memstream/wheels.
# Set MEMSTREAM_CACHE to move the cache.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

PYTHON=${PYTHON:-$(command -v python3.11 || command -v python3)}
CACHE=${MEMSTREAM_CACHE:-$HOME/.cache/memstream}
WHEELS=$CACHE/wheels
lock_hash=$(sha256sum requirements.lock | cut -c1-16)
want=$(cat requirements.lock pyproject.toml clients/python/pyproject.toml | sha256sum | cut -c1-16)
STAMP=.venv/.memstream-lock
export PIP_DISABLE_PIP_VERSION_CHECK=1

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && .venv/bin/python -c "import schemas, streams, services, infra, memstream_client" 2>/dev/null; then
  exit 0
fi

"$PYTHON" - <<'PY'
import sys
if sys.version_info < (3, 11):
    sys.exit(f"memstream needs Python >= 3.11, found {sys.version.split()[0]}")
PY

build_template() {  # $1 = directory: a virtualenv with every locked package (not memstream itself)
  local dir=$1
  echo "bootstrap: building dependency environment $dir (first run on this machine takes a few minutes)" >&2
  rm -rf "$dir"
  "$PYTHON" -m venv "$dir"
  mkdir -p "$WHEELS"
  if ! "$dir/bin/pip" install -q --no-index --find-links "$WHEELS" -r requirements.lock 2>/dev/null; then
    # torch first and alone: on machines that carry a local CPU build, pip prefers it.
    "$dir/bin/pip" download -q -d "$WHEELS" "$(grep -E '^torch==' requirements.lock)"
    "$dir/bin/pip" download -q -d "$WHEELS" -r requirements.lock
    "$dir/bin/pip" install -q --no-index --find-links "$WHEELS" -r requirements.lock
  fi
  touch "$dir/.complete"
}

template=$CACHE/venvs/$lock_hash
if [ ! -f "$template/.complete" ] || ! "$template/bin/python" -c "import sys" 2>/dev/null; then
  mkdir -p "$CACHE/venvs"
  build_template "$template"
fi

echo "bootstrap: creating .venv from $template" >&2
rm -rf .venv
# Hard links make the copy instant and take no space; fall back to a real copy across filesystems.
cp -al "$template" .venv 2>/dev/null || cp -a "$template" .venv
# A virtualenv records its own path in scripts and activate files: point them at this clone.
grep -rlI --null "$template" .venv/bin .venv/pyvenv.cfg 2>/dev/null | while IFS= read -r -d '' f; do
  sed "s#$template#$ROOT/.venv#g" "$f" > "$f.new" && chmod --reference="$f" "$f.new" && mv "$f.new" "$f"
done
# memstream and its light client (clients/python: `memstream mcp` is a client of `memstream serve`).
.venv/bin/pip install -q --no-index --no-deps --no-build-isolation -e . -e clients/python
echo "$want" > "$STAMP"
echo "bootstrap: .venv ready" >&2
