"""Trajectory-KL distillation: zero for a draft equal to the target, and training on it raises acceptance."""

from __future__ import annotations

import copy

import pytest
import torch

from specmm.image_ar.continuous import CSpDSampler
from specmm.image_ar.continuous.distill import trajectory_kl_loss
from tests.conftest import perturbed_copy
from tests.image_ar.continuous.conftest import tiny_model


def test_loss_is_zero_for_an_identical_draft_and_rejects_gaussian_heads():
    target = tiny_model(head="ddpm", diffusion_steps=3, beta_schedule="squaredcos_cap_v2")
    latents, labels = torch.randn(4, 4, 2), torch.arange(4) % 3
    assert trajectory_kl_loss(copy.deepcopy(target), target, latents, labels).item() == pytest.approx(0.0, abs=1e-10)
    with pytest.raises(ValueError, match="draft"):
        trajectory_kl_loss(tiny_model(), tiny_model(), latents, labels)


def test_distilling_raises_acceptance():
    target = tiny_model(head="ddpm", diffusion_steps=3, beta_schedule="squaredcos_cap_v2")
    draft = perturbed_copy(target, 0.5, seed=5).train()
    labels = torch.arange(64) % 3

    def acceptance() -> float:
        out = CSpDSampler(target, draft.eval(), draft_tokens=2).sample(
            labels, generator=torch.Generator().manual_seed(0))
        return out.stats.continuous.acceptance_rate

    before = acceptance()
    optimizer = torch.optim.Adam(draft.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(1)
    draft.train()
    for _ in range(150):
        latents = torch.randn(16, 4, 2, generator=gen)
        loss = trajectory_kl_loss(draft, target, latents, torch.arange(16) % 3, gen, head_repeats=2)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    after = acceptance()
    assert after > before + 0.1
