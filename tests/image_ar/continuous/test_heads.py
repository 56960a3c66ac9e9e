"""A head's whole-chain `sample` (step conditions computed once, density read off the noise) is its `transition`
chain: same trajectory and same log density as stepping the Gaussians one by one."""

from __future__ import annotations

import pytest
import torch

from specmm.image_ar.continuous.chain import draw_noise, gaussian_log_density
from tests.image_ar.continuous.conftest import tiny_model


def stepwise(head, z, noise, temperature):
    """The reference: T calls of `transition`, densities from the Gaussians themselves."""
    x, states, log_density = noise[:, 0], [noise[:, 0]], torch.zeros(z.shape[0], dtype=z.dtype)
    for step, t in enumerate(range(head.steps, 0, -1), start=1):
        mean, std = head.transition(x, torch.full((z.shape[0],), t), z)
        x = mean + temperature * std * noise[:, step]
        log_density = log_density + gaussian_log_density(x, mean, (temperature * std).expand_as(mean))
        states.append(x)
    return torch.stack(states, 1), log_density


@pytest.mark.parametrize("head, steps", [("ddpm", 4), ("ddpm", 1), ("gaussian", 1)])
def test_sample_is_the_transition_chain(head, steps):
    model = tiny_model(head=head, diffusion_steps=steps, head_depth=2, dtype=torch.float64)
    z = torch.randn(5, 16, dtype=torch.float64)
    noise = draw_noise((5,), model.head, torch.float64, z.device, torch.Generator().manual_seed(0))
    trajectory, log_density = model.head.sample(z, noise, temperature=0.8)
    expected_trajectory, expected_density = stepwise(model.head, z, noise, 0.8)
    torch.testing.assert_close(trajectory, expected_trajectory, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(log_density, expected_density, rtol=1e-10, atol=1e-10)


def test_the_chain_depends_on_the_feature():
    model = tiny_model(head="ddpm", diffusion_steps=4, dtype=torch.float64)
    noise = draw_noise((3,), model.head, torch.float64, torch.device("cpu"), torch.Generator().manual_seed(0))
    z = torch.randn(3, 16, dtype=torch.float64)
    assert not torch.allclose(model.head.sample(z, noise)[0][:, -1], model.head.sample(z + 1, noise)[0][:, -1])
