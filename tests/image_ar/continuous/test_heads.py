"""A head's whole-chain `sample` (step conditions computed once, density read off the noise) is its `transition`
chain: same trajectory and same log density as stepping the Gaussians one by one."""

from __future__ import annotations

import pytest
import torch

from specmm.image_ar.continuous.chain import draw_noise, gaussian_log_density
from specmm.image_ar.continuous.heads import compile_chain
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


def head_inputs(head: str, steps: int, seed: int):
    """A float64 tiny head of that kind, features z [5, 16] and chain noise [5, T+1, C]."""
    model = tiny_model(head=head, diffusion_steps=steps, head_depth=2, dtype=torch.float64)
    z = torch.randn(5, 16, dtype=torch.float64)
    return model, z, draw_noise((5,), model.head, torch.float64, z.device, torch.Generator().manual_seed(seed))


HEADS = [("ddpm", 4), ("ddpm", 1), ("gaussian", 1)]


@pytest.mark.parametrize("head, steps", HEADS)
def test_sample_is_the_transition_chain(head, steps):
    model, z, noise = head_inputs(head, steps, seed=0)
    trajectory, log_density = model.head.sample(z, noise, temperature=0.8)
    expected_trajectory, expected_density = stepwise(model.head, z, noise, 0.8)
    torch.testing.assert_close(trajectory, expected_trajectory, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(log_density, expected_density, rtol=1e-10, atol=1e-10)


def test_the_chain_depends_on_the_feature():
    model = tiny_model(head="ddpm", diffusion_steps=4, dtype=torch.float64)
    noise = draw_noise((3,), model.head, torch.float64, torch.device("cpu"), torch.Generator().manual_seed(0))
    z = torch.randn(3, 16, dtype=torch.float64)
    assert not torch.allclose(model.head.sample(z, noise)[0][:, -1], model.head.sample(z + 1, noise)[0][:, -1])


@pytest.mark.parametrize("head, steps", HEADS)
def test_final_transition_is_the_last_steps_gaussian(head, steps):
    model, z, noise = head_inputs(head, steps, seed=1)
    trajectory, _ = model.head.sample(z, noise, temperature=0.7)
    mean, std = model.head.final_transition(trajectory, noise, z, temperature=0.7)
    expected_mean, expected_std = model.head.transition(trajectory[:, -2], torch.ones(5, dtype=torch.long), z)
    torch.testing.assert_close(mean, expected_mean, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(std.expand_as(mean), expected_std.expand_as(mean), rtol=1e-10, atol=1e-10)


def test_compiled_chain_matches_the_eager_chain_for_any_row_count():
    model = tiny_model(head="ddpm", diffusion_steps=4, head_depth=2)
    eager = model.head.sample
    compile_chain(model.head)
    for rows in (1, 3, 7):
        z = torch.randn(rows, 16)
        noise = draw_noise((rows,), model.head, torch.float32, z.device, torch.Generator().manual_seed(rows))
        for got, expected in zip(model.head.sample(z, noise, 0.9), eager(z, noise, 0.9)):
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
