"""Repro: compiled STree verify at batch 1 with 8 or more tree nodes corrupts the heap on CPU (inductor).

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
- not yet conclusive: 256-bit vectors, no tail vectorisation, no tiling heuristics and no buffer reuse still
  crashed, and inductor's compiler bisector (`python -m torch._inductor.compiler_bisector run`) found no subsystem
  whose removal fixes it; but those runs shared one on-disk inductor cache (`/tmp/torchinductor_<user>`), which
  the same experiments were later seen to pollute (three unrelated compiled tests failed on it and passed on an
  empty cache), so they may have reused the crashing kernels. Re-check each with
  `TORCHINDUCTOR_FORCE_DISABLE_CACHES=1`.
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
