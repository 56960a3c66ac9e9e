"""Compiled rounds with `ancestor_mask` reading parents' rows by a gather against by a one-hot matrix product, in one
process: zoo `code` pair, batch 1, 128 greedy tokens, warm generations (each variant compiles its own graph first;
the two must produce the same tokens).

Run (idle machine, after `specmm zoo build code`):
    OMP_NUM_THREADS=2 python benchmarks/ancestor_mask_ab.py lookup:8 chain:4 dynamic:3

Cases: `lookup:K` (prompt lookup, chain of K), `chain:K` (the zoo draft model, chain of K), `dynamic:D` (the draft
model, dynamic tree of depth D, top-2, 8 tokens). Cold compiles: `lookup_compile_probe.py`.

Results at 72f69b0 plus this change (2026-11-29, 2-core CPU, idle), that command, 15 alternations, seconds per
generation, min / median:
- lookup:8: gather 0.0492 / 0.0516, one-hot 0.0490 / 0.0528;
- chain:4: gather 0.1565 / 0.1716, one-hot 0.1615 / 0.1742;
- dynamic:3: gather 0.0934 / 0.1065, one-hot 0.1022 / 0.1064.
Earlier runs the same day: chain:4 over 30 alternations 0.1602 / 0.1833 against 0.1668 / 0.1897; dynamic:3 0.1010 /
0.1165 against 0.1014 / 0.1156.
Past depth 4 (after the suite run, same day), `dynamic:6`: gather 0.1445 / 0.1583, one-hot 0.1458 / 0.1778; again with
`dynamic:6 lookup:8`: dynamic:6 gather 0.1346 / 0.1526, one-hot 0.1223 / 0.1502; lookup:8 gather 0.0583 / 0.0667,
one-hot 0.0568 / 0.0652 (run to run noise larger than the difference).
Hence `GATHER_MAX_DEPTH = 4`: the gather up to depth 4, the one-hot product beyond, where the gather's cold compile
grows (prompt lookup, K=8: 403.6 s with the gather, 65.0-65.8 s with the one-hot product).
"""

import statistics
import sys
import time

import torch

import specmm
import specmm.core.tree as tree_module
from specmm.bench import inputs as sources
from specmm.drafters import ModelDrafter, PromptLookupDrafter

VARIANTS = {"gather": 1 << 10, "one-hot": -1}  # GATHER_MAX_DEPTH: gather at every depth, or at none


def case(name: str, data):
    kind, size = name.split(":")
    size = int(size)
    if kind == "lookup":
        return PromptLookupDrafter(ngram=3, k=size), specmm.TreeSpec.chain(size)
    if kind == "chain":
        return ModelDrafter(data.draft), specmm.TreeSpec.chain(size)
    if kind == "dynamic":
        return ModelDrafter(data.draft), specmm.TreeSpec.dynamic(depth=size, top_k=2, total_tokens=8)
    raise SystemExit(f"unknown case {name!r}: lookup:K, chain:K or dynamic:D")


def main() -> None:
    names = sys.argv[1:] or ["lookup:8"]
    repeats = 15
    torch.set_num_threads(2)
    data = sources.from_zoo("code", "cpu", 1, torch.device("cpu"), torch.float32)
    gens = {}
    for name in names:
        for variant in VARIANTS:
            drafter, tree = case(name, data)
            gens[name, variant] = specmm.SpeculativeGenerator(data.target, drafter, tree=tree, compile=True)

    def run(name: str, variant: str) -> tuple[float, torch.Tensor]:
        tree_module.GATHER_MAX_DEPTH = VARIANTS[variant]  # read while tracing: a guard, so each keeps its graph
        started = time.perf_counter()
        out = gens[name, variant].generate(data.input_ids, attention_mask=data.attention_mask, max_new_tokens=128,
                                           eos_token_id=data.eos_token_id, pad_token_id=data.pad_token_id)
        return time.perf_counter() - started, out.sequences

    times = {key: [] for key in gens}
    with torch.no_grad():
        for key in gens:  # compile, then warm
            run(*key), run(*key)
        for _ in range(repeats):
            for name in names:
                outputs = []
                for variant in VARIANTS:
                    seconds, sequences = run(name, variant)
                    times[name, variant].append(seconds)
                    outputs.append(sequences)
                assert torch.equal(outputs[0], outputs[1]), f"{name}: the variants' tokens differ"
    for name in names:
        print(name, " | ".join(f"{variant}: min {min(times[name, variant]):.4f} median "
                               f"{statistics.median(times[name, variant]):.4f}" for variant in VARIANTS))


if __name__ == "__main__":
    main()
