"""Run a `specmm` command on this CPU under CUDA graphs' rules, before it spends device time.

The compiled rows of a GPU run replay CUDA graphs: a graph's outputs are overwritten at the next step, a graph
that writes in place into a tensor that is not static is not recorded (the trees run it without CUDA graphs), a
graph whose static inputs move is recorded again (after 128 times, no longer graphed), and a tensor factory
without a device makes a CPU tensor inside a GPU graph. `tests/graph_pool.py` plays these rules on
a CPU (graphs through AOT autograd, no kernel codegen); this script runs any `specmm` command under them. Each GPU
session so far found a compiled path that broke only under CUDA graphs (`h100-second/README.md`).

usage: python benchmarks/gpu/graph_rules.py bench image_ar --scale cpu --compile --images 2 --out /tmp/gr ...

It prints what the rules caught and exits 1 if a graph would not be recorded or be recorded again, a graph makes
CPU tensors, the
command failed, or a row of a report the command wrote (JSON under its `--out`) failed or lost exactness.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from specmm import cli  # noqa: E402
from tests.graph_pool import graphed_on_cpu  # noqa: E402


def bad_rows(out: Path, since: float) -> list[str]:
    """Rows of the JSON reports written under `out` since `since` that failed, or whose outputs differ from the
    reference other than at near-ties of the target (`specmm.bench.ties`)."""
    found = []
    for report in sorted(out.glob("*.json")) if out.is_dir() else []:
        if report.stat().st_mtime < since:
            continue
        data = json.loads(report.read_text())
        for row in (row for part in (data if isinstance(data, list) else [data]) for row in part.get("rows", [])):
            tied = row.get("differing_rows") and row.get("near_tie_rows") == row.get("differing_rows")
            if row.get("error") or (row.get("matched") is False and not tied):  # bf16 near-ties are not faults
                found.append(f"{report.name}: {row['method']}: {row.get('error') or 'outputs differ'}")
    return found


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    started = time.time()
    with pytest.MonkeyPatch.context() as patch:
        pool = graphed_on_cpu(patch)
        rc = cli.main(argv)
    out = Path(argv[argv.index("--out") + 1]) if "--out" in argv else None
    rows = bad_rows(out, started) if out is not None else []
    print(f"graph rules: {pool.calls} graphed calls, {pool.poisoned} outputs overwritten at a later step")
    for kind, lines in (("not recorded (mutates a non-static input)", pool.skipped),
                        ("recorded again (a static input moved)", pool.rerecorded),
                        ("makes CPU tensors", pool.hosted), ("failed or inexact row", rows)):
        for line in sorted(set(lines)):
            print(f"  {kind}: {line}")
    clean = rc == 0 and not (pool.skipped or pool.rerecorded or pool.hosted or rows)
    print("graph rules: clean" if clean else f"graph rules: NOT clean (command exit {rc})")
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
