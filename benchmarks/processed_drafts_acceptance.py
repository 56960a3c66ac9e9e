"""Drafts under the target's processors against unprocessed drafts: mean accepted tokens per round, eager, on the
zoo `code` target with `no_repeat_ngram_size` 4, the first 8 held-out prompts one at a time, 128 new tokens.

Command: `OMP_NUM_THREADS=2 python benchmarks/processed_drafts_acceptance.py` (after `specmm zoo build code-drafts`;
idle 2-core machine, at 82b1d25):
    eagle chain4 processed 2.95 unprocessed 2.63
    eagle tree(4,2,10) processed 3.40 unprocessed 3.04
    distilled chain4 processed 2.65 unprocessed 2.39
    distilled tree(4,2,10) processed 2.98 unprocessed 2.84
    code chain4 processed 1.79 unprocessed 1.73
    code tree(4,2,10) processed 2.12 unprocessed 2.07
"""
import torch
import specmm
from specmm import zoo
from specmm.zoo import code, code_drafts
from specmm.drafters import ModelDrafter
m = code.load(zoo.path("code", "cpu"))
tok = m.tokenizer
path = zoo.path("code-drafts", "cpu")
eagle = code_drafts.load(path, "eagle", m.target)
dist = code_drafts.load(path, "distilled", m.target)
from specmm.core.eagle import EagleDrafter  # noqa: E402
makers = {"eagle": lambda: EagleDrafter(eagle.head, m.target), "distilled": lambda: ModelDrafter(dist),
          "code": lambda: ModelDrafter(m.draft)}
m.target.generation_config.no_repeat_ngram_size = 4
specs = {"chain4": specmm.TreeSpec.chain(4), "tree(4,2,10)": specmm.TreeSpec.dynamic(depth=4, top_k=2, total_tokens=10)}
with torch.no_grad():
    for name, make in makers.items():
        for sname, spec in specs.items():
            res = {}
            for processed in (True, False):
                acc = []
                for p in m.prompts[:8]:
                    ids = tok([p], return_tensors="pt")
                    d = make()
                    if not processed:
                        d.processes_drafts = False
                    out = specmm.SpeculativeGenerator(m.target, d, tree=spec).generate(
                        ids.input_ids, attention_mask=ids.attention_mask, max_new_tokens=128,
                        pad_token_id=tok.pad_token_id)
                    acc.append(out.stats.mean_accepted)
                res[processed] = sum(acc) / len(acc)
            print(name, sname, "processed %.2f unprocessed %.2f" % (res[True], res[False]), flush=True)
