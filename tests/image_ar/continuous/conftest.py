"""Tiny random continuous-token AR models for the CSpD tests."""

from __future__ import annotations

import torch

from specmm.image_ar.continuous import ContinuousAR, ContinuousARConfig


def tiny_config(**overrides) -> ContinuousARConfig:
    base = {"token_dim": 2, "grid": 2, "num_classes": 3, "hidden_size": 16, "num_layers": 1, "num_heads": 2,
            "head": "gaussian", "head_width": 16, "head_depth": 1, "diffusion_steps": 1, "beta_schedule": "linear"}
    return ContinuousARConfig(**{**base, **overrides})


def tiny_model(seed: int = 0, dtype: torch.dtype = torch.float32, **overrides) -> ContinuousAR:
    """A random model whose head depends visibly on its input (the AdaLN modulation is zero-initialised)."""
    torch.manual_seed(seed)
    model = ContinuousAR(tiny_config(**overrides))
    with torch.no_grad():
        for block in model.head.net.blocks:
            block.modulation.weight.normal_(0.0, 0.3)
    return model.to(dtype).eval()
