"""A/B in one process: drafts under the target's processors (`processes_drafts`, the default) against unprocessed
drafts, compiled, on an `ssm-code` target with its distilled draft, batch 4, 64 tokens, no_repeat_ngram_size 4; min of
3 interleaved runs after a compiling one.

Command: `OMP_NUM_THREADS=1 python benchmarks/processed_drafts_ab.py mamba2` (idle 2-core machine, at e3d7a35):
    mamba2 chain2 {True: (0.317, 1.94), False: (0.32, 1.87)}
    mamba2 static6 {True: (0.295, 2.49), False: (0.28, 2.37)}
(seconds, mean accepted): at batch 4 on this CPU the processing costs about what the extra acceptance gains.
"""
import time
import torch
import specmm
import sys
from specmm import zoo
from specmm.zoo import ssm_code
from specmm.ssm import SSMTarget
from specmm.drafters import ModelDrafter
torch.set_num_threads(1)
role = sys.argv[1]
target, tok, prompts = ssm_code.load(zoo.path("ssm-code", "cpu"), role)
target.generation_config.no_repeat_ngram_size = 4
draft = ssm_code.load_draft(zoo.path("ssm-code-drafts", "cpu"), role)
batch = tok(prompts[:4], return_tensors="pt", padding=True)
specs = {"chain2": specmm.TreeSpec.chain(2), "static6": specmm.TreeSpec.static([[0], [1], [0, 0], [0, 1], [0, 0, 0]])}
def run(spec, processed):
    d = ModelDrafter(draft)
    if not processed:
        d.processes_drafts = False
    g = specmm.SpeculativeGenerator(SSMTarget(target, commit_mode="closed_form"), d, tree=spec, compile=True)
    t = time.perf_counter()
    out = g.generate(batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=64,
                     pad_token_id=tok.pad_token_id)
    return time.perf_counter() - t, out.stats.mean_accepted
with torch.no_grad():
    for name, spec in specs.items():
        for p in (True, False):
            run(spec, p)  # compile
        times = {True: [], False: []}
        acc = {}
        for _ in range(3):
            for p in (True, False):
                s, a = run(spec, p)
                times[p].append(s)
                acc[p] = a
        print(role, name, {p: (round(min(times[p]), 3), round(acc[p], 2)) for p in times}, flush=True)
