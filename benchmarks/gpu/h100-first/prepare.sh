#!/bin/bash
# Prepare .gpucarry/ (git-ignored) for a device call that runs the benches on the CPU-scale zoo builds:
# the builds (large weight files stored bf16 to fit the 64 MiB transfer limit), diffusers as a wheel (the device
# image lacks it), and this folder's scripts. Both sets do not fit one transfer, so there are two:
#   text (default; bench core, ssm, reasoning) after
#     specmm zoo build code && specmm zoo build code-drafts && specmm zoo build ssm-code
#     && specmm zoo build ssm-code-drafts && specmm zoo build chainarith
#   media (bench vlm, image_ar) after  specmm zoo build captioner-drafters && specmm zoo build imagegen
# Run from the repository root: `bash benchmarks/gpu/h100-first/prepare.sh [text|media]`; then device run, carry
# [".gpucarry"], command `bash .gpucarry/run.sh $OUT/r cuda 0 SET; cp $OUT/r/gpu.tgz $OUT/` (SET as prepared).
set -euo pipefail
set_name=${1:-text}
here=$(dirname "$0")
home=${SPECMM_HOME:-$HOME/.cache/specmm}
exclude=$(git rev-parse --git-common-dir)/info/exclude
mkdir -p "$(dirname "$exclude")"; grep -qx "/.gpucarry/" "$exclude" 2>/dev/null || echo "/.gpucarry/" >> "$exclude"
rm -rf .gpucarry && mkdir -p .gpucarry/zoo .gpucarry/whl
case $set_name in
  text) entries="code-cpu code-drafts-cpu ssm-code-cpu ssm-code-drafts-cpu chainarith-cpu" ;;
  media) entries="captioner-cpu captioner-drafters-cpu imagegen-cpu" ;;
  *) echo "usage: prepare.sh [text|media]" >&2; exit 2 ;;
esac
for entry in $entries; do  # the finished build without its training checkpoints (work/)
  mkdir -p .gpucarry/zoo/$entry && (cd "$home/zoo/$entry" && tar cf - --exclude=./work .) | tar xf - -C .gpucarry/zoo/$entry
done
.venv/bin/python "$here/carry_zoo_bf16.py" "$set_name"
.venv/bin/python -m pip download -q --no-deps --only-binary=:all: -d .gpucarry/whl diffusers==0.42.1 importlib_metadata
cp "$here/run.sh" "$here/smoke.py" .gpucarry/
du -sh .gpucarry  # with the working tree, under 64 MiB
