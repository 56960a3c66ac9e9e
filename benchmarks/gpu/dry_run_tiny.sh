#!/bin/bash
# The GPU plan's bench commands (h100-second/run.sh, all three sets) at the zoo's tiny scale, on this CPU, under CUDA
# graphs' rules (graph_rules.py), in float32 and bfloat16: every compiled row of every step must run clean and exact.
# Unlike run.sh's QUICK dry run it needs no CPU-scale zoo builds (the tiny ones train in seconds, into a scratch
# SPECMM_HOME), so it fits before any device call: about 5 minutes on 2 cores. It exits 1 if any command fails.
# usage: bash benchmarks/gpu/dry_run_tiny.sh [WORK]   (from the repository root, with .venv installed)
set -u
W=${1:-/tmp/specmm-dry-run}; rm -rf "$W/out"; mkdir -p "$W/out"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} SPECMM_HOME=${SPECMM_HOME:-$W/home} PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
PY=${PY:-.venv/bin/python}; O="--device cpu --out $W/out"; failed=0
run() {  # run NAME specmm-args...
  local name=$1; shift; local s=$(date +%s)
  $PY benchmarks/gpu/graph_rules.py "$@" > "$W/$name.log" 2>&1; local rc=$?
  echo "$name: rc=$rc $(( $(date +%s) - s ))s, $(grep '^graph rules: ' "$W/$name.log" | tail -1)"
  [ $rc = 0 ] || { failed=1; tr '\r' '\n' < "$W/$name.log" | grep -v 'it/s\]\|s/it\]' | tail -20; }
}
for B in float32 bfloat16; do
  run core-$B bench core --zoo code --scale tiny $O --dtype $B --compile --batch-size 1 --max-new-tokens 8 \
    --drafts distilled --no-lookup --no-profile --repeats 1 --warmup 1 --name core-$B
  run vlm-$B bench vlm --scale tiny $O --dtype $B --compile --methods eagle,vispec --trees chain --batch-sizes 1 \
    --temperatures 0 --scenes 2 --max-new-tokens 8 --no-profile --repeats 1 --warmup 1 --name vlm-$B
  for target in mamba2 hybrid; do
    run ssm-$target-$B bench ssm --scale tiny $O --dtype $B --compile --no-eager --no-profile --drafts distilled \
      --targets $target --max-new-tokens 8 --repeats 1 --warmup 1 --name ssm-$B
  done
  run image-$B bench image_ar --scale tiny $O --dtype $B --compile --methods ar,lantern,gsd-drafter --draft-chain 6 3 \
    --images 2 --batch-sizes 1 2 --name image-$B
done
run reasoning bench reasoning --scale tiny $O --compile --batch-sizes 4 --problems 4 --specreason-thresholds 6 \
  --arbitrage-thresholds 0.5 --max-new-tokens 16 --name reasoning
exit $failed
