r"""A/B of a compiled generation's first round on the zoo `code` pair at batch 1, 128 greedy tokens: through the later
rounds' graph ("shared", `SpeculativeGenerator._uniform_first_round`) against its parts compiled one by one
("per_part", the engine before).

- `--warm`: one process, both sides warm (two runs each first), then 7 interleaved runs per side; prints min and
  median seconds per generation for a chain k=2 and the dynamic tree (3, 2, 8).
- `--cold SIDE TREE`: one generation in this process, whose inductor cache should be empty
  (`TORCHINDUCTOR_CACHE_DIR`); prints the graphs dynamo made and the compile time the generation reports.

Run (after `specmm zoo build code`), one job at a time on an idle machine:
    OMP_NUM_THREADS=2 python benchmarks/first_round_shared_ab.py --warm
    for side in per_part shared; do for tree in chain2 tree; do
      TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) OMP_NUM_THREADS=2 \
        python benchmarks/first_round_shared_ab.py --cold $side $tree
    done; done

Result at the commit that added it (idle 2-core CPU, 2026-11-29):
- warm, min / median s per generation: chain2 per_part 0.1992 / 0.2146, shared 0.1876 / 0.2168 (65 rounds); tree
  per_part 0.1168 / 0.1355, shared 0.1109 / 0.1363 (33 rounds);
- cold: per_part chain2 14 graphs, first generation 123.3 s; tree 20 graphs, 137.9 s. shared chain2 1 graph, 77.7 s;
  tree 1 graph, 87.0 s. (Per part, `compile_time_s` counts only the later rounds' graph: 62.0 / 61.9 s.)
"""

import argparse
import statistics
import time

import torch

import specmm
from specmm.bench import inputs as sources
from specmm.core import engine
from specmm.drafters import ModelDrafter

TREES = {"chain2": specmm.TreeSpec.chain(2), "tree": specmm.TreeSpec.dynamic(depth=3, top_k=2, total_tokens=8)}
SIDES = {"per_part": lambda self: False, "shared": engine.SpeculativeGenerator._uniform_first_round}


def run(data, tree: specmm.TreeSpec):
    gen = specmm.SpeculativeGenerator(data.target, ModelDrafter(data.draft), tree=tree, compile=True)
    started = time.perf_counter()
    out = gen.generate(data.input_ids, attention_mask=data.attention_mask, max_new_tokens=128,
                       eos_token_id=data.eos_token_id, pad_token_id=data.pad_token_id)
    return time.perf_counter() - started, out


def warm(data) -> None:
    for name, tree in TREES.items():
        times: dict[str, list[float]] = {side: [] for side in SIDES}
        for uniform in SIDES.values():  # warm both: compile their graphs
            engine.SpeculativeGenerator._uniform_first_round = uniform
            run(data, tree), run(data, tree)
        for _ in range(7):
            for side, uniform in SIDES.items():
                engine.SpeculativeGenerator._uniform_first_round = uniform
                seconds, out = run(data, tree)
                times[side].append(seconds)
        summary = {side: (round(min(v), 4), round(statistics.median(v), 4)) for side, v in times.items()}
        print(name, summary, "rounds", out.stats.target_forwards, flush=True)


def cold(data, side: str, tree: str) -> None:
    import torch._dynamo.utils as dynamo_utils

    engine.SpeculativeGenerator._uniform_first_round = SIDES[side]
    seconds, out = run(data, TREES[tree])
    graphs = dynamo_utils.counters["stats"]["unique_graphs"]
    print(f"{side} {tree}: {graphs} graphs, compile {out.stats.compile_time_s:.1f} s, first generation {seconds:.1f} s",
          flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--warm", action="store_true")
    parser.add_argument("--cold", nargs=2, metavar=("SIDE", "TREE"))
    args = parser.parse_args()
    torch.set_num_threads(2)
    data = sources.from_zoo("code", "cpu", 1, torch.device("cpu"), torch.float32)
    with torch.no_grad():
        if args.cold:
            cold(data, *args.cold)
        else:
            warm(data)


if __name__ == "__main__":
    main()
