#!/usr/bin/env bash
# Cold and warm wall times of every track's bundled suite, for docs/benchmarks.md, without touching results.db:
# each track runs cold (an empty artifact cache of its own, a new database), then warm (the same cache, another new
# database). Run it on an otherwise idle machine; the timings land in WORKDIR/timings.log, one line per run.
#   bash scripts/time_tracks.sh [WORKDIR] [TRACK ...]   (default: /tmp/privbench-times; quick canaries pii users
#                                                         secrets realistic; realistic needs `bash install.sh --realistic`)
set -uo pipefail
cd "$(dirname "$0")/.."
WORK="${1:-/tmp/privbench-times}"
shift || true
TRACKS=("$@")
[ ${#TRACKS[@]} -eq 0 ] && TRACKS=(quick canaries pii users secrets realistic)
mkdir -p "$WORK"
LOG="$WORK/timings.log"
echo "# $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD) threads ${PRIVBENCH_THREADS:-all} $(nproc) cores" | tee -a "$LOG"
for track in "${TRACKS[@]}"; do
  case "$track" in
    pii) args=(--track "$track") ;;   # the track with its anchors only (no bundled suite)
    *) args=(--suite "$track") ;;     # the bundled suite on the track (its defenses added)
  esac
  rm -rf "$WORK/cache-$track" "$WORK/$track-cold.db" "$WORK/$track-warm.db"
  for phase in cold warm; do
    t0=$(date +%s.%N)
    privbench run "${args[@]}" --db "sqlite:///$WORK/$track-$phase.db" --cache "$WORK/cache-$track" -q \
      > "$WORK/$track-$phase.out" 2>&1
    rc=$?
    echo "$track $phase rc=$rc seconds=$(python3 -c "print(round($(date +%s.%N) - $t0, 1))")" | tee -a "$LOG"
  done
done
