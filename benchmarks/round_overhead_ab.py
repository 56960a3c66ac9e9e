"""Two ways to cut a compiled round's host overhead, each A/B'd on the zoo `code` pair at batch 1 (128 greedy tokens).

Run: `OMP_NUM_THREADS=2 python benchmarks/round_overhead_ab.py {guards,cpp-wrapper,profile}` (after `specmm zoo build
code`).
- guards: every timed generation with dynamo's guard checks on, and with them skipped
  (`torch.compiler.set_stance(skip_guard_eval_unsafe=True)`), alternating in one process; chain k=2 and the
  dynamic tree (3, 2, 8); min and median of 7 and whether the tokens are identical.
- cpp-wrapper: HF's compiled `generate` (static cache) and specmm's compiled chain and tree in one process with
  inductor's Python wrapper, then in a second with its C++ wrapper (`TORCHINDUCTOR_CPP_WRAPPER=1`); each process
  prints its warm-up (compile) seconds, min / median of 7 and the speedups over its own HF row.
- profile: where a compiled tree round's time goes: the torch profiler over one generation, by op and input shape;
  the lm-head product [8, 256] x [256, 4096] alone in a hot loop; the number of entries in the round's guard tree.
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
    started = time.perf_counter()
    for run in runs.values():  # compile and warm
        run(), run()
    warm_up = time.perf_counter() - started
    times = {name: [] for name in runs}
    for _ in range(7):
        for name, run in runs.items():
            times[name].append(timed(run)[0])
    base = times["HF static+compile"]
    label = "C++" if os.environ.get("TORCHINDUCTOR_CPP_WRAPPER") == "1" else "Python"
    print(f"{label} wrapper: warm-up (compiles) {warm_up:.1f} s")
    for name, t in times.items():
        print(f"{label} wrapper, {name}: min {min(t) * 1e3:.1f} median {statistics.median(t) * 1e3:.1f} ms, speedup "
              f"{min(base) / min(t):.2f} (min) {statistics.median(base) / statistics.median(t):.2f} (median)")


def profile(inputs) -> None:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    gen = specmm.SpeculativeGenerator(inputs.target, ModelDrafter(inputs.draft), tree=TREES["tree"], compile=True)
    run = lambda: gen.generate(inputs.input_ids, attention_mask=inputs.attention_mask, max_new_tokens=128,  # noqa: E731
                               eos_token_id=None)
    run(), run()
    with torch_profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        run()
    print(prof.key_averages(group_by_input_shape=True).table(sort_by="self_cpu_time_total", row_limit=15,
                                                             max_name_column_width=40, max_shapes_column_width=60))
    hidden, head = torch.randn(8, 256), torch.randn(4096, 256)
    for _ in range(50):
        hidden @ head.t()
    started = time.perf_counter()
    for _ in range(2000):
        hidden @ head.t()
    print(f"[8, 256] x [256, 4096] alone, hot loop: {(time.perf_counter() - started) / 2000 * 1e6:.0f} us per call")
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    code = gen._compiled_round.compiled._torchdynamo_orig_callable.__code__
    for entry in _debug_get_cache_entry_list(code):
        lines = str(entry.guard_manager).splitlines()
        print(f"round graph guard tree: {len(lines)} lines, {sum('LAMBDA_GUARD' in line for line in lines)} "
              "Python lambda guards")


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
        {"guards": guards, "cpp-wrapper": wrapper_pass, "profile": profile}[case](inputs)


if __name__ == "__main__":
    main()
