#!/bin/bash
# Device run on the CPU-scale zoo builds carried in .gpucarry (prepare.sh): a smoke check, then the benches on CUDA.
# Stop 40 ran the three bench steps (reasoning 130 s, ssm 230 s, core 150 s) and then smoke.py alone. The core step
# drafts with the distilled draft (zoo code-drafts; smoke.py times the code draft), the fastest model draft on CPU.
# The media set (prepare.sh media) runs bench vlm (EAGLE and ViSpec chains, batch 1) and bench image_ar (AR,
# LANTERN, GSD, batch 1 and 8) instead, each under a limit that leaves the call inside 10 minutes.
# usage: bash .gpucarry/run.sh OUTDIR DEVICE QUICK [text|media]
R=${1:-/tmp/gpu}; DEV=${2:-cuda}; QUICK=${3:-0}; SET=${4:-text}
mkdir -p $R/work; export SPECMM_HOME=$PWD/.gpucarry PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
PY=${PY:-python3}
if [ "$DEV" = cuda ]; then python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .gpucarry/whl/*.whl && export PYTHONPATH=$PWD:/tmp/site; fi
pack() { tar czf $R/gpu.tgz -C $R/work . 2>/dev/null; }
step() { local name=$1 t=$2; shift 2; local s=$(date +%s); echo "=== $name start $(date -u +%T)"; echo "$ specmm $*" > $R/work/$name.log
  if [ "$1" = smoke ]; then shift; timeout -k 5 $t $PY .gpucarry/smoke.py "$@" >> $R/work/$name.log 2>&1
  else timeout -k 5 $t $PY -m specmm.cli "$@" >> $R/work/$name.log 2>&1; fi; local rc=$?; echo "=== $name rc=$rc $(( $(date +%s)-s ))s"
  echo "rc=$rc seconds=$(( $(date +%s)-s ))" >> $R/work/$name.log; tail -c 1500 $R/work/$name.log; pack; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; $PY -c "import torch,transformers,sys;print(sys.version,torch.__version__,transformers.__version__,torch.cuda.is_available())"; } > $R/work/env.txt 2>&1; cat $R/work/env.txt
if [ "$SET" = media ]; then
  if [ "$QUICK" = 1 ]; then  # a CPU dry run of the same commands, tiny
    step vlm 300 bench vlm --scale cpu --device $DEV --dtype float32 --compile --methods eagle,vispec --trees chain --batch-sizes 1 --scenes 2 --max-new-tokens 8 --repeats 1 --warmup 1 --out $R/work --name vlm-q
    step image_ar 300 bench image_ar --scale cpu --device $DEV --compile --methods ar,gsd --images 2 --batch-sizes 1 --out $R/work --name image-q
    exit 0
  fi
  step vlm 270 bench vlm --scale cpu --device $DEV --dtype bfloat16 --compile --methods eagle,vispec --trees chain --batch-sizes 1 --temperatures 0 --repeats 2 --warmup 1 --out $R/work --name vlm-captioner-cpu-cuda-bf16-compiled
  step image_ar 240 bench image_ar --scale cpu --device $DEV --compile --methods ar,lantern,gsd --draft-chain 6 3 --gsd-window 30 --gsd-gap 0.5 --gsd-quantile 0.2 --images 32 --batch-sizes 1 8 --dtype bfloat16 --out $R/work --name image_ar-imagegen-cpu-cuda-bf16-compiled
  exit 0
fi
if [ "$QUICK" = 1 ]; then

  step ssm 300 bench ssm --scale cpu --device $DEV --dtype float32 --drafts distilled --targets mamba2 --max-new-tokens 8 --repeats 1 --warmup 1 --out $R/work --name ssm-q
  step core 300 bench core --zoo code --scale cpu --device $DEV --dtype bfloat16 --batch-size 1 --max-new-tokens 8 --repeats 1 --warmup 1 --out $R/work --name core-q
  exit 0
fi
step smoke 130 smoke cuda 128
step core 140 bench core --zoo code --scale cpu --device $DEV --dtype bfloat16 --compile --batch-size 1 --max-new-tokens 128 --drafts distilled --k 4 --depth 4 --top-k 2 --total-tokens 10 --repeats 2 --warmup 1 --out $R/work --name core-code-cpu-cuda-bf16-batch1-compiled
step ssm 180 bench ssm --scale cpu --device $DEV --dtype bfloat16 --compile --drafts distilled --max-new-tokens 128 --repeats 2 --warmup 1 --out $R/work --name ssm-cpu-cuda-bf16-compiled
step reasoning 90 bench reasoning --scale cpu --device $DEV --batch-sizes 64 256 --problems 128 512 --out $R/work --name reasoning-chainarith-cpu-cuda-b64-b256
