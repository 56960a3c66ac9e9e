"""Repro: compiled STree verify at batch 1 with 8 or more tree nodes corrupts the heap on CPU (inductor); worked around.

Run: `ONLY_COMPILED=1 OMP_NUM_THREADS=1 python benchmarks/ssm_batch1_compile_crash.py mamba2 static12 closed_form 1`
(after `specmm zoo build ssm-code-drafts --scale cpu`). Args: target (mamba2 | hybrid), tree (chain | chain4 |
dyn224 | static | dynamic | static12), commit mode (closed_form | replay), batch size. Each line printed: whether
specmm's tokens equal HF greedy `generate` and the mean accepted tokens; `INDUCTOR_SIMDLEN=1` turns off inductor's
vectorisation.

Found at 425eacb (torch 2.11.0, 2-core AVX-512 CPU, one thread), stop 45:
- batch 1, compiled: Mamba2 with the dynamic tree (3, 2, 8) and the 12-node static tree aborts in glibc's malloc
  checks ("malloc(): unaligned tcache chunk detected", "corrupted size vs. prev_size"); the hybrid with the
  12-node tree segfaults. Chains of 2 and 4, the 6-node static tree and a dynamic (2, 2, 4) tree run and match HF.
- the same trees at batch 2 and 4 run and match HF; eager mode runs at every batch size;
- the `aot_eager` backend (`SPECMM_COMPILE_BACKEND=aot_eager`) runs and matches, so the traced graph is sound
  and the fault is in inductor's generated code; `INDUCTOR_SIMDLEN=1` runs and matches.
- stop 46, re-checked with `TORCHINDUCTOR_FORCE_DISABLE_CACHES=1` and a cache folder of its own
  (`TORCHINDUCTOR_CACHE_DIR`): the default settings crash; so do 256-bit vectors (`INDUCTOR_SIMDLEN=256`), no tail
  vectorisation (`cpp.enable_loop_tail_vec=False`), no buffer reuse (`allow_buffer_reuse=False`) and the Python
  wrapper (`SPECMM_CPP_WRAPPER=0`); `INDUCTOR_SIMDLEN=1` runs and matches HF. So a vectorised kernel's main loop
  writes out of bounds. The round graph's output code alone reproduces it: run the largest `.py` the crash
  leaves in the cache folder (its `__main__` calls it on random inputs of the same shapes; the other graphs run
  clean). valgrind cannot run it (SIGILL: the kernels are built with `-march=native`, AVX-512 even at simdlen 256);
  next step: rebuild that module's C++ without `-march=native` (or bisect its kernels by hand) to name the kernel.
  A workaround tried and dropped: `cpp.simdlen` 1 as a `torch.compile` option of the SSM round alone (a
  `round_compile_options` hook on the target) did not reach that graph's code generation. Its output code still
  held 169 `Vectorized` uses, and the crash stayed. With the global setting, no graph holds any.
- stop 47, the workaround (in `specmm`): on CPU at batch 1 `SSMTarget.inductor_patches_for` gives
  `{"cpp.simdlen": 1}`, and compiled mode enters those settings around every call of the SSM target's graphs and of
  a round that holds them (`specmm.core.compiled.InductorPatches`), so they also reach recompiles; the rest of the
  process (the draft's own graphs, HF's compiled AR baseline) keeps vector kernels. A context patch reaches codegen
  where the `torch.compile` option did not. Through the workaround `mamba2 static12` and `hybrid static12` at
  batch 1 match HF in every run (caches disabled, a fresh cache folder); `NO_WORKAROUND=1` brings the crash back.
  It costs 5-8% at batch 1 (`benchmarks/ssm_simdlen_ab.py`).
- stop 45 (cache possibly polluted, superseded by the above): inductor's compiler bisector
  (`python -m torch._inductor.compiler_bisector run`) found no subsystem whose removal fixes it.
"""

import os
import sys

import torch
import torch._inductor.config as inductor_config

import specmm
from specmm import zoo
from specmm.bench.ssm import SMALL_STATIC_TREE, STATIC_TREE
from specmm.drafters import ModelDrafter
from specmm.ssm import SSMTarget
from specmm.zoo import code, ssm_code

TREES = {"chain": specmm.TreeSpec.chain(2), "chain4": specmm.TreeSpec.chain(4),
         "dyn224": specmm.TreeSpec.dynamic(depth=2, top_k=2, total_tokens=4),
         "static": specmm.TreeSpec.static(SMALL_STATIC_TREE), "static12": specmm.TreeSpec.static(STATIC_TREE),
         "dynamic": specmm.TreeSpec.dynamic(depth=3, top_k=2, total_tokens=8)}


def main(role: str, tree: str, commit_mode: str, batch_size: int) -> None:
    torch.set_num_threads(1)
    if os.environ.get("INDUCTOR_SIMDLEN"):
        inductor_config.cpp.simdlen = int(os.environ["INDUCTOR_SIMDLEN"])
    record = zoo.record("ssm-code", "cpu")
    draft = code.load(zoo.path("code", record["recipe"]["code_scale"]), device="cpu").draft
    target, tokenizer, prompts = ssm_code.load(zoo.path("ssm-code", "cpu"), role, device="cpu")
    batch = tokenizer(prompts[:batch_size], return_tensors="pt", padding=True)
    pad = tokenizer.pad_token_id
    reference = target.generate(**batch, max_new_tokens=64, min_new_tokens=64, do_sample=False, pad_token_id=pad)
    for compile in (True,) if os.environ.get("ONLY_COMPILED") else (False, True):
        adapter = SSMTarget(target, commit_mode=commit_mode)
        if os.environ.get("NO_WORKAROUND"):  # vector kernels in the SSM graphs too: the crash
            adapter.inductor_patches_for = lambda batch: {}
        gen = specmm.SpeculativeGenerator(adapter, ModelDrafter(draft), tree=TREES[tree], compile=compile)
        for run in range(3):
            out = gen.generate(batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=64,
                               pad_token_id=pad)
            same = torch.equal(out.sequences[:, : reference.shape[1]], reference)
            print(f"{role} {tree} {commit_mode} compile={compile} run {run}: matches HF {same}, mean accepted "
                  f"{out.stats.mean_accepted:.2f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
