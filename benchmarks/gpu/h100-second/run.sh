#!/bin/bash
# Device run of stop 46 on the CPU-scale zoo builds carried by prepare.sh: the benches on CUDA in bfloat16 with
# compiled (CUDA-graph) rows. Every step runs under its own limit, cut to what is left of the call's BUDGET seconds;
# a bench writes its report after each timed round, and the work folder (WORK, default /tmp/gpu-work) is packed into
# OUTDIR/gpu-SET.tgz after every step, so a step stopped at its limit still leaves what it wrote.
# usage: bash FOLDER/run.sh OUTDIR [DEVICE [SET [QUICK]]]   SET: core-vlm (bench core, vlm: issue 17) | text (bench
# ssm, reasoning at batch 256: issues 18, 25) | media (bench image_ar: issue 18); QUICK=1: a tiny CPU dry run of the
# same commands, compiled rows included, under CUDA graphs' rules (../graph_rules.py: graph outputs overwritten at the
# next step, in-place writes only into static tensors, no device-less factories); a step whose rules are broken
# exits 1. It checks arguments, paths and those rules, not speed. The steps as they stand are the plan for the next
# device session, rewritten after stop 46's two calls (README.md says what those ran). SCALE (default cpu) and ZOO
# (default this folder, the carried builds) set the zoo scale and home: ../dry_run_tiny.sh runs QUICK at the tiny scale.
C=$(cd "$(dirname "$0")" && pwd); R=${1:-/tmp/gpu}; DEV=${2:-cuda}; SET=${3:-text}; QUICK=${4:-0}
T0=$(date +%s); BUDGET=${BUDGET:-540}; FAILED=0
SCALE=${SCALE:-cpu}  # the zoo scale of every step: cpu (the carried builds), tiny (../dry_run_tiny.sh)
W=${WORK:-/tmp/gpu-work}; rm -rf $W; mkdir -p $R $W; export SPECMM_HOME=${ZOO:-$C} PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
PY=${PY:-python3}
RUN="-m specmm.cli"; [ "$QUICK" = 1 ] && RUN="$PWD/benchmarks/gpu/graph_rules.py"
if [ "$DEV" = cuda ]; then $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
  $C/whl/*.whl && export PYTHONPATH=$PWD:/tmp/site; fi
pack() { tar czf $R/gpu-$SET.tgz -C $W . 2>/dev/null; }
step() {  # step NAME LIMIT specmm-args...
  local name=$1 limit=$2; shift 2; local s=$(date +%s); local left=$(( T0 + BUDGET - s - 8 ))
  [ $left -lt $limit ] && limit=$left
  if [ $limit -lt 20 ]; then echo "=== $name skipped: ${left}s left"; echo "skipped, ${left}s left" > $W/$name.log; pack; return; fi
  echo "=== $name start $(date -u +%T) limit ${limit}s"; echo "$ specmm $*" > $W/$name.log
  timeout -k 5 $limit $PY $RUN "$@" >> $W/$name.log 2>&1; local rc=$?
  [ $rc = 0 ] || FAILED=1
  echo "rc=$rc seconds=$(( $(date +%s)-s ))" >> $W/$name.log; echo "=== $name rc=$rc $(( $(date +%s)-s ))s"
  grep -v "it/s\]\|s/it\]" $W/$name.log | tail -c 1200; pack; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  $PY -c "import torch,transformers,sys;print(sys.version,torch.__version__,transformers.__version__,torch.cuda.is_available())"
  nproc; } > $W/env.txt 2>&1; cat $W/env.txt
B=bfloat16; O="--out $W"
if [ "$QUICK" = 1 ]; then B=${QUICK_DTYPE:-float32}; fi  # QUICK_DTYPE=bfloat16: the dry run in the GPU run's dtype
if [ "$SET" = text ]; then
  if [ "$QUICK" = 1 ]; then
    step ssm-mamba2 600 bench ssm --scale $SCALE --device $DEV --dtype $B --compile --no-eager --no-profile --drafts distilled --targets mamba2 --max-new-tokens 8 --repeats 1 --warmup 1 $O --name ssm-q
    step ssm-hybrid 600 bench ssm --scale $SCALE --device $DEV --dtype $B --compile --no-eager --no-profile --drafts distilled --targets hybrid --max-new-tokens 8 --repeats 1 --warmup 1 $O --name ssm-q
    step reasoning 600 bench reasoning --scale $SCALE --device $DEV --compile --batch-sizes 4 --problems 4 --specreason-thresholds 6 --arbitrage-thresholds 0.5 --max-new-tokens 16 $O --name reasoning-q
    exit $FAILED
  fi
  step ssm-mamba2 250 bench ssm --scale $SCALE --device $DEV --dtype $B --compile --no-eager --no-profile --drafts distilled --targets mamba2 --max-new-tokens 128 --repeats 2 --warmup 1 $O --name ssm-cpu-cuda-bf16-compiled
  step reasoning 150 bench reasoning --scale $SCALE --device $DEV --batch-sizes 256 --problems 512 --specreason-thresholds 6 --arbitrage-thresholds 0.5 $O --name reasoning-chainarith-cpu-cuda-b256
  step ssm-hybrid 150 bench ssm --scale $SCALE --device $DEV --dtype $B --compile --no-eager --no-profile --drafts distilled --targets hybrid --max-new-tokens 128 --repeats 2 --warmup 1 $O --name ssm-cpu-cuda-bf16-compiled
elif [ "$SET" = core-vlm ]; then
  if [ "$QUICK" = 1 ]; then
    step core 600 bench core --zoo code --scale $SCALE --device $DEV --dtype $B --compile --batch-size 1 --max-new-tokens 8 --drafts distilled --no-lookup --no-profile --repeats 1 --warmup 1 $O --name core-q
    step vlm 600 bench vlm --scale $SCALE --device $DEV --dtype $B --compile --methods eagle,vispec --trees chain --batch-sizes 1 --temperatures 0 --scenes 2 --max-new-tokens 8 --no-profile --repeats 1 --warmup 1 $O --name vlm-q
    exit $FAILED
  fi
  # each compiled row compiles for about a minute on the H100 machine (stop 46): no lookup rows, no profiled runs
  step core 220 bench core --zoo code --scale $SCALE --device $DEV --dtype $B --compile --batch-size 1 --max-new-tokens 128 --drafts distilled --no-lookup --no-profile --repeats 2 --warmup 1 $O --name core-code-cpu-cuda-bf16-batch1-compiled
  step vlm 220 bench vlm --scale $SCALE --device $DEV --dtype $B --compile --methods eagle,vispec --trees chain --batch-sizes 1 --temperatures 0 --scenes 4 --no-profile --repeats 2 --warmup 1 $O --name vlm-captioner-cpu-cuda-bf16-compiled
else
  if [ "$QUICK" = 1 ]; then
    step image_ar 600 bench image_ar --scale $SCALE --device $DEV --dtype $B --compile --methods ar,lantern,gsd-drafter --draft-chain 6 3 --images 2 --batch-sizes 1 2 $O --name image-q
    exit $FAILED
  fi
  step image_ar 300 bench image_ar --scale $SCALE --device $DEV --dtype $B --compile --methods ar,lantern,gsd-drafter --draft-chain 6 3 --images 32 --batch-sizes 1 8 $O --name image_ar-imagegen-cpu-cuda-bf16-compiled
fi
echo "=== done $(( $(date +%s)-T0 ))s"
