"""GSD's Jacobi window against compiled AR at batch 1 on a zoo `imagegen` build, interleaved in one process (min of 3
x 24 images, same seeds; GSD knobs as the image_ar reports: group window 30, gap 0.5, quantile 0.2).

Run: `OMP_NUM_THREADS=2 python benchmarks/gsd_window_probe.py SCALE WINDOWS`, e.g. `cpu 6,8,12,16`. Quoted (stop 44,
at 0de8c2e, idle 2-core machine), `cpu 6,8,12,16`: against AR (1.085 s), windows 6 / 8 / 12 / 16 read 1.09x / 1.05x /
1.06x / 0.93x at 2.10 / 2.18 / 2.52 / 2.58 tokens per forward: past 12 the window adds verify work (a 16-token
guided verify is 32 rows, compute-bound on this CPU) and almost no tokens. None is near 18.2's 1.5x.
"""
import sys
import time
import torch
from specmm import zoo
from specmm.zoo import imagegen
from specmm.image_ar import ImageSampler
from specmm.image_ar.acceptance.gsd import GSD
torch.set_num_threads(2)
m = imagegen.load(zoo.build("imagegen", sys.argv[1]), torch.device("cpu"), torch.float32)
sampling = {"cfg_scale": 2.0, "temperature": 1.0, "top_k": 100, "top_p": 1.0}
windows = [int(w) for w in sys.argv[2].split(",")]
samplers = {"ar": ImageSampler(m.lg, proposer="ar", compile=True)}
for w in windows:
    samplers[f"gsd w{w}"] = ImageSampler(m.lg, proposer="jacobi", acceptance=GSD(window=30, p_gap=0.5, quantile=0.2),
                                         window=w, compile=True)
def go(s, c, seed):
    return s.sample(torch.tensor([c]), generator=[torch.Generator().manual_seed(seed)], decode=False, **sampling)
for n, s in samplers.items():
    t = time.time()
    go(s, 0, 0)
    go(s, 1, 1)
    print(n, "warm", round(time.time() - t, 1), flush=True)
tot = {n: [] for n in samplers}
fw = {n: 0 for n in samplers}
for rep in range(3):
    for n, s in samplers.items():
        t = time.perf_counter()
        for i in range(24):
            fw[n] += go(s, i % 10, 1000 + i).stats.row_forwards
        tot[n].append(time.perf_counter() - t)
ar = min(tot["ar"])
for n in samplers:
    print(n, "min s", round(min(tot[n]), 3), "vs ar", round(ar / min(tot[n]), 3),
          "tokens/forward", round(3 * 24 * 64 / fw[n], 2))
