"""The sampled acceptance walk of a chain, level by level (`walk_tree`) and batched (`walk_chain`), A/B'd.

Run: `OMP_NUM_THREADS=2 python benchmarks/chain_walk_ab.py` (after `specmm zoo build imagegen --scale cpu`).
Each variant runs in its own process (dynamo would keep the other variant's graphs), alternating loop, chain,
loop, chain: zoo `imagegen`, compiled, batch 1, T=1, top-k 100, cfg 2, Jacobi windows of 16 (GSD: rank window
30, gap 0.5, quantile 0.2, as `bench image_ar` is run), a compiled AR row beside them; after a warm-up image
each, three passes over 16 images, and the minimum and median ms per image token. `loop` patches
`accept_sampled`'s chain fast path back to the level-by-level walk; both give the same tokens.
"""

import argparse
import os
import subprocess
import sys
import time

import torch

METHODS = ("ar", "gsd", "sjd")
KNOBS = dict(window=16, delta=0.2, lam=5.0, lantern_k=32, lantern_pp_k=10, gsd_window=30, gsd_p_gap=0.5,
             gsd_quantile=0.2)
SAMPLING = {"cfg_scale": 2.0, "temperature": 1.0, "top_k": 100, "top_p": 1.0}


def measure(variant: str, images: int) -> None:
    import specmm.core.acceptance as acceptance

    if variant == "loop":
        acceptance.walk_chain = acceptance.walk_tree
    from specmm import zoo
    from specmm.image_ar.methods import make_sampler
    from specmm.zoo import imagegen

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    models = imagegen.load(zoo.build("imagegen", "cpu"), torch.device("cpu"))
    samplers = {m: make_sampler(models.lg, m, models.drafter, compile=True, **KNOBS) for m in METHODS}

    def run(sampler, first: int, count: int) -> tuple[float, int, int, torch.Tensor]:
        seconds, forwards, tokens = 0.0, 0, []
        for i in range(first, first + count):
            out = sampler.sample(torch.tensor([i % 10]), generator=[torch.Generator().manual_seed(i)], decode=False,
                                 **SAMPLING)
            seconds, forwards = seconds + out.stats.wall_time_s, forwards + out.stats.row_forwards
            tokens.append(out.tokens)
        return seconds, torch.cat(tokens).numel(), forwards, torch.cat(tokens)

    for sampler in samplers.values():
        run(sampler, 0, 1)
    passes = {m: [run(s, 1000, images) for _ in range(3)] for m, s in samplers.items()}
    for method, runs in passes.items():
        seconds = sorted(r[0] for r in runs)
        _, tokens, forwards, ids = runs[0]
        print(f"{variant} {method}: min {seconds[0] / tokens * 1e3:.3f} median {seconds[1] / tokens * 1e3:.3f} "
              f"ms/token, {seconds[0] / forwards * 1e3:.3f} ms/round (min), {tokens / forwards:.2f} tokens/forward, "
              f"token checksum {int((ids * torch.arange(ids.numel()).view_as(ids)).sum())}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=("loop", "chain"))
    parser.add_argument("--images", type=int, default=16)
    parser.add_argument("--alternations", type=int, default=2)
    args = parser.parse_args()
    if args.variant:
        return measure(args.variant, args.images)
    for _ in range(args.alternations):
        for variant in ("loop", "chain"):
            started = time.time()
            subprocess.run([sys.executable, __file__, "--variant", variant, "--images", str(args.images)], check=True,
                           stderr=subprocess.DEVNULL)
            print(f"({variant}: {time.time() - started:.0f} s with warm-up)", flush=True)


if __name__ == "__main__":
    main()
