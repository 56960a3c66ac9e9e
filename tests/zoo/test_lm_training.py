"""The trainer's GPU-recipe options: an explicit device trains the same weights and hands the model back where it
was; bf16 autocast trains (finite, falling loss) without touching the CPU recipes' path."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specmm.zoo.lm_training import LMTrainConfig, token_windows, train_causal_lm


def _model():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    return LlamaForCausalLM(config)


def _train(tmp_path, name, **options):
    tokens = torch.arange(2000) % 61
    config = LMTrainConfig(steps=6, batch_size=4, seq_len=16, warmup_steps=2, checkpoint_every=3, lr=1e-2, **options)
    model = _model()
    losses = train_causal_lm(model, token_windows(tokens, config), config, tmp_path / name, progress=False)
    return model, losses


def test_explicit_device_trains_the_same_weights_and_returns_the_model_home(tmp_path):
    plain, plain_losses = _train(tmp_path, "plain")
    moved, moved_losses = _train(tmp_path, "moved", device="cpu")
    assert moved_losses == plain_losses
    assert all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(), moved.state_dict().values()))
    assert next(moved.parameters()).device.type == "cpu" and not moved.training


def test_bf16_autocast_step_trains(tmp_path):
    model, losses = _train(tmp_path, "bf16", precision="bfloat16")
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]
    assert next(model.parameters()).dtype == torch.float32  # autocast: the weights stay fp32


def test_unknown_precision_is_refused():
    with pytest.raises(ValueError, match="precision"):
        LMTrainConfig(steps=1, batch_size=1, seq_len=4, precision="fp8")
