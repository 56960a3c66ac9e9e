"""Lossy baselines reduce to stepwise decoding when their knobs are off, and save forwards when on."""

from __future__ import annotations

import torch

from specmm.diffusion_lm import generate
from tests.diffusion_lm.conftest import ToyDLM, tiny_dlm


def _ids(seed=0):
    return torch.randint(0, 38, (2, 6), generator=torch.Generator().manual_seed(seed))


def test_knobs_off_reproduce_stepwise():
    model = tiny_dlm(seed=3, std=0.6)
    ref = generate(model, _ids(), 16, 4, method="stepwise").sequences
    assert torch.equal(generate(model, _ids(), 16, 4, method="low_confidence", tokens_per_step=1).sequences, ref)
    assert torch.equal(generate(model, _ids(), 16, 4, method="threshold", threshold=1.0).sequences, ref)
    never = (float("inf"),) * 3
    assert torch.equal(generate(model, _ids(), 16, 4, method="prophet", prophet_thresholds=never).sequences, ref)


def test_low_confidence_commits_k_per_step():
    out = generate(tiny_dlm(seed=3), _ids(), 16, 4, method="low_confidence", tokens_per_step=2)
    assert out.stats.target_forwards == 8
    assert out.stats.accepted_histogram == [0, 16]  # 2 tokens per iteration: 1 past the stepwise one


def test_threshold_and_prophet_commit_in_parallel_on_a_confident_model():
    model = ToyDLM(length=6 + 16, strength=0.05, seed=0)
    ids = torch.randint(0, 11, (1, 6), generator=torch.Generator().manual_seed(0))
    threshold = generate(model, ids, 16, 8, method="threshold", threshold=0.5)
    prophet = generate(model, ids, 16, 8, method="prophet", prophet_thresholds=(0.5, 0.5, 0.5))
    assert threshold.stats.target_forwards < 16 and prophet.stats.target_forwards < 16
    assert prophet.stats.accepted_histogram[-1] >= 1  # the early exit filled several masks at once
