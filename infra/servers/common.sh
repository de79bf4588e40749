# Shared helpers for fetch.sh / start.sh / stop.sh. Source it; do not run it.
# Everything heavy lives outside any git clone:
#   $MEMSTREAM_CACHE (default ~/.cache/memstream)/m2                 Maven local repo
#   $MEMSTREAM_CACHE/servers/<name>/lib/                             runtime jars (+ .stamp)
#   $MEMSTREAM_CACHE/servers/<name>/launcher-<hash>.jar              compiled launcher
#   $MEMSTREAM_CACHE/servers/<name>/cds/<key>.jsa                    JVM class-data archive
# Runtime state (data, logs, pid) lives under $MEMSTREAM_SERVERS_DIR (default
# /tmp/memstream-servers)/<name>/, or the --data DIR given to start.sh/stop.sh.
# The health probe runs with $MEMSTREAM_PYTHON (default: the clone's .venv/bin/python, which has
# aiokafka, neo4j and opensearch-py from requirements.lock).

SERVERS_SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$SERVERS_SRC/../.." && pwd)"
MEMSTREAM_CACHE="${MEMSTREAM_CACHE:-$HOME/.cache/memstream}"
M2_REPO="$MEMSTREAM_CACHE/m2"
KNOWN_SERVERS="kafka neo4j opensearch qdrant"
ALL_NAMES="$KNOWN_SERVERS neo4j-lts"   # neo4j-lts: Java 17 fallback (Neo4j 5.26 + GDS 2.13)

die() { echo "ERROR: $*" >&2; exit 1; }
log() { echo "[$(date +%H:%M:%S)] $*" >&2; }

check_name() {
  case " $ALL_NAMES " in *" $1 "*) ;; *) die "unknown server '$1' (one of: $ALL_NAMES)";; esac
}

sha() { cat "$@" | sha256sum | cut -c1-16; }  # content only, not paths
secs_since() { awk -v now="$(date +%s.%N)" -v t="$1" 'BEGIN { printf "%.1f", now - t }'; }  # awk: bc is not everywhere

java_feature_version() {  # $1 = JAVA_HOME; prints 17, 21, 25, ...
  local v
  v=$(sed -n 's/^JAVA_VERSION="\([0-9]*\).*/\1/p' "$1/release" 2>/dev/null)
  [ -n "$v" ] && echo "$v" || "$1/bin/java" -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1
}

# JAVA_HOME to use for a server. Kafka and OpenSearch 2.19 run on the default Java (17+);
# Neo4j 2026.x needs Java 21+: $NEO4J_JAVA_HOME, else the newest JDK >= 21 under /usr/lib/jvm.
server_java_home() {
  local name=$1 min=17 best="" bestv=0 d v
  if [ "$name" = neo4j ]; then
    min=21
    [ -n "${NEO4J_JAVA_HOME:-}" ] && { echo "$NEO4J_JAVA_HOME"; return; }
  else
    if [ -n "${JAVA_HOME:-}" ] && [ -x "$JAVA_HOME/bin/java" ]; then echo "$JAVA_HOME"; return; fi
    d=$(dirname "$(dirname "$(readlink -f "$(command -v java)")")")
    echo "$d"; return
  fi
  for d in /usr/lib/jvm/*/; do
    d=${d%/}
    [ -x "$d/bin/java" ] && [ -x "$d/bin/javac" ] || continue
    v=$(java_feature_version "$d")
    [ -n "$v" ] && [ "$v" -ge "$min" ] && [ "$v" -gt "$bestv" ] && { best=$d; bestv=$v; }
  done
  [ -n "$best" ] || die "no JDK >= $min under /usr/lib/jvm (set NEO4J_JAVA_HOME, or use the Java 17 fallback server neo4j-lts)"
  echo "$best"
}

# The Qdrant server is a native binary, not a jar set: $MEMSTREAM_QDRANT_BIN, else the build provided
# beside the clone (../shared/bin/qdrant, or the build machines' /work/shared/bin/qdrant for a clone
# made elsewhere), else `qdrant` on PATH. Prints nothing when there is none.
qdrant_bin() {
  local b
  for b in "${MEMSTREAM_QDRANT_BIN:-}" "$REPO_ROOT/../shared/bin/qdrant" /work/shared/bin/qdrant "$(command -v qdrant 2>/dev/null || true)"; do
    [ -n "$b" ] && [ -x "$b" ] && { echo "$(cd "$(dirname "$b")" && pwd)/$(basename "$b")"; return 0; }
  done
  return 0
}

server_cache() { echo "$MEMSTREAM_CACHE/servers/$1"; }
server_lib() { echo "$MEMSTREAM_CACHE/servers/$1/lib"; }
pom_hash() { sha "$SERVERS_SRC/$1/pom.xml"; }

# directory holding a server's launcher sources (neo4j-lts shares neo4j's)
launcher_src() { case $1 in neo4j-lts) echo "$SERVERS_SRC/neo4j/src";; *) echo "$SERVERS_SRC/$1/src";; esac; }

# launcher jar path (only neo4j* and opensearch have one); hash over sources + lib stamp
launcher_jar() {
  local name=$1 src
  src=$(launcher_src "$name")
  ls "$src"/*.java >/dev/null 2>&1 || return 0
  echo "$(server_cache "$name")/launcher-$(sha "$src"/*.java "$(server_lib "$name")/.stamp").jar"
}
