"""What the compiled-mode sweeps (`compiled_arch_sweep.py`, `compiled_vlm_sweep.py`) share: the report's cells for
warnings and CUDA graphs' rules, and the loop that runs every case into one Markdown table."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from specmm.core import compiled


def warned(seen: list[warnings.WarningMessage]) -> str:
    """The compiled-mode warnings caught (their first clause each), or '-'."""
    return "; ".join(sorted({str(w.message).split(";")[0] for w in seen if "compile=True" in str(w.message)})) or "-"


def caught(pool) -> str:
    """' | <what the rules caught>' since the last call (then forgotten), or '' without the rules."""
    if pool is None:
        return ""
    found = ", ".join(f"{kind}: {len(set(seen))}" for kind, seen in (
        ("not recorded", pool.skipped), ("recorded again", pool.rerecorded), ("CPU tensors", pool.hosted)) if seen)
    pool.skipped.clear(), pool.rerecorded.clear(), pool.hosted.clear()
    return " | " + (found or "clean")


def run_sweep(names: list[str], sweep: Callable[[str, object], list[str]], columns: list[str], verdict_column: int,
              rules: bool, out: Path | None) -> int:
    """Each case's report lines from `sweep(name, pool)` (an ERROR line in the verdict column when it raises),
    printed as they come, under one thread and the `aot_eager` backend, optionally under the rules; the table to
    `out` too. Exit status 1 when any line differs, errs, or shows what the rules caught."""
    torch.set_num_threads(1)
    compiled.BACKEND = "aot_eager"
    columns = [*columns, *(["graph rules"] if rules else [])]
    head = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    print("\n".join(head), flush=True)
    lines, failed = [], 0
    with pytest.MonkeyPatch.context() as patch:
        pool = None
        if rules:
            from tests.graph_pool import graphed_on_cpu
            pool = graphed_on_cpu(patch)
        for name in names:
            try:
                found = sweep(name, pool)
            except Exception as error:  # noqa: BLE001 - a report line per case, whatever broke
                cells = [name] + [""] * (len(columns) - 1)
                cells[verdict_column:verdict_column + 2] = ["ERROR", f"{type(error).__name__}: {str(error)[:120]}"]
                found = ["| " + " | ".join(cells) + " |"]
            failed += sum("DIFFERS" in line or "ERROR" in line or "recorded" in line or "CPU tensors" in line
                          for line in found)
            print("\n".join(found), flush=True)
            lines += found
    if out:
        out.write_text("\n".join(head + lines) + "\n")
    return 1 if failed else 0
