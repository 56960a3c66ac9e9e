"""Cold compile of a compiled prompt-lookup generation on the zoo `code` pair (batch 1, 128 greedy tokens, chain of
K drafts): two generations, then the graphs dynamo made and inductor's slowest compile phases.

Run one K per process, with an empty inductor cache, on an idle machine (after `specmm zoo build code`):
    TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) OMP_NUM_THREADS=2 python benchmarks/lookup_compile_probe.py K

Result at e0511dd (2026-11-29, 2-core CPU): K=2, 1 graph, compile 49.2 s; K=8, 1 graph, compile 403.6 s, and 418.4 s
in a second cold run, whose phase list put 364.6 s in inductor's `Scheduler.codegen` (py-spy samples of a third run sat
in sympy's `factor_terms` under inductor's `sympy_subs`). The second generation compiles nothing (0.06-0.08 s).

The cause (TORCH_COMPILE_DEBUG's ir_post_fusion.txt): `ancestor_mask`'s levels inlined into one kernel body of 1,789
index computations, the chain's `arange - 1` parents folded into indices nested one Max(0, i - 1) per level. With
the one-hot product past depth 4 (`specmm.core.tree.GATHER_MAX_DEPTH`, 2026-11-29): K=8 compiles in 65.0 s and 65.8 s
(two cold runs), K=2 in 56.3-58.3 s (the gather, unchanged: 56.7 s before in the same spell).
"""

import sys
import time

import torch
import torch._dynamo.utils as dynamo_utils

import specmm
from specmm.bench import inputs as sources
from specmm.drafters import PromptLookupDrafter


def slowest_phases(count: int = 12) -> list[tuple[float, str]]:
    """Inductor's and dynamo's compile phases, summed over calls, slowest first."""
    phases = []
    for line in dynamo_utils.compile_times(repr="str").splitlines()[2:]:
        name, *seconds = line.split(",")
        try:
            phases.append((sum(float(s) for s in seconds), name))
        except ValueError:
            continue
    return sorted(phases, reverse=True)[:count]


def main() -> None:
    k = int(sys.argv[1])
    torch.set_num_threads(2)
    data = sources.from_zoo("code", "cpu", 1, torch.device("cpu"), torch.float32)
    with torch.no_grad():
        for run in range(2):
            gen = specmm.SpeculativeGenerator(data.target, PromptLookupDrafter(ngram=3, k=k),
                                              tree=specmm.TreeSpec.chain(k), compile=True)
            started = time.perf_counter()
            out = gen.generate(data.input_ids, attention_mask=data.attention_mask, max_new_tokens=128,
                               eos_token_id=data.eos_token_id, pad_token_id=data.pad_token_id)
            print(f"generation {run}: {time.perf_counter() - started:.2f} s, compile {out.stats.compile_time_s:.1f} s, "
                  f"graphs {dynamo_utils.counters['stats']['unique_graphs']}, whole round {gen.whole_round}",
                  flush=True)
    for seconds, name in slowest_phases():
        print(f"{seconds:8.1f} s  {name}")


if __name__ == "__main__":
    main()
