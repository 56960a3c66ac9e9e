"""Trajectory densities: the batched evaluation agrees with the sequential sampler and with torch.distributions."""

from __future__ import annotations

import torch

from specmm.image_ar.continuous.chain import (
    chain_log_density,
    draw_noise,
    gaussian_log_density,
    sample_chain,
)
from tests.image_ar.continuous.conftest import tiny_model


def test_batched_log_density_equals_the_density_accumulated_while_sampling():
    model = tiny_model(head="ddpm", diffusion_steps=4, dtype=torch.float64)
    z = torch.randn(6, 16, dtype=torch.float64)
    noise = draw_noise((6,), model.head, torch.float64, z.device, torch.Generator().manual_seed(0))
    trajectory, log_density = sample_chain(model.head, z, noise, temperature=0.7)
    assert trajectory.shape == (6, 5, 2) and torch.equal(trajectory[:, 0], noise[:, 0])
    torch.testing.assert_close(chain_log_density(model.head, z, trajectory, temperature=0.7), log_density)


def test_gaussian_log_density_matches_torch_normal():
    x, mean, std = torch.randn(5, 3), torch.randn(5, 3), torch.rand(5, 3) + 0.1
    expected = torch.distributions.Normal(mean, std).log_prob(x).sum(-1)
    torch.testing.assert_close(gaussian_log_density(x, mean, std), expected)


def test_ddpm_last_step_is_a_proper_gaussian():
    head = tiny_model(head="ddpm", diffusion_steps=4).head
    assert (head.stds > 0).all() and head.stds[0] == head.stds[1]  # β̃_1 clipped to β̃_2, not 0
