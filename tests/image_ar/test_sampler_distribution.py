"""Lossless sampling end to end: SJD and exact SD sample whole images from the target's own distribution.

A tiny LlamaGen (4 codes, 2x2 grid) has 256 possible images; the exact probability of each under guidance,
temperature and top-k is computed by teacher forcing and compared with samples by a chi-square test.
"""

import itertools

import pytest
import torch

from specmm.core.sampling import SamplingConfig, process_logits
from specmm.core.tree import TreeSpec
from specmm.image_ar import ImageDrafter, ImageSampler

from tests.core.test_engine_sampling import assert_matches

from .conftest import tiny_llamagen

SAMPLES, CLASS, SCALE = 3000, 2, 2.0
SAMPLING = SamplingConfig(temperature=1.0, top_k=3)


@pytest.fixture(scope="module")
def model():
    return tiny_llamagen(vocab=4, block=4, seed=3)


def _exact_probabilities(lg) -> tuple[list[tuple[int, ...]], torch.Tensor]:
    sequences = list(itertools.product(range(4), repeat=4))
    tokens = torch.tensor(sequences)
    with torch.no_grad():
        cond = lg.gpt(torch.full((len(sequences),), CLASS), tokens)
        uncond = lg.gpt(torch.full((len(sequences),), lg.config.num_classes), tokens)
    probs = process_logits(uncond + SCALE * (cond - uncond), SAMPLING)  # [256, 4, V]
    return sequences, probs.gather(-1, tokens[:, :, None])[:, :, 0].prod(-1).double()


def _check(lg, sampler) -> None:
    sequences, expected = _exact_probabilities(lg)
    out = sampler.sample(torch.full((SAMPLES,), CLASS), cfg_scale=SCALE, temperature=1.0, top_k=3,
                         generator=torch.Generator().manual_seed(0), decode=False)
    assert_images_match(out.tokens, sequences, expected)
    assert out.stats.step_compression > 1.0  # drafts were really accepted


def assert_images_match(tokens, sequences, expected) -> None:
    """Sampled images `tokens` [n, N] against the exact probability `expected` [S] of each image in `sequences`:
    chi-square (small cells pooled), and no image outside the support."""
    index = {tuple(seq): i for i, seq in enumerate(sequences)}
    counts = torch.zeros(len(sequences), dtype=torch.float64)
    for row in tokens.tolist():
        counts[index[tuple(row)]] += 1
    assert_matches(counts, expected)


def test_sjd_jacobi_samples_target_distribution(model):
    _check(model, ImageSampler(model, proposer="jacobi", acceptance="sjd", window=4))


@pytest.mark.parametrize("tree", [TreeSpec.chain(2), TreeSpec.dynamic(depth=2, top_k=2, total_tokens=5)],
                         ids=["sampled-chain", "point-mass-tree"])
def test_exact_drafter_samples_target_distribution(model, tree):
    torch.manual_seed(1)
    drafter = ImageDrafter.for_target(model.gpt)
    _check(model, ImageSampler(model, proposer=drafter, acceptance="exact", tree=tree))
