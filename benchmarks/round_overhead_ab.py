"""Two ways to cut a compiled round's host overhead, each A/B'd on the zoo `code` pair at batch 1 (128 greedy tokens).

Run: `OMP_NUM_THREADS=2 python benchmarks/round_overhead_ab.py {guards,cpp-wrapper}` (after `specmm zoo build code`).
- guards: every timed generation with dynamo's guard checks on, and with them skipped
  (`torch.compiler.set_stance(skip_guard_eval_unsafe=True)`), alternating in one process; chain k=2 and the
  dynamic tree (3, 2, 8); min and median of 7 and whether the tokens are identical.
- cpp-wrapper: HF's compiled `generate` (static cache) and specmm's compiled chain and tree in one process with
  inductor's Python wrapper, then in a second with its C++ wrapper (`TORCHINDUCTOR_CPP_WRAPPER=1`); each process
  prints min / median of 7 and the speedups over its own HF row.
"""

import os
import statistics
import subprocess
import sys
import time

import torch

import specmm
from specmm.bench.core import plain_decoding
from specmm.bench.fast_path import hf_compile_scope
from specmm.bench.inputs import from_zoo
from specmm.drafters import ModelDrafter

TREES = {"chain": specmm.TreeSpec.chain(2), "tree": specmm.TreeSpec.dynamic(depth=3, top_k=2, total_tokens=8)}


def speculative(inputs, name: str):
    gen = specmm.SpeculativeGenerator(inputs.target, ModelDrafter(inputs.draft), tree=TREES[name], compile=True)
    return gen.generate(inputs.input_ids, attention_mask=inputs.attention_mask, max_new_tokens=128,
                        eos_token_id=None).sequences


def timed(fn) -> tuple[float, object]:
    started = time.perf_counter()
    out = fn()
    return time.perf_counter() - started, out


def guards(inputs) -> None:
    times = {(n, skip): [] for n in TREES for skip in (False, True)}
    outs = {}
    for name in TREES:  # compile and warm
        speculative(inputs, name), speculative(inputs, name)
    for _ in range(7):
        for name in TREES:
            for skip in (False, True):
                with torch.compiler.set_stance("default", skip_guard_eval_unsafe=skip):
                    seconds, outs[name, skip] = timed(lambda: speculative(inputs, name))
                times[name, skip].append(seconds)
    for name in TREES:
        on, off = times[name, False], times[name, True]
        print(f"{name}: guards on min {min(on) * 1e3:.1f} median {statistics.median(on) * 1e3:.1f} ms | skipped min "
              f"{min(off) * 1e3:.1f} median {statistics.median(off) * 1e3:.1f} ms | identical "
              f"{torch.equal(outs[name, False], outs[name, True])}")


def wrapper_pass(inputs) -> None:
    runs = {"HF static+compile": lambda: plain_decoding(inputs.target, inputs.input_ids, inputs.attention_mask, True,
                                                        128, 0, None)}
    runs.update({name: (lambda name=name: speculative(inputs, name)) for name in TREES})
    for run in runs.values():  # compile and warm
        run(), run()
    times = {name: [] for name in runs}
    for _ in range(7):
        for name, run in runs.items():
            times[name].append(timed(run)[0])
    base = times["HF static+compile"]
    label = "C++" if os.environ.get("TORCHINDUCTOR_CPP_WRAPPER") == "1" else "Python"
    for name, t in times.items():
        print(f"{label} wrapper, {name}: min {min(t) * 1e3:.1f} median {statistics.median(t) * 1e3:.1f} ms, speedup "
              f"{min(base) / min(t):.2f} (min) {statistics.median(base) / statistics.median(t):.2f} (median)")


def main() -> None:
    case = sys.argv[1] if len(sys.argv) > 1 else "guards"
    if case == "cpp-wrapper" and "SPECMM_AB_CHILD" not in os.environ:
        for flag in ("0", "1"):  # the wrapper is fixed when a graph compiles: one process per setting
            env = {**os.environ, "TORCHINDUCTOR_CPP_WRAPPER": flag, "SPECMM_AB_CHILD": "1"}
            subprocess.run([sys.executable, __file__, case], env=env, check=True)
        return
    torch.set_num_threads(2)
    inputs = from_zoo("code", "cpu", 1, torch.device("cpu"), torch.float32)
    with torch.no_grad(), hf_compile_scope(inputs.target):
        guards(inputs) if case == "guards" else wrapper_pass(inputs)


if __name__ == "__main__":
    main()
