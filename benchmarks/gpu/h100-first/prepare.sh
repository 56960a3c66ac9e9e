#!/bin/bash
# Prepare .gpucarry/ (git-ignored) for a device call that runs the benches on the CPU-scale zoo builds:
# the builds (large weight files stored bf16 to fit the 64 MiB transfer limit), diffusers as a wheel (the device
# image lacks it), and this folder's scripts. Run from the repository root after `make demo` or the zoo builds:
#   specmm zoo build code && specmm zoo build code-drafts && specmm zoo build ssm-code && specmm zoo build ssm-code-drafts
#   && specmm zoo build chainarith
# then: device run, carry [".gpucarry"], command `bash .gpucarry/run.sh $OUT/r cuda 0; cp $OUT/r/gpu.tgz $OUT/`
set -euo pipefail
here=$(dirname "$0")
home=${SPECMM_HOME:-$HOME/.cache/specmm}
exclude=$(git rev-parse --git-common-dir)/info/exclude
mkdir -p "$(dirname "$exclude")"; grep -qx "/.gpucarry/" "$exclude" 2>/dev/null || echo "/.gpucarry/" >> "$exclude"
rm -rf .gpucarry && mkdir -p .gpucarry/zoo .gpucarry/whl
cp -r "$home"/zoo/{code-cpu,code-drafts-cpu,ssm-code-cpu,ssm-code-drafts-cpu,chainarith-cpu} .gpucarry/zoo/
.venv/bin/python "$here/carry_zoo_bf16.py"
.venv/bin/python -m pip download -q --no-deps --only-binary=:all: -d .gpucarry/whl diffusers==0.42.1 importlib_metadata
cp "$here/run.sh" "$here/smoke.py" .gpucarry/
du -sh .gpucarry  # with the working tree, under 64 MiB
