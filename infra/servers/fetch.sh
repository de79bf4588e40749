#!/usr/bin/env bash
# Fetch runtime jars for one or more servers with mvn (dependency:copy-dependencies of the
# server's pom.xml) into $MEMSTREAM_CACHE/servers/<name>/lib and compile the small Java launchers.
# Skips all work when lib/.stamp matches the pom's hash and the launcher jar exists.
#   usage: fetch.sh [kafka|neo4j|opensearch|qdrant|neo4j-lts|all]...   (default: all = kafka neo4j opensearch qdrant)
# (qdrant is a native binary: 'fetching' it only checks that it is there, see qdrant_bin in common.sh)
set -euo pipefail
source "$(dirname "$0")/common.sh"

fetch_one() {
  local name=$1 lib stamp want tmp jar jh
  check_name "$name"
  if [ "$name" = qdrant ]; then  # a native binary: nothing to fetch, only to find
    local bin; bin=$(qdrant_bin)
    [ -n "$bin" ] || die "qdrant: no server binary (set MEMSTREAM_QDRANT_BIN, or provide ../shared/bin/qdrant)"
    log "qdrant: $("$bin" --version 2>/dev/null | head -1) at $bin"
    return 0
  fi
  lib=$(server_lib "$name"); want=$(pom_hash "$name")
  stamp=$(cat "$lib/.stamp" 2>/dev/null || true)
  if [ "$stamp" = "$want" ]; then
    log "$name: jars up to date ($lib, pom $want)"
  else
    command -v mvn >/dev/null || die "mvn not found (apt-get install -y maven)"
    log "$name: resolving jars with Maven (pom $want) ..."
    mkdir -p "$(server_cache "$name")" "$M2_REPO"
    tmp="$lib.tmp.$$"; rm -rf "$tmp"
    # pom.xml lives in the source tree; mvn writes nothing there (no target/ for packaging=pom)
    if ! (cd "$SERVERS_SRC/$name" && mvn -q -B -Dstyle.color=never -Dmaven.repo.local="$M2_REPO" \
            dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$tmp" \
            > "$(server_cache "$name")/mvn.log" 2>&1); then
      sed 's/\x1b\[[0-9;]*m//g' "$(server_cache "$name")/mvn.log" | grep -v '^$' | tail -30 >&2
      rm -rf "$tmp"; die "$name: mvn dependency:copy-dependencies failed (log: $(server_cache "$name")/mvn.log)"
    fi
    echo "$want" > "$tmp/.stamp"
    rm -rf "$lib"; mv "$tmp" "$lib"
    log "$name: $(ls "$lib"/*.jar | wc -l) jars, $(du -sh "$lib" | cut -f1)"
  fi
  jar=$(launcher_jar "$name")
  if [ -n "$jar" ] && [ ! -f "$jar" ]; then
    jh=$(server_java_home "$name")
    log "$name: compiling launcher with $jh"
    tmp=$(mktemp -d)
    "$jh/bin/javac" -nowarn -d "$tmp/classes" -cp "$lib/*" "$(launcher_src "$name")"/*.java
    "$jh/bin/jar" cf "$jar.tmp.$$" -C "$tmp/classes" .
    rm -rf "$tmp" "$(server_cache "$name")"/launcher-*.jar "$(server_cache "$name")/cds"
    mv "$jar.tmp.$$" "$jar"
  fi
}

names=("$@"); [ ${#names[@]} -eq 0 ] || [ "${names[0]}" = all ] && names=($KNOWN_SERVERS)
for n in "${names[@]}"; do fetch_one "$n"; done
