"""Compiled STree shapes against compiled chains on the zoo `ssm-code` (cpu) target, batch 4, 64 greedy tokens,
1 thread, interleaved in one process (median of the repeats after one warm-up; ratios against the first method).

Run: `OMP_NUM_THREADS=1 python benchmarks/ssm_tree_probe.py ROLE METHODS [REPEATS]`, ROLE mamba2 or hybrid, METHODS
comma-separated: `chain:MODE:K` (MODE replay or closed_form), `dyn:DEPTH:TOP_K:TOTAL`, or a name in `TREES`.
Quoted (stop 38, at 7e90bc0): `hybrid chain:replay:2,chain:replay:3,chain:replay:4,s6,s7d4,dyn:4:2:8,dyn:4:1:5`:
0.948x / 0.903x (chains of 3 / 4), 0.883x / 0.842x (s6 / s7d4), 0.868x / 0.894x (dynamic), mean accepted 1.87, 1.90,
1.98, 2.00, 2.23, 1.90 (chain of 2: 1.82); `mamba2 chain:replay:2,s6,s7d4,s8,s5,s9,chain:replay:3`: s6 1.181x,
s7d4 1.117x, s8 1.084x, s5 0.796x, s9 0.972x, chain of 3 0.899x (accepted 2.75, 2.75, 2.78, 1.53, 2.78, 1.51; chain
of 2: 1.51).
"""
import sys

import torch

import specmm
from specmm import zoo
from specmm.zoo import code, ssm_code
from specmm.bench.core import new_token_rows, speculative_method
from specmm.bench.fast_path import hf_compile_scope
from specmm.bench.harness import run_benchmark, RunResult
from specmm.drafters import ModelDrafter
from specmm.ssm import SSMTarget

TREES = {
    "s6": ((0,), (1,), (0, 0), (1, 0), (0, 0, 0)),
    "s7d4": ((0,), (1,), (0, 0), (1, 0), (0, 0, 0), (0, 0, 0, 0)),
    "s8": ((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 0, 0)),
    "s5": ((0,), (1,), (0, 0), (0, 0, 0)),
    "s9": ((0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 0, 0)),
}

def main():
    torch.set_num_threads(1)
    role = sys.argv[1]
    names = sys.argv[2].split(",")
    record = zoo.record("ssm-code", "cpu")
    draft = code.load(zoo.path("code", record["recipe"]["code_scale"])).draft
    target, tok, prompts = ssm_code.load(zoo.path("ssm-code", "cpu"), role)
    batch = tok(prompts[:4], return_tensors="pt", padding=True)
    ids, mask, pad = batch["input_ids"], batch["attention_mask"], tok.pad_token_id
    methods = []
    for name in names:
        if name.startswith("chain"):
            mode, k = name.split(":")[1], int(name.split(":")[2])
            tree, commit = specmm.TreeSpec.chain(k), mode
        elif name.startswith("dyn"):
            d, t, n = map(int, name.split(":")[1:])
            tree, commit = specmm.TreeSpec.dynamic(depth=d, top_k=t, total_tokens=n), "closed_form"
        else:
            tree, commit = specmm.TreeSpec.static(TREES[name]), "closed_form"
        def make(compile, profile, tree=tree, commit=commit):
            return specmm.SpeculativeGenerator(SSMTarget(target, commit_mode=commit), ModelDrafter(draft), tree=tree,
                                               compile=compile, profile=profile)
        def generate(gen):
            out = gen.generate(ids, attention_mask=mask, max_new_tokens=64, pad_token_id=pad)
            return RunResult(new_token_rows(out.sequences, ids.shape[1], None, pad)), out.stats
        methods.append(speculative_method(name, make, generate, "compiled", False))
    with torch.no_grad(), hf_compile_scope(target):
        rows, _ = run_benchmark(methods, torch.device("cpu"), repeats=int(sys.argv[3]) if len(sys.argv) > 3 else 5,
                                warmup=1, progress=False)
    for row in rows:
        print(f"{row.method:12s} {row.median_s*1e3:8.1f} ms  x{row.speedup:.3f}  acc {row.mean_accepted}  "
              f"match {row.matched}  compile {row.compile_s:.0f}s "
              f"timed_compiles {row.timed_compiles} {row.error or ''}")


if __name__ == "__main__":
    main()
