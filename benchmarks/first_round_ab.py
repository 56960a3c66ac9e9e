"""A/B in one process: compiled chain k=2 and dynamic tree (3, 2, 8) on the zoo `code` pair at batch 1, 128 greedy
tokens, with a generation's first round as one compiled graph (`SpeculativeGenerator._first_step`, "new") against
its parts compiled one by one ("old", the step before). Both warm (two runs each first), then 7 interleaved runs per
side; prints min and median seconds per generation.

Run: `OMP_NUM_THREADS=2 python benchmarks/first_round_ab.py` (after `specmm zoo build code`).
Result at the commit that added it: chain2 old 0.1537 / 0.1786 s, new 0.1499 / 0.1566 s; tree old 0.1462 / 0.1509 s,
new 0.1437 / 0.1511 s (65 and 33 rounds).
"""

import functools
import statistics
import time

import torch

import specmm
from specmm.bench import inputs as sources
from specmm.core import engine
from specmm.drafters import ModelDrafter

TREES = {"chain2": specmm.TreeSpec.chain(2), "tree": specmm.TreeSpec.dynamic(depth=3, top_k=2, total_tokens=8)}
NEW_FIRST = engine.SpeculativeGenerator._first_step


def old_first(self, sampling, recorded=False):
    """The first round per part, as before the first-round graph."""
    return functools.partial(engine.recorded_round, self) if recorded else self.step


def main() -> None:
    torch.set_num_threads(2)
    data = sources.from_zoo("code", "cpu", 1, torch.device("cpu"), torch.float32)

    def run(tree: specmm.TreeSpec) -> tuple[float, int]:
        gen = specmm.SpeculativeGenerator(data.target, ModelDrafter(data.draft), tree=tree, compile=True)
        started = time.perf_counter()
        out = gen.generate(data.input_ids, attention_mask=data.attention_mask, max_new_tokens=128,
                           eos_token_id=data.eos_token_id, pad_token_id=data.pad_token_id)
        return time.perf_counter() - started, out.stats.target_forwards

    sides = {"old": old_first, "new": NEW_FIRST}
    with torch.no_grad():
        for name, tree in TREES.items():
            times: dict[str, list[float]] = {side: [] for side in sides}
            for first in sides.values():  # warm both: compile their graphs
                engine.SpeculativeGenerator._first_step = first
                run(tree), run(tree)
            for _ in range(7):
                for side, first in sides.items():
                    engine.SpeculativeGenerator._first_step = first
                    seconds, rounds = run(tree)
                    times[side].append(seconds)
            engine.SpeculativeGenerator._first_step = NEW_FIRST
            summary = {side: (round(min(v), 4), round(statistics.median(v), 4)) for side, v in times.items()}
            print(name, summary, "rounds", rounds, flush=True)


if __name__ == "__main__":
    main()
