#!/usr/bin/env bash
# Rewrites constraints.txt: the pinned set `make` installs. It installs specmm's ranges from pyproject.toml
# (with the test, bench and lint extras) into a scratch venv, as pip resolves them today, and freezes it.
# Run it with `make lock`, then `make test` (and tools/test_transformers.sh) before committing the new pins.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
"$PYTHON" -m venv "$scratch/venv"
"$scratch/venv/bin/pip" install -q --upgrade pip
"$scratch/venv/bin/pip" install -q ".[test,bench,lint]"
{
  echo "# The pinned set \`make\` installs (pip install -c constraints.txt); pyproject.toml keeps the supported ranges."
  echo "# Regenerate with \`make lock\`; tested transformers versions: see docs/compatibility.md."
  "$scratch/venv/bin/pip" freeze --exclude-editable | grep -v -e '^-e ' -e '^specmm[= @]'
} > constraints.txt.new
mv constraints.txt.new constraints.txt
echo "constraints.txt: $(grep -vc '^#' constraints.txt) pins"
