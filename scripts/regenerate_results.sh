#!/usr/bin/env bash
# Regenerate the shipped results.db from scratch: every track once (each cold, in its own artifact cache, then
# warm, for the wall times in docs/benchmarks.md), then the paper trends. Writes results.db.new and the timings
# log next to it; move results.db.new over results.db when it completes. Takes a few hours on 2 CPU cores.
#   bash scripts/regenerate_results.sh [WORKDIR]      (default: /tmp/privbench-regen)
set -uo pipefail
cd "$(dirname "$0")/.."
WORK="${1:-/tmp/privbench-regen}"
DB="sqlite:///$PWD/results.db.new"
mkdir -p "$WORK"
LOG="$WORK/timings.log"
run_timed() {   # name, cache, db, privbench args...
  local name="$1" cache="$2" db="$3"; shift 3
  local t0=$(date +%s)
  privbench run "$@" --db "$db" --cache "$cache" -q > "$WORK/$name.out" 2>&1
  local rc=$?
  echo "$name rc=$rc seconds=$(( $(date +%s) - t0 ))" | tee -a "$LOG"
}
for track in quick canaries pii users secrets; do
  case "$track" in
    quick|canaries|users|secrets) args=(--suite "$track") ;;   # the bundled suite on the track (its defenses added)
    *) args=(--track "$track") ;;                               # the track with its anchors only
  esac
  run_timed "$track-cold" "$WORK/cache-$track" "$DB" "${args[@]}"
  run_timed "$track-warm" "$WORK/cache-$track" "sqlite:///$WORK/warm-$track.db" "${args[@]}"
done
t0=$(date +%s)
privbench trends --db "$DB" --cache "$WORK/cache-trends" -q --format json > "$WORK/trends.json" 2> "$WORK/trends.err"
echo "trends rc=$? seconds=$(( $(date +%s) - t0 ))" | tee -a "$LOG"
