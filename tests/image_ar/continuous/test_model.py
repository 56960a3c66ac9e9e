"""The continuous AR model: causal features in any order, trainable heads, save/load round trip."""

from __future__ import annotations

import pytest
import torch

from specmm.image_ar.continuous import ContinuousAR, ContinuousARConfig
from tests.image_ar.continuous.conftest import tiny_config, tiny_model


@pytest.mark.parametrize("order", ["raster", "random"])
def test_feature_of_step_i_depends_only_on_earlier_tokens(order):
    model = tiny_model(order=order, grid=3, dtype=torch.float64)
    orders = torch.stack([torch.randperm(9, generator=torch.Generator().manual_seed(s)) for s in range(2)])
    tokens, labels = torch.randn(2, 9, 2, dtype=torch.float64), torch.tensor([0, 2])
    z = model.features(tokens, labels, orders)
    changed = tokens.clone()
    changed[:, 4:] = torch.randn(2, 5, 2, dtype=torch.float64)
    torch.testing.assert_close(model.features(changed, labels, orders)[:, :5], z[:, :5])
    assert not torch.allclose(model.features(changed, labels, orders)[:, 5:], z[:, 5:])
    torch.testing.assert_close(model.features(tokens[:, :5], labels, orders[:, :5]), z[:, :5])  # prefix forward


@pytest.mark.parametrize("head", ["ddpm", "gaussian"])
def test_training_lowers_the_head_loss(head):
    model = ContinuousAR(tiny_config(head=head, diffusion_steps=3, beta_schedule="squaredcos_cap_v2")).train()
    latents, labels = torch.randn(16, 4, 2) * 0.3 + 1.0, torch.arange(16) % 3
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(30):
        loss = model.loss(latents, labels, gen, head_repeats=2)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert sum(losses[-5:]) < 0.7 * sum(losses[:5])


def test_save_and_load_round_trip(tmp_path):
    model = tiny_model(head="ddpm", diffusion_steps=3)
    model.save_pretrained(tmp_path)
    loaded = ContinuousAR.from_pretrained(tmp_path)
    tokens, labels = torch.randn(2, 4, 2), torch.tensor([0, 1])
    orders = model.raster_orders(2)
    torch.testing.assert_close(loaded.features(tokens, labels, orders), model.features(tokens, labels, orders))
    assert loaded.config == model.config


@pytest.mark.parametrize(("field", "value"), [("grid", 0), ("head", "flow"), ("order", "spiral"), ("num_heads", 3)])
def test_bad_config_is_a_value_error_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        ContinuousARConfig(**{field: value})
