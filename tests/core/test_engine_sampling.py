"""Sampling exactness: the joint law of the first three new tokens equals the target's own processed sampling.

The reference is exact: the target's processed distributions enumerated over every continuation (V = 8,
so 512 outcomes); specmm's samples are checked against it with a chi-square test.
"""

from __future__ import annotations

import functools

import pytest
import torch
from scipy.stats import chisquare

import specmm
from specmm.core.sampling import process_logits
from specmm.drafters import EagleDrafter, ModelDrafter
from tests.conftest import perturbed_copy, report_acceptance, tiny_model

VOCAB = 8
SAMPLES = 20_000
CHUNK = 5_000
PROMPT = torch.tensor([[3, 1, 4, 1, 5]])

SAMPLINGS = {
    "t0.7": specmm.SamplingConfig(temperature=0.7),
    "t0.7-topk3": specmm.SamplingConfig(temperature=0.7, top_k=3),
    "t0.7-topp0.8": specmm.SamplingConfig(temperature=0.7, top_p=0.8),
}
TREES = {
    "chain-sampled": specmm.TreeSpec.chain(2),
    "static-deterministic": specmm.TreeSpec.static([[0], [1], [2], [0, 0], [0, 1], [1, 0]]),
    "dynamic-deterministic": specmm.TreeSpec.dynamic(depth=3, top_k=2, total_tokens=8),
}


@functools.cache
def models():
    target = tiny_model("llama", vocab=VOCAB, logit_scale=15.0)
    draft = perturbed_copy(target, 0.6)
    return target, draft


def exact_joint(model, sampling: specmm.SamplingConfig) -> torch.Tensor:
    """[V, V, V] probability of each three-token continuation of PROMPT under the processed target."""
    with torch.no_grad():
        first = process_logits(model(PROMPT).logits[0, -1], sampling)  # [V]
        one = torch.arange(VOCAB)[:, None]
        second = process_logits(model(torch.cat([PROMPT.expand(VOCAB, -1), one], 1)).logits[:, -1], sampling)
        pairs = torch.cartesian_prod(torch.arange(VOCAB), torch.arange(VOCAB))  # [V*V, 2]
        third = process_logits(model(torch.cat([PROMPT.expand(VOCAB * VOCAB, -1), pairs], 1)).logits[:, -1], sampling)
    return (first[:, None, None] * second[:, :, None] * third.view(VOCAB, VOCAB, VOCAB)).double()


def speculative_counts(drafter, tree, sampling, seed: int) -> tuple[torch.Tensor, specmm.GenerationStats]:
    """[V^3] counts of the first three new tokens over SAMPLES runs."""
    target, _ = models()
    generator = torch.Generator().manual_seed(seed)
    counts = torch.zeros(VOCAB ** 3, dtype=torch.long)
    gen = specmm.SpeculativeGenerator(target, drafter, tree=tree)
    for _ in range(SAMPLES // CHUNK):
        out = gen.generate(PROMPT.expand(CHUNK, -1), max_new_tokens=3, sampling=sampling, generator=generator)
        new = out.sequences[:, PROMPT.shape[1]:]
        assert new.shape == (CHUNK, 3)
        counts += torch.bincount(new[:, 0] * VOCAB * VOCAB + new[:, 1] * VOCAB + new[:, 2], minlength=VOCAB ** 3)
    return counts, out.stats


def assert_matches(counts: torch.Tensor, expected_probs: torch.Tensor) -> None:
    """Chi-square goodness of fit (cells with expected < 5 pooled) and no mass where the target has none."""
    expected = expected_probs.flatten() / expected_probs.sum() * counts.sum()
    assert counts[expected_probs.flatten() == 0].sum() == 0, "sampled a continuation the target cannot produce"
    small = expected < 5
    observed = torch.cat([counts[~small].double(), counts[small].sum(0, keepdim=True).double()])
    wanted = torch.cat([expected[~small], expected[small].sum(0, keepdim=True)])
    keep = wanted > 0
    result = chisquare(observed[keep].numpy(), wanted[keep].numpy())
    assert result.pvalue > 1e-3, f"chi-square p-value {result.pvalue:.2e} over {int(keep.sum())} cells"


@pytest.mark.parametrize("tree_name", list(TREES))
@pytest.mark.parametrize("sampling_name", list(SAMPLINGS))
def test_sampled_joint_distribution_matches_target(sampling_name, tree_name):
    target, draft = models()
    sampling = SAMPLINGS[sampling_name]
    counts, stats = speculative_counts(ModelDrafter(draft), TREES[tree_name], sampling, seed=7)
    report_acceptance(f"sampling/{sampling_name}/{tree_name}", stats)
    histogram = stats.accepted_histogram
    assert histogram[0] > 0 and sum(histogram[1:]) > 0, "both rejections and acceptances must occur"
    assert_matches(counts, exact_joint(target, sampling))


def test_sampled_eagle_dynamic_tree_matches_target():
    target, _ = models()
    torch.manual_seed(0)
    drafter = EagleDrafter.for_target(target)
    sampling = SAMPLINGS["t0.7"]
    counts, stats = speculative_counts(drafter, TREES["dynamic-deterministic"], sampling, seed=11)
    assert_matches(counts, exact_joint(target, sampling))


def test_chi_square_detects_a_wrong_distribution():
    """The check has power: samples from the unprocessed (temperature 1) target fail against temperature 0.7."""
    target, draft = models()
    counts, _ = speculative_counts(ModelDrafter(draft), TREES["chain-sampled"], specmm.SamplingConfig(1.0), seed=3)
    with pytest.raises(AssertionError, match="chi-square"):
        assert_matches(counts, exact_joint(target, SAMPLINGS["t0.7"]))


def test_same_seed_gives_same_samples_and_rows_use_their_own_generator():
    target, draft = models()
    prompt = PROMPT.expand(4, -1)
    sampling = SAMPLINGS["t0.7"]
    gen = specmm.SpeculativeGenerator(target, ModelDrafter(draft), tree=TREES["chain-sampled"])

    def run(seeds):
        gens = [torch.Generator().manual_seed(s) for s in seeds]
        return gen.generate(prompt, max_new_tokens=12, sampling=sampling, generator=gens).sequences

    first, again = run([1, 2, 3, 4]), run([1, 2, 3, 4])
    assert torch.equal(first, again)
    shuffled = run([4, 2, 3, 1])  # a row's tokens depend only on its own generator
    assert torch.equal(shuffled[1:3], first[1:3]) and torch.equal(shuffled[0], first[3])
