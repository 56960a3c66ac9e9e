#!/usr/bin/env bash
# Runs the test suite under each transformers version specmm is tested with (TESTED below), beside the pinned
# set: each version goes into a small venv layered over .venv (the rest of the pinned set is shared), so only
# transformers and what it needs differ. Pass pytest arguments to run part of the suite:
#   tools/test_transformers.sh tests/core/test_limits.py
# GPU images ship 5.17; the pinned set (constraints.txt) has the newest (docs/compatibility.md).
set -euo pipefail
cd "$(dirname "$0")/.."
TESTED=${TESTED:-"5.17.0 5.24.0 5.25.0"}
site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
args=("$@")
[ ${#args[@]} -eq 0 ] && args=(-n auto --maxprocesses 4 --dist loadfile --no-loadscope-reorder)
status=0
for version in $TESTED; do
  overlay=".venv-transformers-$version"
  if [ ! -x "$overlay/bin/python" ]; then
    python3 -m venv "$overlay"
    overlay_site=$("$overlay/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    echo "import site; site.addsitedir('$site')" > "$overlay_site/zz_specmm_venv.pth"
    "$overlay/bin/pip" install -q "transformers==$version"
  fi
  echo "== transformers $("$overlay/bin/python" -c 'import transformers; print(transformers.__version__, transformers.__file__)')"
  "$overlay/bin/python" -m pytest -q -p no:cacheprovider "${args[@]}" || status=1
done
exit $status
