#!/usr/bin/env bash
# Stop servers started by start.sh: SIGTERM (clean shutdown), SIGKILL after a timeout.
#   usage: stop.sh <kafka|neo4j|opensearch|neo4j-lts|all> [--data DIR] [--timeout SECS (default 45)]
# Only the pid recorded in DIR/<name>/<name>.pid is signalled, and only if its command line
# still refers to DIR/<name> (guards against a recycled pid).
set -uo pipefail
source "$(dirname "$0")/common.sh"

[ $# -ge 1 ] || die "usage: stop.sh <kafka|neo4j|opensearch|all> [--data DIR] [--timeout SECS]"
target=$1; shift
root=${MEMSTREAM_SERVERS_DIR:-/tmp/memstream-servers}; timeout=${STOP_TIMEOUT:-45}
while [ $# -gt 0 ]; do
  case $1 in
    --data) root=$2; shift 2;;
    --timeout) timeout=$2; shift 2;;
    *) die "unknown argument $1";;
  esac
done
[ -d "$root" ] && root=$(cd "$root" && pwd)

stop_one() {
  local name=$1 dir=$root/$1 pidf pid t0 i
  pidf=$dir/$name.pid
  if [ ! -f "$pidf" ]; then log "$name: not running (no $pidf)"; return 0; fi
  pid=$(cat "$pidf")
  if kill -0 "$pid" 2>/dev/null; then
    if ! tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -q -- "$dir"; then
      log "$name: pid $pid is not our server any more; removing stale $pidf"; rm -f "$pidf"; return 0
    fi
    t0=$(date +%s.%N)
    kill -TERM "$pid"
    for ((i = 0; i < timeout * 5; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    if kill -0 "$pid" 2>/dev/null; then
      log "$name: still running after ${timeout}s, sending SIGKILL"; kill -KILL "$pid"; sleep 0.5
    fi
    log "$name: stopped pid $pid in $(secs_since "$t0")s"
  else
    log "$name: pid $pid not running (stale pid file)"
  fi
  rm -f "$pidf"
  if [ -f "$dir/$name.cds-pending" ]; then   # class-data archive written at JVM exit
    read -r tmp final < "$dir/$name.cds-pending"
    if [ -s "$tmp" ]; then mv -f "$tmp" "$final" && log "$name: saved JVM class-data archive $(basename "$final")"; fi
    rm -f "$dir/$name.cds-pending" "$tmp"
  fi
}

if [ "$target" = all ]; then
  for n in $ALL_NAMES; do stop_one "$n"; done
else
  check_name "$target"; stop_one "$target"
fi
