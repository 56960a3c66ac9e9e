#!/bin/bash
# The GPU plan (h100-second/run.sh) as its QUICK dry run, all three sets, in float32 and bfloat16, at the zoo's tiny
# scale: every compiled row of every step runs on this CPU under CUDA graphs' rules (graph_rules.py) and must be
# clean and exact. Unlike QUICK at the cpu scale it needs no CPU-scale builds or carry folder (the tiny builds train
# in seconds, into WORK/home), so it fits before any device call: about 6 minutes on 2 cores. Exits 1 if a step failed.
# usage: bash benchmarks/gpu/dry_run_tiny.sh [WORK]   (from the repository root, with .venv installed)
set -u
W=${1:-/tmp/specmm-dry-run}; rm -rf "$W/out"; mkdir -p "$W"; failed=0
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} PY=${PY:-$PWD/.venv/bin/python} SCALE=tiny ZOO=${ZOO:-$W/home} BUDGET=3600
for dtype in float32 bfloat16; do
  for set in core-vlm text media; do
    echo "### $set, $dtype"
    QUICK_DTYPE=$dtype WORK=$W/$set-$dtype bash benchmarks/gpu/h100-second/run.sh "$W/out" cpu $set 1 > "$W/$set-$dtype.log" 2>&1 \
      || failed=1
    grep '^=== \|^graph rules: ' "$W/$set-$dtype.log"
  done
done
exit $failed
