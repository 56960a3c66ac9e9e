"""Repro: compiled STree verify at batch 1 with 8+ tree nodes corrupted the heap on CPU (inductor); fixed in stop 47.

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
- stop 47, found and fixed. AddressSanitizer names the kernel: `ASAN_KERNELS=1` builds inductor's kernels with
  `-fsanitize=address` (C++ compiled in this process: `TORCHINDUCTOR_COMPILE_THREADS=1`), with the runtime
  preloaded: `LD_PRELOAD="/usr/lib/x86_64-linux-gnu/libasan.so.8 /usr/lib/x86_64-linux-gnu/libstdc++.so.6"
  ASAN_OPTIONS=detect_leaks=0 ASAN_KERNELS=1 TORCHINDUCTOR_COMPILE_THREADS=1 SPECMM_CPP_WRAPPER=0
  CUDA_VISIBLE_DEVICES= TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 ONLY_COMPILED=1 python ... mamba2 static12 closed_form 1`.
  At the old code it reported a heap-buffer-overflow WRITE 0 bytes past a 576-byte buffer (12 x 12 floats) in
  the verify graph's kernel for `log_decay = (ancestors[:, None] @ (dt * A)[..., None])[..., 0]`: inductor
  decomposes that batched matrix-vector product ([1, 1, n, n] @ [1, H, n, 1]) on CPU into a multiply and a sum,
  vectorises the sum's outer loop over the heads (H = 12 < 16 float lanes of AVX-512) and stores the result
  through a 16-lane buffer with a loop of 16 (`out_ptr3[x1 + 12*x0 + 12*x0_inner]`, x0_inner < 16) where only
  12 lanes are valid: 4 floats written past the end (batches of 2 and 4 never crashed). The fix
  (`specmm.ssm.tree_scan`): the same sum as a matrix product, `(dt * A) @ ancestors^T` ([B, H, n] @ [B, n, n]),
  which inductor does not decompose (an `extern_kernels.bmm` call). Under AddressSanitizer with vector kernels,
  `mamba2 static12`, `mamba2 dynamic` and `hybrid static12` at batch 1 then run clean and match HF in every run.
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


def sanitize_kernels() -> None:
    """Build inductor's C++ kernels with AddressSanitizer (the runtime must be preloaded, see above)."""
    import torch._inductor.cpp_builder as cpp_builder

    flags = cpp_builder._get_optimization_cflags

    def with_asan(cpp_compiler, min_optimize=False):
        cflags, ldflags = flags(cpp_compiler, min_optimize)
        return cflags + ["fsanitize=address", "fno-omit-frame-pointer", "g"], ldflags + ["fsanitize=address"]
    cpp_builder._get_optimization_cflags = with_asan


def main(role: str, tree: str, commit_mode: str, batch_size: int) -> None:
    torch.set_num_threads(1)
    if os.environ.get("ASAN_KERNELS"):
        sanitize_kernels()
    if os.environ.get("INDUCTOR_SIMDLEN"):
        inductor_config.cpp.simdlen = int(os.environ["INDUCTOR_SIMDLEN"])
    record = zoo.record("ssm-code", "cpu")
    draft = code.load(zoo.path("code", record["recipe"]["code_scale"]), device="cpu").draft
    target, tokenizer, prompts = ssm_code.load(zoo.path("ssm-code", "cpu"), role, device="cpu")
    batch = tokenizer(prompts[:batch_size], return_tensors="pt", padding=True)
    pad = tokenizer.pad_token_id
    reference = target.generate(**batch, max_new_tokens=64, min_new_tokens=64, do_sample=False, pad_token_id=pad)
    for compile in (True,) if os.environ.get("ONLY_COMPILED") else (False, True):
        gen = specmm.SpeculativeGenerator(SSMTarget(target, commit_mode=commit_mode), ModelDrafter(draft),
                                          tree=TREES[tree], compile=compile)
        for run in range(3):
            out = gen.generate(batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=64,
                               pad_token_id=pad)
            same = torch.equal(out.sequences[:, : reference.shape[1]], reference)
            print(f"{role} {tree} {commit_mode} compile={compile} run {run}: matches HF {same}, mean accepted "
                  f"{out.stats.mean_accepted:.2f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
