"""Stop 40 device smoke: compiled chain / tree / HF static-compile on CUDA after the CUDA-graph output fix."""
import sys
import time
import torch
import specmm
from specmm.bench.inputs import from_zoo
from specmm.bench.core import plain_decoding
from specmm.drafters import ModelDrafter
dev = sys.argv[1] if len(sys.argv) > 1 else "cuda"
dtype = torch.bfloat16 if dev == "cuda" else torch.float32
new = int(sys.argv[2]) if len(sys.argv) > 2 else 128
data = from_zoo("code", "cpu", 1, dev, dtype)
t, d, ids, mask = data.target, data.draft, data.input_ids, data.attention_mask
def sync():
    if dev == "cuda":
        torch.cuda.synchronize()
def timed(fn, n=3):
    out = fn()
    sync()
    ts = []
    for _ in range(n):
        s = time.perf_counter()
        out = fn()
        sync()
        ts.append(time.perf_counter() - s)
    return out, sorted(ts)[len(ts) // 2]
ref, t_hf = timed(lambda: plain_decoding(t, ids, mask, False, new, 0, None).rows[0])
print(f"HF eager: {new / t_hf:.1f} tok/s", flush=True)
def spec(tree, drafter, compile):
    g = specmm.SpeculativeGenerator(t, drafter(), tree=tree, compile=compile)
    def run():
        out = g.generate(ids, attention_mask=mask, max_new_tokens=new, pad_token_id=0)
        return out.sequences[0, ids.shape[1]:].tolist(), out.stats.mean_accepted
    s = time.perf_counter()
    run()
    sync()
    first = time.perf_counter() - s
    (toks, acc), sec = timed(run)
    return toks, acc, sec, first, g.whole_round
def hf_static():
    try:
        out, t_st = timed(lambda: plain_decoding(t, ids, mask, True, new, 0, None).rows[0])
        print(f"HF static+compile: {new / t_st:.1f} tok/s = {t_hf / t_st:.2f}x HF eager, "
              f"match {out == ref}", flush=True)
    except Exception as e:
        print(f"HF static+compile FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
for name, tree, drafter in [
    ("chain k=4", specmm.TreeSpec.chain(4), lambda: ModelDrafter(d)),
    ("tree (5,4,24)", specmm.TreeSpec.dynamic(depth=5, top_k=4, total_tokens=24), lambda: ModelDrafter(d)),
    ("lookup k=8", specmm.TreeSpec.chain(8), lambda: specmm.drafters.PromptLookupDrafter(ngram=3, k=8)),
]:
    for compile in ([True] if dev == "cuda" else [False]):
        try:
            toks, acc, sec, first, whole = spec(tree, drafter, compile)
            print(f"{name} compile={compile}: {new / sec:.1f} tok/s = {t_hf / sec:.2f}x HF eager, acc {acc:.2f}, "
                  f"match {toks == ref}, first call {first:.1f}s, whole round {whole}", flush=True)
        except Exception as e:
            print(f"{name} compile={compile}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
            from specmm.core.compiled import reset_graphs
            reset_graphs()
    if name == "chain k=4" and dev == "cuda":
        hf_static()
if dev != "cuda":
    hf_static()
