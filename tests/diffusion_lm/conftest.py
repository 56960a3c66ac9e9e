"""Tiny mask predictors for exactness tests: random LLaDA-layout models and a hand-built state-dependent toy."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from specmm.diffusion_lm import LLaDAConfig, MaskedDiffusionLM
from tests.conftest import one_torch_thread

VOCAB, MASK = 40, 39


@pytest.fixture(autouse=True)
def one_thread():
    with one_torch_thread():
        yield


def tiny_dlm(seed: int = 0, std: float = 0.5, **overrides) -> MaskedDiffusionLM:
    """A random float64 LLaDA-layout model; larger `std` gives sharper, more state-dependent predictions."""
    config = LLaDAConfig(**{"d_model": 32, "n_heads": 4, "n_kv_heads": 2, "n_layers": 2, "mlp_hidden_size": 48,
                            "vocab_size": VOCAB, "mask_token_id": MASK, "eos_token_id": 0, "max_sequence_length": 96,
                            "rope_theta": 10000.0, **overrides})
    return MaskedDiffusionLM(config).init_weights(std=std, seed=seed).double().eval()


class ToyDLM:
    """logits = base[position] + strength * R(one-hot state) [+ quantised to `step`, which makes exact ties].

    `strength` sets how much every prediction depends on the whole state (large: adversarial for SSD).
    """

    supports_cache = False

    def __init__(self, length: int, vocab: int = 12, strength: float = 0.3, seed: int = 0, step: float | None = None,
                 tied_rows: bool = False):
        gen = torch.Generator().manual_seed(seed)
        self.mask_id, self.vocab, self.strength, self.step = vocab - 1, vocab, strength, step
        self.base = torch.randn(length, vocab, generator=gen, dtype=torch.float64) * 3  # [L, V]
        if tied_rows:  # every position predicts the same way: confidences tie exactly
            self.base[:] = self.base[0]
        self.mix = torch.randn(length * vocab, length * vocab, generator=gen, dtype=torch.float64) / length ** 0.5

    def logits(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        b, n = input_ids.shape
        state = torch.nn.functional.one_hot(input_ids, self.vocab).double().reshape(b, -1)  # [B, L * V]
        extra = torch.tanh(state @ self.mix[: n * self.vocab, : n * self.vocab]).view(b, n, self.vocab)
        logits = self.base[:n] + self.strength * 4 * extra
        return logits if self.step is None else torch.round(logits / self.step) * self.step
