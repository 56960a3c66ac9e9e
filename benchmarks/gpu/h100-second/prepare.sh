#!/bin/bash
# Prepare a git-ignored carry folder for one device call of the second GPU run (stop 46), on the CPU-scale zoo builds:
# the builds (large weight files stored bf16 to fit the 64 MiB transfer limit; see ../h100-first/carry_zoo_bf16.py),
# diffusers as a wheel (the device image lacks it), and run.sh. Two sets, each its own folder, each one call:
#   text  -> .gpucarry       bench core, ssm (Mamba2 and hybrid), reasoning   (zoo code, code-drafts, ssm-code,
#                                                                             ssm-code-drafts, chainarith)
#   media -> .gpucarry-media bench vlm, image_ar                              (zoo captioner, captioner-drafters,
#                                                                             imagegen)
#   core-vlm -> .gpucarry-cv bench core, vlm (issue 17's GPU step in one call; zoo code, code-drafts, captioner,
#                                             captioner-drafters)
# Run from the repository root: `bash benchmarks/gpu/h100-second/prepare.sh text|media|core-vlm`; then device run with carry
# [FOLDER], command `bash FOLDER/run.sh $OUT cuda SET` (the reports land in $OUT; see README.md there).
set -euo pipefail
set_name=${1:-text}
here=$(dirname "$0")
home=${SPECMM_HOME:-$HOME/.cache/specmm}
case $set_name in
  text) dest=.gpucarry; entries="code-cpu code-drafts-cpu ssm-code-cpu ssm-code-drafts-cpu chainarith-cpu" ;;
  media) dest=.gpucarry-media; entries="captioner-cpu captioner-drafters-cpu imagegen-cpu" ;;
  core-vlm) dest=.gpucarry-cv; entries="code-cpu code-drafts-cpu captioner-cpu captioner-drafters-cpu" ;;
  *) echo "usage: prepare.sh text|media|core-vlm" >&2; exit 2 ;;
esac
exclude=$(git rev-parse --git-common-dir)/info/exclude
mkdir -p "$(dirname "$exclude")"; grep -qx "/$dest/" "$exclude" 2>/dev/null || echo "/$dest/" >> "$exclude"
rm -rf $dest && mkdir -p $dest/zoo $dest/whl
for entry in $entries; do  # the finished build without its training checkpoints (work/)
  mkdir -p $dest/zoo/$entry && (cd "$home/zoo/$entry" && tar cf - --exclude=./work .) | tar xf - -C $dest/zoo/$entry
done
.venv/bin/python "$here/../h100-first/carry_zoo_bf16.py" "$set_name" "$dest/zoo"
.venv/bin/python -m pip download -q --no-deps --only-binary=:all: -d $dest/whl diffusers==0.42.1 importlib_metadata
cp "$here/run.sh" $dest/
du -sh $dest  # with the working tree, under 64 MiB
