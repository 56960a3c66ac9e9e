"""The compiled loop before and after its bookkeeping joined the round graph, side by side in one process.

Run: `OMP_NUM_THREADS=2 python benchmarks/fused_round_ab.py {lantern,gsd,core} [--old-commit 5e40635]` (after the
zoo `imagegen` or `code` builds). `old` is `SpeculativeGenerator._loop` as of `--old-commit` (three compiled calls
per round: the round, `record_round`, `round_flags`), `new` is the current loop (one). Both run compiled on the
same inputs, alternating; prints the minimum over 8 runs of each and new / old.
- lantern: zoo `imagegen` at batch 1, the zoo drafter with a chain of 3, 4 images (T=1, top-k 100, cfg 2).
- gsd: the same with Jacobi windows of 8.
- core: zoo `code` at batch 1, `ModelDrafter`, dynamic tree (depth 3, top-k 2, 8 nodes), 128 greedy tokens.
"""

import argparse
import ast
import subprocess
import time
from pathlib import Path

import torch

import specmm
import specmm.core.engine as engine


def old_generator(commit: str) -> type:
    """A `SpeculativeGenerator` whose `_loop` is the one at `commit` (the rest is today's)."""
    root = Path(__file__).resolve().parent.parent
    source = subprocess.run(["git", "show", f"{commit}:specmm/core/engine.py"], cwd=root, check=True,
                            capture_output=True, text=True).stdout
    cls = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == "SpeculativeGenerator")
    loop = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "_loop")
    namespace = dict(vars(engine))
    exec(compile(ast.Module([loop], []), f"{commit}:_loop", "exec"), namespace)  # noqa: S102
    return type("OldLoop", (engine.SpeculativeGenerator,), {"_loop": namespace["_loop"]})


def image_runner(method: str):
    import specmm.image_ar.sampler as sampler_module
    from specmm import zoo
    from specmm.image_ar.methods import make_sampler
    from specmm.zoo import imagegen

    models = imagegen.load(zoo.build("imagegen", "cpu"), torch.device("cpu"))
    knobs = dict(delta=0.2, lam=5.0, lantern_k=32, gsd_window=30, gsd_p_gap=0.5, gsd_quantile=0.2)
    shape = {"tree": specmm.TreeSpec.chain(3)} if method == "lantern" else {"window": 8}
    sampler = make_sampler(models.lg, method, models.drafter, compile=True, **knobs, **shape)

    def run(generator_class) -> None:
        sampler_module.SpeculativeGenerator = generator_class
        for i in range(4):
            sampler.sample(torch.tensor([i]), generator=[torch.Generator().manual_seed(i)], decode=False,
                           cfg_scale=2.0, temperature=1.0, top_k=100, top_p=1.0)
    return run


def core_runner():
    from specmm.bench.inputs import from_zoo
    from specmm.drafters import ModelDrafter

    inputs = from_zoo("code", "cpu", 1, torch.device("cpu"), torch.float32)
    tree = specmm.TreeSpec.dynamic(depth=3, top_k=2, total_tokens=8)
    made = {}

    def run(generator_class) -> None:
        if generator_class not in made:
            made[generator_class] = generator_class(inputs.target, ModelDrafter(inputs.draft), tree=tree, compile=True)
        made[generator_class].generate(inputs.input_ids, attention_mask=inputs.attention_mask, max_new_tokens=128,
                                       eos_token_id=None)
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("case", choices=("lantern", "gsd", "core"))
    parser.add_argument("--old-commit", default="5e40635")
    args = parser.parse_args()
    torch.set_num_threads(2)
    run = core_runner() if args.case == "core" else image_runner(args.case)
    classes = {"old": old_generator(args.old_commit), "new": engine.SpeculativeGenerator}
    with torch.no_grad():
        for cls in classes.values():  # compile and warm both
            run(cls)
            run(cls)
        best = {name: float("inf") for name in classes}
        for _ in range(8):
            for name, cls in classes.items():
                started = time.perf_counter()
                run(cls)
                best[name] = min(best[name], time.perf_counter() - started)
    print(f"{args.case}: old {best['old'] * 1000:.1f} ms, new {best['new'] * 1000:.1f} ms, "
          f"new / old {best['new'] / best['old']:.3f}")


if __name__ == "__main__":
    main()
