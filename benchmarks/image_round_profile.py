"""torch.profiler over one compiled LANTERN (or any method's) sampling batch on the zoo `imagegen` (cpu), chain 6,
after a warm-up: per-op CPU time, then per input shape.

Run: `SPECMM_CPP_WRAPPER=0 OMP_NUM_THREADS=2 python benchmarks/image_round_profile.py BATCH [METHOD]` (the Python
wrapper, so that the profiler sees every kernel). Quoted (stop 44, at 327437e, idle 2-core machine), batch 8, lantern:
the verify's `aten::mm [112, 128] x [128, 512]` took 118 us a call against 18.3 us for the `[16, 128]` one of an AR
step (6.5x for 7x the rows): at 16 guided rows this CPU is compute-bound.
"""
import sys
import time
import torch
from specmm import zoo
from specmm.zoo import imagegen
from specmm.image_ar.methods import make_sampler
from specmm.core import TreeSpec
torch.set_num_threads(2)
import torch._inductor.config as ic  # noqa: E402
ic.cpp.enable_kernel_profile = True
bs = int(sys.argv[1])
method = sys.argv[2] if len(sys.argv) > 2 else "lantern"
m = imagegen.load(zoo.build("imagegen", "cpu"), torch.device("cpu"), torch.float32)
knobs = dict(window=16, delta=0.2, lam=5.0, lantern_k=32, lantern_pp_k=10, gsd_window=30, gsd_p_gap=0.5,
             gsd_quantile=0.2)
s = make_sampler(m.lg, method, m.drafter, compile=True, tree=TreeSpec.chain(6) if method != "ar" else None, **knobs)
sampling = {"cfg_scale": 2.0, "temperature": 1.0, "top_k": 100, "top_p": 1.0}
classes = torch.tensor([i % len(m.classes) for i in range(bs)])
def go(seed):
    gens = [torch.Generator().manual_seed(seed + i) for i in range(bs)]
    return s.sample(classes, generator=gens, decode=False, **sampling)
t = time.time()
go(0)
print("warm", time.time() - t)
for i in range(2):
    t = time.time()
    r = go(10 + i)
    print("run", time.time() - t, r.stats.row_forwards)
from torch.profiler import profile, ProfilerActivity  # noqa: E402
with profile(activities=[ProfilerActivity.CPU]) as p:
    r = go(100)
print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=80, max_name_column_width=130))
with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as p:
    r = go(100)
print(p.key_averages(group_by_input_shape=True).table(sort_by="self_cpu_time_total", row_limit=25,
                                                      max_name_column_width=40, max_shapes_column_width=90))
