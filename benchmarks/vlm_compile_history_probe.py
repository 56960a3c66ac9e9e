"""Does a process's compile history slow a compiled row? The zoo captioner's eagle drafter, chain k=2, compiled, over
8 held-out scenes at batch 1 (min / median of 3): fresh, after compiling every drafter's chain and tree rows (what
a full `specmm bench vlm --compile` does before its timed runs), and after `gc.freeze()`. Garbage-collection pauses
in the timed runs are summed from `gc.callbacks`.

Run: `OMP_NUM_THREADS=2 python benchmarks/vlm_compile_history_probe.py` (after the zoo `captioner-drafters` build).
Result at cb52fc3: fresh 1.548 / 1.552 s, after compiling all 1.688 / 1.997 s, after gc.freeze 1.687 / 2.066 s; no
collection ran during any timed run.

`... vlm_compile_history_probe.py eagle-vs-vispec`: the eagle and vispec drafters alone, chain k=3 compiled, each
scene's minimum over 3 alternating passes, summed over the 8 scenes, with the rounds and mean accepted tokens.
"""

import gc
import statistics
import sys
import time

import torch

import specmm
from specmm import zoo
from specmm.bench.vlm import heldout_seeds, scene_batch
from specmm.vlm import VisionDrafter
from specmm.zoo import captioner

METHODS = ("eagle", "msd", "vispec", "dream", "flash")


def load_zoo():
    """(captioner models, {method: drafter}, the first 8 held-out scenes at batch 1), on 2 CPU threads."""
    torch.set_num_threads(2)
    models = captioner.load(zoo.build("captioner", "cpu"), device=torch.device("cpu"), dtype=torch.float32)
    folder = zoo.build("captioner-drafters", "cpu")
    drafters = {m: VisionDrafter.from_pretrained(folder / m, models.target) for m in METHODS}
    return models, drafters, [scene_batch(models, [seed]) for seed in heldout_seeds("cpu")[:8]]


def main() -> None:
    models, drafters, prompts = load_zoo()
    tokenizer = models.processor.tokenizer
    chain, tree = specmm.TreeSpec.chain(2), specmm.TreeSpec.dynamic(depth=3, top_k=2, total_tokens=6)
    paused, started = [0.0], [0.0]

    def on_gc(phase, info) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            paused[0] += time.perf_counter() - started[0]
    gc.callbacks.append(on_gc)

    def run(method: str, spec: specmm.TreeSpec) -> None:
        for enc in prompts:
            gen = specmm.SpeculativeGenerator(models.target, drafters[method], tree=spec, compile=True)
            gen.generate(**enc, max_new_tokens=160, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)

    def measure(label: str) -> None:
        times, paused[0] = [], 0.0
        for _ in range(3):
            begun = time.perf_counter()
            run("eagle", chain)
            times.append(time.perf_counter() - begun)
        print(f"{label}: eagle chain, 8 scenes: min {min(times):.3f} median {statistics.median(times):.3f} s; "
              f"gc pauses {paused[0]:.3f} s", flush=True)

    if sys.argv[1:] == ["eagle-vs-vispec"]:
        with torch.no_grad():
            eagle_vs_vispec(models, drafters, prompts)
        return
    with torch.no_grad():
        run("eagle", chain), run("eagle", chain)
        measure("fresh")
        for method in METHODS:
            run(method, chain), run(method, tree)
        measure("after compiling all")
        gc.freeze()
        measure("after gc.freeze")


def eagle_vs_vispec(models, drafters: dict, prompts: list[dict]) -> None:
    tokenizer = models.processor.tokenizer

    def caption(method: str, enc: dict):
        gen = specmm.SpeculativeGenerator(models.target, drafters[method], tree=specmm.TreeSpec.chain(3), compile=True)
        begun = time.perf_counter()
        out = gen.generate(**enc, max_new_tokens=160, eos_token_id=tokenizer.eos_token_id,
                           pad_token_id=tokenizer.pad_token_id)
        return time.perf_counter() - begun, out.stats

    methods = ("eagle", "vispec")
    for method in methods:  # compile and warm
        for enc in prompts:
            caption(method, enc)
    best = {m: [float("inf")] * len(prompts) for m in methods}
    stats = {}
    for _ in range(3):
        for method in methods:
            for i, enc in enumerate(prompts):
                seconds, stats[method, i] = caption(method, enc)
                best[method][i] = min(best[method][i], seconds)
    for method in methods:
        rounds = sum(stats[method, i].target_forwards for i in range(len(prompts)))
        accepted = statistics.mean(stats[method, i].mean_accepted for i in range(len(prompts)))
        print(f"{method}: {sum(best[method]):.3f} s over {len(prompts)} scenes (sum of per-scene minima), {rounds} "
              f"rounds, mean accepted per scene {accepted:.2f}")


if __name__ == "__main__":
    main()
