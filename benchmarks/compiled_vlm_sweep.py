"""Compiled mode over the VLM families specmm serves: tokens against the stock model's `generate`, optionally under
CUDA graphs' rules (`tests/graph_pool.py`).

Each family is the test suite's tiny random model and inputs (`tests/vlm/test_targets.py`,
`tests/vlm/test_families.py`: float64, a ragged batch with images, an EOS that stops rows at different steps). Each
`VisionDrafter` method (EAGLE, ViSpec, DREAM, FLASH, MSD; untrained heads, so acceptance means nothing) drafts a
dynamic tree through one compiled `SpeculativeGenerator` for two generations (the second reuses the graphs); a row
is OK when both give the stock `generate(do_sample=False)`'s tokens. Backend `aot_eager`: the same graphs as
inductor, no kernel codegen. With `--rules` the report adds what the rules caught (a graph not recorded, recorded
again, or making CPU tensors).

usage: PYTHONPATH=. python benchmarks/compiled_vlm_sweep.py [--rules] [--out report.md] [family ...]
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.sweep_rules import caught, run_sweep, warned  # noqa: E402
import specmm  # noqa: E402
from tests.vlm import test_families, test_targets  # noqa: E402
from tests.vlm.test_drafter import drafter_for  # noqa: E402

METHODS = ("eagle", "vispec", "dream", "flash", "msd")
SETUPS = {family: test_targets.setup for family in test_targets.FAMILIES} | {
    family: test_families.setup for family in test_families.FAMILIES}
TREE = specmm.TreeSpec.dynamic(depth=3, top_k=2, total_tokens=8)


def sweep(family: str, pool) -> list[str]:
    """Report lines for one family (a line per drafting method)."""
    model, inputs, eos, reference = SETUPS[family](family)
    lines = []
    for method in METHODS:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            gen = specmm.SpeculativeGenerator(model, drafter_for(model, method), tree=TREE, compile=True)
            same = [torch.equal(gen.generate(**inputs, max_new_tokens=test_targets.MAX_NEW, eos_token_id=eos,
                                             pad_token_id=test_targets.PAD).sequences, reference) for _ in range(2)]
        lines.append(f"| {family} | {type(model).__name__} | {method} | {'OK' if all(same) else 'DIFFERS'} | "
                     f"{gen.whole_round} | {warned(seen)}{caught(pool)} |")
    return lines


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("families", nargs="*", default=list(SETUPS))
    parser.add_argument("--rules", action="store_true", help="compiled rows under CUDA graphs' rules")
    parser.add_argument("--out", type=Path, help="write the Markdown table here too")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.families) - set(SETUPS))
    if unknown:
        parser.error(f"no tiny model for {unknown}; known: {sorted(SETUPS)}")
    columns = ["family", "class", "drafter", "compiled = generate (2 runs)", "one-graph round", "warnings"]
    return run_sweep(args.families, sweep, columns, 3, args.rules, args.out)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
