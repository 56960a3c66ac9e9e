"""GSD compiled at batch 1 on the zoo `imagegen` (cpu): `GSD.decide` (one group, one sort of the target, per batch of
decisions) against the same rule asked `accept_probability` and `diagnostics` apart, interleaved in one process,
3 x 24 images each, same seeds.

Run: `OMP_NUM_THREADS=2 python benchmarks/gsd_decide_ab.py` (idle 2-core machine). Quoted (stop 44, at 6f433c7):
decide 1.093 / 1.108 / 1.054 s, asked twice 1.169 / 1.161 / 1.113 s: min ratio 1.056, the same tokens.
"""
import time
import torch
from specmm import zoo
from specmm.zoo import imagegen
from specmm.image_ar import ImageSampler
from specmm.image_ar.acceptance.gsd import GSD
torch.set_num_threads(2)
class AskedTwice(GSD):
    decide = None
m = imagegen.load(zoo.build("imagegen", "cpu"), torch.device("cpu"), torch.float32)
sampling = {"cfg_scale": 2.0, "temperature": 1.0, "top_k": 100, "top_p": 1.0}
samplers = {name: ImageSampler(m.lg, proposer="jacobi", acceptance=cls(window=30, p_gap=0.5, quantile=0.2),
                               window=16, compile=True)
            for name, cls in (("decide", GSD), ("twice", AskedTwice))}
def go(s, c, seed):
    return s.sample(torch.tensor([c]), generator=[torch.Generator().manual_seed(seed)], decode=False, **sampling)
for n, s in samplers.items():
    t = time.time()
    go(s, 0, 0)
    go(s, 1, 1)
    print(n, "warm", round(time.time() - t, 1), flush=True)
tot = {n: [] for n in samplers}
toks = {}
for rep in range(3):
    for n, s in samplers.items():
        t = time.perf_counter()
        out = [go(s, i % 10, 1000 + i) for i in range(24)]
        tot[n].append(time.perf_counter() - t)
        toks[n] = torch.cat([o.tokens for o in out])
print({n: [round(x, 3) for x in v] for n, v in tot.items()},
      "min ratio twice/decide", round(min(tot["twice"]) / min(tot["decide"]), 3),
      "same tokens", torch.equal(toks["decide"], toks["twice"]))
