"""A/B: the cost of the SSM target's CPU batch-1 workaround (`{"cpp.simdlen": 1}`: no vector kernels in its graphs)
on compiled rounds, at batch 4 (where specmm does not apply it) and batch 1, for trees small enough to run vectorised.

Run: `OMP_NUM_THREADS=1 python benchmarks/ssm_simdlen_ab.py [mamba2|hybrid] [batch]` (zoo `ssm-code` and
`ssm-code-drafts` at scale cpu). One process, both arms on the same prompts, a static 6-node tree and a chain of 2,
interleaved; prints each arm's min of 5 timed generations (64 new tokens) and whether its tokens equal HF greedy
`generate`.

Stop 47, idle 2-core machine, one thread, Mamba2, distilled draft (seconds, scalar / vectorised):
- batch 4: static tree 0.2206 / 0.1944, chain 0.1981 / 0.1749 (scalar 12-13% slower);
- batch 1: static tree 0.0968 / 0.0900, chain 0.0870 / 0.0829 (5-8% slower).
"""

import sys
import time

import torch

import specmm
from specmm import zoo
from specmm.bench.ssm import SMALL_STATIC_TREE
from specmm.drafters import ModelDrafter
from specmm.ssm import SSMTarget
from specmm.zoo import ssm_code


def main(role: str = "mamba2", batch_size: int = 4) -> None:
    torch.set_num_threads(1)
    target, tokenizer, prompts = ssm_code.load(zoo.path("ssm-code", "cpu"), role, device="cpu")
    draft = ssm_code.load_draft(zoo.path("ssm-code-drafts", "cpu"), role, device="cpu")
    batch = tokenizer(prompts[:batch_size], return_tensors="pt", padding=True)
    pad, new = tokenizer.pad_token_id, 64
    reference = target.generate(**batch, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=pad)
    trees = {"static6": specmm.TreeSpec.static(SMALL_STATIC_TREE), "chain2": specmm.TreeSpec.chain(2)}
    arms = {}
    for tree_name, tree in trees.items():
        for arm, patches in (("simdlen1", {"cpp.simdlen": 1}), ("vectorised", {})):
            adapter = SSMTarget(target)
            adapter.inductor_patches_for = lambda batch, patches=patches: patches
            arms[tree_name, arm] = specmm.SpeculativeGenerator(adapter, ModelDrafter(draft), tree=tree, compile=True)
    times = {key: [] for key in arms}
    with torch.no_grad():
        for repeat in range(6):  # the first is the warm-up (compiles)
            for key, gen in arms.items():
                started = time.perf_counter()
                out = gen.generate(batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=new,
                                   pad_token_id=pad)
                if repeat:
                    times[key].append(time.perf_counter() - started)
                assert torch.equal(out.sequences[:, : reference.shape[1]], reference), key
    for key, seconds in times.items():
        print(f"{role} batch {batch_size} {key[0]} {key[1]}: min {min(seconds):.4f} s (matches HF: yes)")


if __name__ == "__main__":
    main(*(sys.argv[1:2] or ["mamba2"]), *(int(a) for a in sys.argv[2:3]))
