"""Acceptance rules: the trajectory and final-step ratios coincide for one-step heads and match closed forms."""

from __future__ import annotations

import torch

from specmm.image_ar.continuous.chain import draw_noise, sample_chain
from specmm.image_ar.continuous.rules import (
    Drafts,
    FinalStepRule,
    TrajectoryRule,
    acceptance_probability,
    residual_acceptance_probability,
)
from tests.conftest import perturbed_copy
from tests.image_ar.continuous.conftest import tiny_model


def drafts_of(draft_head, z, seed=0) -> Drafts:
    noise = draw_noise((z.shape[0],), draft_head, z.dtype, z.device, torch.Generator().manual_seed(seed))
    trajectory, log_density = sample_chain(draft_head, z, noise)
    return Drafts(noise[:, None], trajectory[:, None], log_density[:, None], z[:, None])


def test_one_step_gaussian_ratios_agree_and_equal_the_closed_form():
    target = tiny_model(dtype=torch.float64)
    draft = perturbed_copy(target, 0.3, seed=5)
    z_draft, z_target = torch.randn(8, 16, dtype=torch.float64), torch.randn(8, 16, dtype=torch.float64)
    drafts = drafts_of(draft.head, z_draft)
    trajectory_ratio, _ = TrajectoryRule().log_ratio(target.head, draft.head, drafts, z_target[:, None], 1.0)
    final_ratio, _ = FinalStepRule().log_ratio(target.head, draft.head, drafts, z_target[:, None], 1.0)
    ones = torch.ones(8, dtype=torch.long)
    mean_p, std_p = target.head.transition(drafts.trajectory[:, 0, 0], ones, z_target)
    mean_q, std_q = draft.head.transition(drafts.trajectory[:, 0, 0], ones, z_draft)
    token = drafts.trajectory[:, 0, -1]
    closed = (torch.distributions.Normal(mean_p, std_p).log_prob(token).sum(-1)
              - torch.distributions.Normal(mean_q, std_q).log_prob(token).sum(-1))
    torch.testing.assert_close(trajectory_ratio[:, 0], closed)
    torch.testing.assert_close(final_ratio[:, 0], closed)


def test_multi_step_trajectory_ratio_is_zero_for_identical_heads_and_final_step_differs_from_it():
    target = tiny_model(head="ddpm", diffusion_steps=4, beta_schedule="squaredcos_cap_v2", dtype=torch.float64)
    draft = perturbed_copy(target, 0.2, seed=5)
    z = torch.randn(8, 16, dtype=torch.float64)
    same = drafts_of(target.head, z)
    ratio, _ = TrajectoryRule().log_ratio(target.head, target.head, same, z[:, None], 1.0)
    torch.testing.assert_close(ratio, torch.zeros_like(ratio))
    other = drafts_of(draft.head, z)
    trajectory_ratio, _ = TrajectoryRule().log_ratio(target.head, draft.head, other, z[:, None], 1.0)
    final_ratio, _ = FinalStepRule().log_ratio(target.head, draft.head, other, z[:, None], 1.0)
    assert not torch.allclose(trajectory_ratio, final_ratio)  # the final-step test is an approximation for T > 1


def test_acceptance_probabilities():
    log_ratio = torch.tensor([-1.0, 0.0, 2.0])
    torch.testing.assert_close(acceptance_probability(log_ratio), torch.tensor([torch.e ** -1, 1.0, 1.0]))
    log_p, log_q = torch.tensor([0.0, 0.0, -1.0]), torch.tensor([-1.0, 0.0, 0.0])
    torch.testing.assert_close(residual_acceptance_probability(log_p, log_q),
                               torch.tensor([1 - torch.e ** -1, 0.0, 0.0]))
