"""Compiled LANTERN (chain 6) against compiled AR at batch 1 on the zoo `imagegen` (cpu), 2 x 24 images interleaved,
with the image models' SDPA (V=base) or explicit masked-softmax attention (V=math) patched into the LlamaGen module.

Run: `V=base OMP_NUM_THREADS=2 python benchmarks/image_attention_ab.py 24`, then with `V=math`. Quoted (stop 44, at
327437e, idle 2-core machine): AR / LANTERN ratio 1.258 with SDPA, 1.234 with explicit attention: no gain, so the
models keep SDPA.
"""
import os
import sys
import time
import torch
import torch.nn.functional as F
from specmm import zoo
from specmm.zoo import imagegen
from specmm.image_ar.methods import make_sampler
from specmm.core import TreeSpec
from specmm.image_ar.llamagen import gpt as G
torch.set_num_threads(2)
variant = os.environ.get("V", "base")
sdpa = F.scaled_dot_product_attention
def math_attn(q, k, v, attn_mask=None, is_causal=False):
    if attn_mask is None or is_causal:
        return sdpa(q, k, v, attn_mask=attn_mask, is_causal=is_causal)
    s = (q @ k.transpose(-1, -2)) * (q.shape[-1] ** -0.5)
    s = s.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else s + attn_mask
    return s.softmax(-1) @ v
if variant == "math":
    G.F = type("Fm", (), {"scaled_dot_product_attention": staticmethod(math_attn), "silu": F.silu})
m = imagegen.load(zoo.build("imagegen", "cpu"), torch.device("cpu"), torch.float32)
knobs = dict(window=16, delta=0.2, lam=5.0, lantern_k=32, lantern_pp_k=10, gsd_window=30, gsd_p_gap=0.5,
             gsd_quantile=0.2)
sampling = {"cfg_scale": 2.0, "temperature": 1.0, "top_k": 100, "top_p": 1.0}
samplers = {meth: make_sampler(m.lg, meth, m.drafter, compile=True, tree=TreeSpec.chain(6) if meth != "ar" else None,
                               **knobs)
            for meth in ["ar", "lantern"]}
nimg = int(sys.argv[1]) if len(sys.argv) > 1 else 24
def go(s, c, seed):
    return s.sample(torch.tensor([c]), generator=[torch.Generator().manual_seed(seed)], decode=False, **sampling)
for name, s in samplers.items():
    t = time.time()
    go(s, 0, 0)
    print(name, "warm", round(time.time() - t, 1), flush=True)
tot = {n: 0.0 for n in samplers}
fw = {n: 0 for n in samplers}
for rep in range(2):
  for i in range(nimg):
    for name, s in samplers.items():
        t = time.perf_counter()
        r = go(s, i % 10, 1000 + i)
        tot[name] += time.perf_counter() - t
        fw[name] += r.stats.row_forwards
print(variant, {n: round(tot[n], 3) for n in tot}, "fw", fw, "ratio", round(tot["ar"] / tot["lantern"], 3),
      "ms/round lantern", round(1000 * tot["lantern"] / fw["lantern"], 3),
      "ms/step ar", round(1000 * tot["ar"] / fw["ar"], 3))
