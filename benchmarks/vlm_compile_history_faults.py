"""Compile history and page faults: the zoo captioner's eagle / dream / vispec drafters, compiled chain k=4 over 8
held-out scenes at batch 1 (min / median of 3 passes, minor page faults per pass), fresh and after compiling every
drafter's chain k=4 and tree (3, 2, 6) rows, as a full `specmm bench vlm --compile` does before its timed runs.
Page faults would show an allocator whose heap state depends on the history (fresh pages for every temporary).

Run: `OMP_NUM_THREADS=2 python benchmarks/vlm_compile_history_faults.py eagle,dream,vispec` (after the zoo
`captioner-drafters` build). Result at 7e90bc0 (stop 38, rebuilt zoo): fresh eagle 0.662 / 0.662 s, dream 0.998 /
1.001 s, vispec 0.715 / 0.727 s; after compiling all 0.676 / 0.679, 0.990 / 0.995, 0.725 / 0.733 s; 0 minor faults
in every pass.
"""

import resource
import statistics
import sys
import time

import torch

import specmm
from vlm_compile_history_probe import METHODS, load_zoo  # benchmarks/ is the script's folder

models, drafters, prompts = load_zoo()
tok = models.processor.tokenizer
chain, tree = specmm.TreeSpec.chain(4), specmm.TreeSpec.dynamic(depth=3, top_k=2, total_tokens=6)

def run(method, spec):
    for enc in prompts:
        gen = specmm.SpeculativeGenerator(models.target, drafters[method], tree=spec, compile=True)
        gen.generate(**enc, max_new_tokens=160, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)

def measure(label, method):
    times, faults = [], []
    for _ in range(3):
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t = time.perf_counter()
        run(method, chain)
        times.append(time.perf_counter() - t)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
    print(f"{label} {method}: min {min(times):.3f} median {statistics.median(times):.3f} s, minor faults {faults}",
          flush=True)

order = sys.argv[1].split(",")
with torch.no_grad():
    run(order[0], chain)
    run(order[0], chain)
    for m in order:
        if m != order[0]:
            run(m, chain)
        measure("fresh", m)
    for m in METHODS:
        run(m, chain), run(m, tree)
    for m in order:
        measure("after all", m)
