"""Can the zoo `cspd` samples be told apart from target-only samples at all? A sharper check than FID on a weak
classifier: the energy distance between the raw latent token maps, with a permutation p-value.

Run: `python benchmarks/cspd_latent_energy_check.py` (after `specmm zoo build cspd --scale cpu`). Draws 800
class-balanced images (batches of 100) per method: the target alone with a second seed (the noise floor), the
target at temperature 0.9 (a mild shift the check must flag to be informative), the draft alone, and CSpD with each
rule at k = 5, and compares each with 800 target-only images. A p-value near 0 means the two sets differ.
"""

import torch

from specmm import zoo
from specmm.image_ar.continuous import CSpDSampler, sample_ar
from specmm.zoo import cspd


def energy_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """2 E|a - b| - E|a - a'| - E|b - b'| (V-statistic) for samples [N, D] and [M, D]."""
    return 2 * torch.cdist(a, b).mean() - torch.cdist(a, a).mean() - torch.cdist(b, b).mean()


def permutation_p(a: torch.Tensor, b: torch.Tensor, permutations: int = 200) -> tuple[float, float]:
    observed, pool = energy_distance(a, b), torch.cat([a, b])
    gen, hits = torch.Generator().manual_seed(0), 0
    for _ in range(permutations):
        order = torch.randperm(len(pool), generator=gen)
        hits += int(energy_distance(pool[order[: len(a)]], pool[order[len(a):]]) >= observed)
    return float(observed), (hits + 1) / (permutations + 1)


@torch.no_grad()
def main(images: int = 800) -> None:
    models = cspd.load(zoo.path("cspd", "cpu"))
    target, draft = models["target"], models["draft"]
    labels = torch.arange(images) % 10

    def draw(sample, seed: int) -> torch.Tensor:  # [N, tokens * dim] float64
        gen = torch.Generator().manual_seed(seed)
        return torch.cat([sample(chunk, gen).tokens for chunk in labels.split(100)]).flatten(1).double()

    reference = draw(lambda c, g: sample_ar(target, c, generator=g), 0)
    methods = {"target-only AR, 2nd seed (noise floor)": lambda c, g: sample_ar(target, c, generator=g),
               "target-only AR at temperature 0.9 (power control)":
                   lambda c, g: sample_ar(target, c, temperature=0.9, generator=g),
               "draft-only AR": lambda c, g: sample_ar(draft, c, generator=g)}
    for rule in ("final-step", "trajectory"):
        sampler = CSpDSampler(target, draft, draft_tokens=5, rule=rule)
        methods[f"CSpD {rule} k=5"] = lambda c, g, s=sampler: s.sample(c, generator=g)
    print(f"| vs {images} target-only images | energy distance | permutation p |\n|---|---:|---:|")
    for seed, (name, sample) in enumerate(methods.items(), start=1):
        distance, p = permutation_p(reference, draw(sample, seed))
        print(f"| {name} | {distance:.4f} | {p:.3f} |")


if __name__ == "__main__":
    main()
