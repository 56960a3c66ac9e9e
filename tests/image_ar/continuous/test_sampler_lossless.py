"""CSpD's output distribution is the target's: two-sample tests with the power to see a 5% shift."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import ks_2samp, ttest_ind

from specmm.image_ar.continuous import CSpDSampler, sample_ar
from tests.conftest import perturbed_copy
from tests.image_ar.continuous.conftest import tiny_model

SAMPLES = 20_000
ALPHA = 1e-3  # family-wise, Bonferroni over the 8 coordinates (4 tokens x 2 dims) and two tests


def differs(a, b) -> bool:
    """Per-coordinate KS (shape) and Welch t (mean) tests on [n, D] samples; True when any rejects."""
    level = ALPHA / (2 * a.shape[1])
    return any(ks_2samp(a[:, i], b[:, i]).pvalue < level or ttest_ind(a[:, i], b[:, i], equal_var=False).pvalue < level
               for i in range(a.shape[1]))


def draws(target, draft, rule, seed, **kw):
    labels = torch.arange(SAMPLES) % 2
    reference = sample_ar(target, labels, generator=torch.Generator().manual_seed(100 + seed)).tokens.flatten(1)
    out = CSpDSampler(target, draft, rule=rule, **kw).sample(labels, generator=torch.Generator().manual_seed(seed))
    return reference.numpy(), out.tokens.flatten(1).numpy(), out.stats


@pytest.mark.parametrize("rule", ["trajectory", "final-step"])
def test_one_step_gaussian_head_output_matches_the_target_and_the_test_sees_a_5_percent_shift(rule):
    target = tiny_model()
    draft = perturbed_copy(target, 0.3, seed=5)
    reference, speculative, stats = draws(target, draft, rule, seed=1, draft_tokens=2)
    assert 0.2 < stats.continuous.acceptance_rate < 0.98 and stats.continuous.fallbacks == 0  # both branches run
    assert not differs(reference, speculative)
    shifted = speculative.copy()
    shifted[:, 5] += 0.05 * shifted[:, 5].std()
    assert differs(reference, shifted)  # the same test at this sample size detects a 5% shift in one coordinate
    draft_only = sample_ar(draft, torch.arange(SAMPLES) % 2, generator=torch.Generator().manual_seed(7)).tokens
    assert differs(reference, draft_only.flatten(1).numpy())  # and the draft's own distribution


def test_trajectory_rule_is_exact_for_a_multi_step_ddpm_head_in_random_order():
    target = tiny_model(head="ddpm", diffusion_steps=3, order="random")
    draft = perturbed_copy(target, 0.05, seed=5)
    reference, speculative, stats = draws(target, draft, "trajectory", seed=2, draft_tokens=3, prefill_tokens=1)
    assert 0.1 < stats.continuous.acceptance_rate < 0.98 and stats.continuous.fallbacks == 0
    assert not differs(reference, speculative)
